"""Dropout in the bundled kernels, run in Triton's interpreter on tiny shapes.

The references are independent of the kernels: ``attnforge_kernels.checks.dropout_ref`` recomputes
the Philox mask with PyTorch integer arithmetic (checked against Random123's known answers below)
and applies it to a plain PyTorch attention.
"""

import pytest
import torch

import attnforge_kernels.checks.dropout_ref as dropout_ref
from attnforge_kernels import _get_block_size_n, flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.api.flash_attn import keep_threshold, philox_seed_offset
from attnforge_kernels.checks import variants
from attnforge_kernels.checks.case import dropout
from attnforge_kernels.checks.dropout_ref import keep_mask, philox4x32
from attnforge_kernels.checks.reference import attention_ref, visible

CPU = torch.device("cpu")


def _qkv(b, sq, sk, hq, hk, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(b, n, h, d, generator=g).to(dtype) for n, h in ((sq, hq), (sk, hk), (sk, hk))
    )


# Philox4x32-10 known-answer vectors of Random123 (kat_vectors: philox4x32 10): counter, key,
# expected output words.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_reference_philox_matches_random123_known_answers(counter, key, expected):
    words = philox4x32(*(torch.tensor([c]) for c in counter), *key)
    assert tuple(int(w) for w in words) == expected


def test_kernel_keeps_exactly_the_scores_the_philox_rule_keeps():
    q, k, v = _qkv(1, 37, 45, 4, 2, 32)
    torch.manual_seed(7)
    seed, offset = variants._peek_seed_offset(CPU, 4 * 32)
    _, _, sdm = flash_attn_func(q, k, v, dropout_p=0.25, causal=True, return_attn_probs=True)
    keep = keep_mask(seed, offset, keep_threshold(0.25), 1, 4, 37, 45)
    vis = visible(37, 45, None, 0)
    assert sdm.shape == (1, 4, 37, 45) and sdm.dtype == torch.float32
    # flash_attn's encoding: the sign says kept (>= 0) or dropped (< 0); hidden scores are 0.
    assert torch.equal((sdm >= 0)[..., vis], keep[..., vis])
    assert not (~keep[..., vis]).all() and not keep[..., vis].all()
    assert torch.count_nonzero(sdm[..., ~vis]) == 0


def test_sdmask_is_flash_attns_unnormalised_encoding_and_decodes_to_the_probabilities():
    # 33 keys in 128-wide blocks (d=32) and 70 keys in 64-wide blocks (d=64, dropout): one block
    # and several, so the "this block and every later one" maximum is exercised.
    for sq, sk, d, causal in ((20, 33, 32, True), (9, 70, 64, False), (70, 70, 64, True)):
        q, k, v = _qkv(1, sq, sk, 2, 1, d)
        _, _, sdm = flash_attn_func(q, k, v, dropout_p=0.3, causal=causal, return_attn_probs=True)
        block_n = _get_block_size_n(CPU, d, True, causal)
        assert block_n == (128 if d <= 32 else 64)
        right = 0 if causal else None
        s = torch.einsum("bshd,bthd->bhst", q.float(), k.float().repeat_interleave(2, 2)) / d**0.5
        vis = visible(sq, sk, None, right)
        s = s.masked_fill(~vis, float("-inf"))
        probs = torch.softmax(s, -1)
        # Unnormalised: exp(s - m) with m the largest score of this key block and every later
        # one (flash_attn's CUDA kernels walk the key blocks last to first).
        top = torch.stack([b.amax(-1) for b in s.split(block_n, -1)], -1)
        later = top.flip(-1).cummax(-1).values.flip(-1)
        m = later.repeat_interleave(block_n, -1)[..., :sk]
        expected = torch.where(vis, torch.exp(s - m), torch.zeros(()))
        assert (sdm.abs() - expected).abs().max().item() <= 1e-5
        # Decoded as flash_attn's tests decode it, the softmax probabilities.
        decoded = dropout_ref.normalize_sdmask(sdm, q, k, block_n, right=right)
        assert (decoded - probs).abs().max().item() <= 1e-5
        assert torch.allclose(decoded.sum(-1), torch.ones(1, 2, sq))


def test_get_block_size_n_is_flash_attns_table_off_sm8x():
    # flash_attn/flash_attn_interface.py::_get_block_size_n for devices that are not sm86/sm89.
    table = {
        (32, False): 128, (32, True): 128, (64, False): 128, (64, True): 64, (80, False): 64,
        (96, True): 64, (128, False): 64, (128, True): 32, (160, True): 64, (256, False): 64,
    }  # fmt: skip
    for (d, drop), n in table.items():
        for causal in (False, True):
            assert _get_block_size_n(CPU, d, drop, causal) == n
    with pytest.raises(ValueError, match="head_dim"):
        _get_block_size_n(CPU, 288, True, False)


@pytest.mark.parametrize(
    "case",
    [
        dropout("bf16", 0.5, 1, 45, 20, 2, 2, 16, "full"),
        # 12-20 s each in the interpreter on 2 cores:
        pytest.param(dropout("bf16", 0.17, 2, 37, 45, 4, 2, 32, "causal"), marks=pytest.mark.slow),
        pytest.param(
            dropout("fp16", 0.3, 3, 30, 40, 2, 1, 40, "window", "varlen"),
            marks=pytest.mark.slow,
        ),
    ],
    ids=lambda c: c.name,
)
def test_forward_and_backward_match_the_reference_with_the_same_mask(case):
    res = variants.compare_dropout(case, CPU, seed=3)
    assert res["ok"], res["metrics"]
    assert res["metrics"]["mask_mismatch"] == 0


def test_a_mask_one_score_off_fails_the_check(monkeypatch):
    real = dropout_ref.keep_mask

    def one_flipped(*args, **kwargs):
        keep = real(*args, **kwargs).clone()
        keep[0, 0, 5, 3] = ~keep[0, 0, 5, 3]
        return keep

    monkeypatch.setattr(dropout_ref, "keep_mask", one_flipped)
    res = variants.compare_dropout(dropout("bf16", 0.17, 1, 17, 19, 2, 2, 16, "full"), CPU)
    assert not res["ok"] and res["metrics"]["mask_mismatch"] == 1


def test_dropped_fraction_is_p():
    q, k, v = _qkv(1, 64, 64, 1, 1, 16)
    _, _, sdm = flash_attn_func(q, k, v, dropout_p=0.3, return_attn_probs=True)
    frac = (sdm < 0).float().mean().item()  # 4096 scores: one standard deviation is 0.0072
    assert abs(frac - 0.3) <= 0.036, frac


def test_manual_seed_reproduces_a_run_and_the_next_call_draws_a_new_mask():
    q, k, v = _qkv(1, 19, 23, 2, 1, 16)
    torch.manual_seed(0)
    first = flash_attn_func(q, k, v, dropout_p=0.2)
    second = flash_attn_func(q, k, v, dropout_p=0.2)
    torch.manual_seed(0)
    again = flash_attn_func(q, k, v, dropout_p=0.2)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)


def test_only_a_dropout_call_advances_torch_generator():
    q, k, v = _qkv(1, 8, 8, 1, 1, 16)
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    flash_attn_func(q, k, v)
    assert torch.equal(torch.rand(1), expected)
    torch.manual_seed(0)
    flash_attn_func(q, k, v, dropout_p=0.1)
    assert not torch.equal(torch.rand(1), expected)


def test_gpu_seed_and_offset_follow_flash_attn(monkeypatch):
    # flash_attn takes the CUDA generator's Philox seed and offset and advances the offset by
    # batch * heads * 32 (csrc/flash_attn/flash_api.cpp); a stand-in generator records it.
    class Generator:
        offset = 1024

        def initial_seed(self):
            return 2**64 - 5

        def get_offset(self):
            return self.offset

        def set_offset(self, value):
            self.offset = value

    gen = Generator()
    monkeypatch.setattr(torch.cuda, "default_generators", (gen,), raising=False)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert philox_seed_offset(torch.device("cuda", 0), 2 * 8 * 32) == (2**64 - 5, 1024)
    assert gen.offset == 1024 + 512


def test_dropout_inside_graph_capture_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA graph"):
        philox_seed_offset(torch.device("cuda", 0), 32)


def test_without_dropout_there_is_no_sdmask_and_the_default_kernel_runs():
    q, k, v = _qkv(1, 17, 17, 2, 2, 16)
    out, _, sdm = flash_attn_func(q, k, v, dropout_p=0.0, return_attn_probs=True)
    assert sdm is None
    ref, _ = attention_ref(q, k, v)
    assert (out.float() - ref.float()).abs().max().item() <= 2e-2


def test_varlen_sdmask_puts_each_sequence_at_its_own_origin():
    lens_q, lens_k = [5, 17], [9, 3]
    q, k, v = _qkv(1, 22, 12, 2, 1, 16)
    cu_q = torch.tensor([0, 5, 22], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12], dtype=torch.int32)
    torch.manual_seed(3)
    seed, offset = variants._peek_seed_offset(CPU, 2 * 2 * 32)
    _, _, sdm = flash_attn_varlen_func(
        q[0], k[0], v[0], cu_q, cu_k, 17, 9, dropout_p=0.4, return_attn_probs=True
    )
    assert sdm.shape == (2, 2, 17, 9)
    keep = keep_mask(seed, offset, keep_threshold(0.4), 2, 2, 17, 9)
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k, strict=True)):
        assert torch.equal(sdm[b, :, :lq, :lk] >= 0, keep[b, :, :lq, :lk])
        assert (
            torch.count_nonzero(sdm[b, :, lq:]) == 0 and torch.count_nonzero(sdm[b, :, :, lk:]) == 0
        )


def test_dropout_with_paged_kv_is_refused():
    q = torch.randn(4, 2, 16, dtype=torch.bfloat16)
    cache = torch.randn(2, 16, 2, 16, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_varlen_func(
            q, cache, cache, cu, cu, 4, 4, dropout_p=0.1,
            block_table=torch.zeros(1, 1, dtype=torch.int32),
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "override",
    [
        '{"reload": true}',
        '{"atomic_dq": true}',
        '{"chunk_kv": 16, "chunk_q": 16}',
        '{"chunk_fwd": 16}',
    ],
)
def test_alternative_backward_paths_regenerate_the_same_mask(monkeypatch, override):
    # RDNA3's re-read and head-dim-chunked backward, the opt-in atomic dQ and the chunked forward
    # (with its S_dmask pass, which loads the whole Q tile) each apply the mask in their own code.
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", override)
    res = variants.compare_dropout(dropout("bf16", 0.2, 1, 37, 45, 4, 2, 40, "causal"), CPU)
    assert res["ok"], res["metrics"]
