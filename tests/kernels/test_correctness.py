"""Forward and backward against an fp32 reference, flash-attention's 2x rule (CPU interpreter)."""

import pytest
import torch

from kernels.check import Case, compare, grid_cpu

CASES = grid_cpu()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_and_backward_match_fp32_reference(case):
    res = compare(case, torch.device("cpu"), seed=1)
    m = res["metrics"]
    assert res["ok"], {k: v for k, v in m.items() if k.startswith(("err_", "bound_"))}


@pytest.mark.parametrize("override", ['{"reload": true}', '{"atomic_dq": true}'])
def test_alternative_backward_paths_match_reference(monkeypatch, override):
    # RDNA3 configs re-read resident tiles; atomic dQ is an opt-in path: both must stay correct.
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", override)
    for case in (
        Case("bf16", 1, 37, 45, 4, 2, 40, "causal"),
        Case("fp16", 3, 30, 30, 2, 1, 32, "window", "varlen"),
    ):
        res = compare(case, torch.device("cpu"), seed=2)
        assert res["ok"], (case.name, res["metrics"])


@pytest.mark.parametrize(
    "tiles",
    [
        '{"fwd": [32, 16, 1, 1], "bwd_kv": [16, 32, 1, 1], "bwd_q": [32, 16, 1, 1]}',
        '{"fwd": [16, 32, 1, 1], "bwd_kv": [32, 16, 1, 1], "bwd_q": [16, 32, 1, 1]}',
    ],
)
def test_unequal_tile_shapes_keep_masks_right(monkeypatch, tiles):
    # The GPU defaults use BLOCK_M != BLOCK_N; the block-range arithmetic must not assume equal.
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", tiles)
    for case in (
        Case("bf16", 1, 45, 70, 2, 1, 32, "causal"),
        Case("fp16", 1, 70, 45, 2, 2, 32, "window"),
        Case("bf16", 2, 50, 33, 2, 2, 32, "sdpacausal"),
    ):
        res = compare(case, torch.device("cpu"), seed=3)
        assert res["ok"], (case.name, res["metrics"])
