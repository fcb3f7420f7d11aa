"""The dK/dV kernel split in two launches (``AttnConfig.split_kv``, flash.py's ``PART``: dV alone,
then dK alone), in Triton's interpreter: each launch computes the same products in the same order
as the joint kernel, so the gradients must be the joint kernel's, bit for bit, with every feature
the backward has."""

import pytest
import torch

from attnforge_kernels import flash_attn_func, flash_attn_varlen_func
from attnforge_kernels.api import flash_attn as interface
from attnforge_kernels.device import configs
from tests.kernels.standins import Fill, LaunchSpy, grads_under

SPLIT = '{"split_kv": true}'


CASES = {
    "causal-gqa": dict(causal=True),
    "window": dict(window_size=(5, 3)),
    "softcap": dict(softcap=3.0),
    "alibi": dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),
    "dropout": dict(dropout_p=0.3, causal=True),
}


@pytest.mark.parametrize("case", CASES)
def test_split_gradients_equal_the_joint_kernels(monkeypatch, case):
    spy = LaunchSpy(interface.attn_bwd_dkdv)
    monkeypatch.setattr(interface, "attn_bwd_dkdv", spy)
    g = torch.Generator().manual_seed(0)
    # 4 query heads on 2 KV heads; 37 queries on 29 keys: partial blocks on both sides.
    q = torch.randn(2, 37, 4, 32, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 29, 2, 32, generator=g).to(torch.bfloat16) for _ in range(2))
    kw = CASES[case]
    joint = grads_under(monkeypatch, None, lambda *t: flash_attn_func(*t, **kw), (q, k, v))
    split = grads_under(monkeypatch, SPLIT, lambda *t: flash_attn_func(*t, **kw), (q, k, v))
    assert spy.values("PART") == [0, 1, 2]  # the joint launch, then the split's dV and dK launches
    for name, a, b in zip(("dq", "dk", "dv"), joint, split, strict=True):
        assert torch.equal(a, b), name
    assert all(bool(t.abs().sum() > 0) for t in split)


def test_split_varlen_gradients_equal_the_joint_kernels(monkeypatch):
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 17, 50], dtype=torch.int32)
    q, k, v = (torch.randn(50, 2, 64, generator=g).to(torch.float16) for _ in range(3))

    def call(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu, cu, 33, 33, causal=True)

    joint = grads_under(monkeypatch, None, call, (q, k, v))
    split = grads_under(monkeypatch, SPLIT, call, (q, k, v))
    for name, a, b in zip(("dq", "dk", "dv"), joint, split, strict=True):
        assert torch.equal(a, b), name


def test_split_kv_refuses_the_paths_it_does_not_run():
    cfg = configs.config_for("hopper", 128)
    assert configs.override(cfg, SPLIT).split_kv
    for other in ('"atomic_dq": true', '"chunk_kv": 32'):
        with pytest.raises(ValueError, match="split_kv runs without atomic_dq and chunk_kv"):
            configs.override(cfg, '{"split_kv": true, ' + other + "}")


def test_a_split_backward_is_recorded_as_one_plan_of_three_launches(monkeypatch):
    # Recorded, the split backward replays its dQ, dV and dK launches; unrecorded, each call took
    # the full path (measured on an H100: fwd+bwd at SD 1.5's d=160 level at a fifth of the joint
    # kernel's rate).
    monkeypatch.setattr(interface.launch, "record", lambda fn, grid, a, kw, kernel, t: Fill())
    table = interface.launch.Table()
    dq, dkdv = interface.attn_bwd_dq, interface.attn_bwd_dkdv
    launched = [(dq, (1,), (), {}, None), (dkdv, (1,), (), {}, None), (dkdv, (1,), (), {}, None)]
    interface._record_backward(table, "split", launched, None, (None,) * 8, (None,) * 4)
    assert len(table.plans["split"].launches) == 3
    # The atomic-dQ path's delta kernel is not recorded: that key is marked not to try again.
    delta = [(interface.attn_bwd_delta, (1,), (), {}, None), *launched[1:2]]
    interface._record_backward(table, "atomic", delta, None, (None,) * 8, (None,) * 4)
    assert table.plans["atomic"] is False


def test_small_backward_grids_run_the_joint_kernel(monkeypatch):
    monkeypatch.delenv("ATTNFORGE_KERNELS_CONFIG", raising=False)
    monkeypatch.setattr(configs, "compute_units", lambda device=None: 132)
    cfg = configs.config_for("hopper", 256)
    assert cfg.split_kv
    joint = configs.SMALL_GRID_JOINT_KV[("hopper", 256)]
    # SD 1.5's d=160 level, b2 x 8 KV heads x 256 keys: 8 key blocks x 16 = 128 programs < 132.
    small = configs.backward_config(cfg, "hopper", 160, 256, 16, None)
    assert small.bwd_kv == joint and not small.split_kv
    # 1024 keys: 32 x 16 = 512 programs keep the split.
    assert configs.backward_config(cfg, "hopper", 160, 1024, 16, None) is cfg
    # An override naming the dK/dV tile or the split wins; one naming other fields does not.
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"split_kv": true}')
    assert configs.backward_config(cfg, "hopper", 160, 256, 16, None) is cfg
    monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", '{"gluon_fwd": false}')
    assert configs.backward_config(cfg, "hopper", 160, 256, 16, None).bwd_kv == joint
    # Configs that do not split, and families without a row, are left alone.
    d128 = configs.config_for("hopper", 128)
    assert configs.backward_config(d128, "hopper", 128, 256, 16, None) is d128
    assert configs.backward_config(cfg, "cdna3", 256, 256, 16, None) is cfg
