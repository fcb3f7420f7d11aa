"""The warp-specialised Gluon kernels (attnforge_kernels/device/flash_sm90.py), the forward and the dK/dV kernel:
compiled for sm90 on the CPU, and the rules that route calls to them. Gluon has no CPU
interpreter; the kernels' numerics are checked on an NVIDIA GPU by ``python -m
attnforge_kernels.check`` (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from attnforge_kernels.api.flash_attn import Mask, gluon_backward_ok, gluon_forward_ok
from attnforge_kernels.device import configs

REPO = Path(__file__).resolve().parents[2]


# Compiled in a child process: this test process runs Triton's interpreter (conftest.py), under
# which gluon.jit helpers cannot be compiled. One child compiles every (kernel, causal, head dim)
# of the test below in turn, one JSON line each: Triton and torch are imported once.
_COMPILE = """
import json, re, subprocess, sys, tempfile
from dataclasses import replace
from pathlib import Path
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from attnforge_kernels.tools import compile_check as aot
from attnforge_kernels.device import configs
for name, causal, d in json.loads(sys.argv[1]):
    kernels = {k[0]: k[1:] for k in aot._gluon_kernels(d, configs.config_for("hopper", d))}
    fn, ptrs, consts, tile = kernels[name]
    consts = dict(consts, CAUSAL=causal, num_warps=4)
    if "LOADER_REGS" in consts:  # the dK/dV kernel's, by Triton line, head dim and causal
        consts["LOADER_REGS"] = configs.gluon_bwd_loader_regs(d, causal)
    sig, attrs = aot._signature(fn, ptrs, consts)
    k = triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, enable_fp_fusion=configs.FP_FUSION))
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "k.ptx").write_text(k.asm["ptx"])
        res = subprocess.run([aot._ptxas(), "-arch=sm_90a", "-v", tmp + "/k.ptx", "-o",
                              tmp + "/k.o"], capture_output=True, text=True, check=True)
    print(json.dumps({"ptx": k.asm["ptx"], "ptxas": res.stderr, "shared": k.metadata.shared}),
          flush=True)
"""

KERNELS = [("fwd_gluon", 128), ("bwd_dkdv_gluon", 128), ("bwd_dkdv_gluon", 64)]
CAUSAL = [False, True]


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, bool, int], dict]:
    """Each (kernel, causal, head dim) the test below takes, compiled for sm90 in one child."""
    jobs = [(kernel, causal, d) for kernel, d in KERNELS for causal in CAUSAL]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILE, json.dumps(jobs)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(zip(jobs, map(json.loads, proc.stdout.splitlines()), strict=True))


@pytest.mark.parametrize("kernel, head_dim", KERNELS)
@pytest.mark.parametrize("causal", CAUSAL)
def test_compiles_for_sm90_warp_specialised_without_spills(compiled, kernel, head_dim, causal):
    k = compiled[kernel, causal, head_dim]
    ptx = k["ptx"]
    spills = re.search(r"(\d+) bytes spill stores", k["ptxas"])
    assert spills and int(spills.group(1)) == 0, k["ptxas"]
    assert k["shared"] <= 232448, k["shared"]  # sm90's 227 KiB per block
    # Warp specialisation really happened: registers move between partitions, the consumers
    # issue asynchronous wgmma and wait with one group still in flight (the forward's P.V,
    # the backward's dV product, overlapping the next elementwise step).
    assert re.search(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+240;", ptx)
    loader = 24 if kernel == "fwd_gluon" else configs.gluon_bwd_loader_regs(head_dim, causal)
    assert re.search(rf"setmaxnreg\.dec\.sync\.aligned\.u32\s+{loader};", ptx)
    assert "wgmma.mma_async" in ptx
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+1;", ptx)
    assert "cp.async.bulk.tensor" in ptx  # TMA
    if kernel == "bwd_dkdv_gluon":
        # P^T and dS^T feed dV and dK from registers (wgmma's A operand in registers).
        mma = rf"wgmma\.mma_async\.sync\.aligned\.m64n{head_dim}k16\.f32\.bf16\.bf16"
        a_in_regs = mma + r"\s+\{[^}]*\},\s*\{"
        assert re.search(a_in_regs, ptx)


def _t(shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


# The scope rules at any length; the length rule has a test of its own.
CFG = replace(
    configs.config_for("hopper", 128),
    gluon_fwd=True,
    gluon_fwd_min_seq=0,
    gluon_fwd_causal_min_seq=0,
)


def _ok(cfg=CFG, d=128, mask=None, softcap=0.0, slopes=None, varlen=False, drop=None,
        fp8=False, dtype=torch.bfloat16, out_dtype=None, q=None, sk=300):  # fmt: skip
    mask = mask or Mask()
    q = _t((2, 300, 8, d), dtype) if q is None else q
    k = v = _t((2, sk, 2, d), dtype)
    out = torch.empty(q.shape, dtype=out_dtype or dtype)
    return gluon_forward_ok(cfg, q, k, v, out, mask, softcap, slopes, varlen, drop, fp8)


def test_routing_rule(monkeypatch):
    monkeypatch.setattr(configs, "INTERPRET", False)  # the rule as a GPU process sees it
    assert _ok()
    assert _ok(mask=Mask(right=0))
    assert _ok(dtype=torch.float16)
    assert _ok(q=_t((2, 4, 300, 128)).transpose(1, 2))  # BHSD storage viewed as BSHD
    assert not _ok(cfg=replace(CFG, gluon_fwd=False))
    assert not _ok(d=64)
    assert not _ok(d=96)  # padded to 128 by the Triton kernel, not by this one
    assert not _ok(mask=Mask(right=5))  # e.g. SDPA's top-left causal with sq != sk
    assert not _ok(mask=Mask(left=64, right=0))
    assert not _ok(softcap=30.0)
    assert not _ok(slopes=torch.ones(8))
    assert not _ok(varlen=True)
    assert not _ok(drop=object())
    assert not _ok(fp8=True)
    assert not _ok(out_dtype=torch.float32)
    assert not _ok(q=_t((2, 300, 8, 129))[..., :128])  # row stride 258 bytes: TMA cannot
    monkeypatch.setattr(configs, "INTERPRET", True)
    assert not _ok()  # the CPU interpreter never takes the Gluon path


def test_config_enables_it_on_hopper_d128_only():
    assert configs.config_for("hopper", 128).gluon_fwd
    assert configs.config_for("hopper", 80).gluon_fwd  # the padded dim; the rule checks d == 128
    assert not configs.config_for("hopper", 64).gluon_fwd
    assert not configs.config_for("hopper", 256).gluon_fwd
    for fam in ("ampere", "cdna3", "rdna3.5", "interpreter"):
        assert not configs.config_for(fam, 128).gluon_fwd
    off = configs.override(configs.config_for("hopper", 128), '{"gluon_fwd": false}')
    assert not off.gluon_fwd


BWD_CFG = replace(
    configs.config_for("hopper", 128), gluon_bwd=True, atomic_dq=False, gluon_bwd_min_seq=0
)


def _bwd_ok(cfg=BWD_CFG, d=128, mask=None, softcap=0.0, slopes=None, varlen=False, drop=None,
            dtype=torch.bfloat16, grad_dtype=None, dk=None, sq=300):  # fmt: skip
    mask = mask or Mask()
    q = do = _t((2, sq, 8, d), dtype)
    k = v = _t((2, 300 if dk is None else dk.shape[1], 2, d), dtype)
    dk = torch.empty(k.shape, dtype=grad_dtype or dtype) if dk is None else dk
    dv = torch.empty(v.shape, dtype=grad_dtype or dtype)
    return gluon_backward_ok(cfg, q, k, v, do, dk, dv, mask, softcap, slopes, varlen, drop)


def test_backward_routing_rule(monkeypatch):
    monkeypatch.setattr(configs, "INTERPRET", False)
    assert _bwd_ok()
    assert _bwd_ok(mask=Mask(right=0))
    assert _bwd_ok(dtype=torch.float16)
    # kv-packed gradients: dK is a strided view of one (b, s, 2, h, d) pack
    assert _bwd_ok(dk=torch.empty((2, 300, 2, 2, 128), dtype=torch.bfloat16)[:, :, 0])
    assert not _bwd_ok(cfg=replace(BWD_CFG, gluon_bwd=False))
    assert not _bwd_ok(cfg=replace(BWD_CFG, atomic_dq=True))  # dQ would need this kernel
    assert _bwd_ok(d=64)
    assert not _bwd_ok(d=96)
    assert not _bwd_ok(d=32)
    assert not _bwd_ok(mask=Mask(right=5))
    assert not _bwd_ok(mask=Mask(left=64, right=0))
    assert not _bwd_ok(softcap=30.0)
    assert not _bwd_ok(slopes=torch.ones(8))
    assert not _bwd_ok(varlen=True)
    assert not _bwd_ok(drop=object())
    assert not _bwd_ok(grad_dtype=torch.float32)
    assert not _bwd_ok(dk=torch.empty((2, 300, 2, 129), dtype=torch.bfloat16)[..., :128])
    monkeypatch.setattr(configs, "INTERPRET", True)
    assert not _bwd_ok()


def test_backward_config_on_hopper_up_to_d128():
    assert configs.config_for("hopper", 128).gluon_bwd
    assert configs.config_for("hopper", 64).gluon_bwd
    assert not configs.config_for("hopper", 256).gluon_bwd
    for fam in ("ampere", "cdna3", "rdna3.5", "interpreter"):
        assert not configs.config_for(fam, 128).gluon_bwd
    off = configs.override(configs.config_for("hopper", 128), '{"gluon_bwd": false}')
    assert not off.gluon_bwd and off.gluon_fwd


def test_gluon_runs_only_at_the_lengths_it_measured_faster(monkeypatch):
    """The Hopper configs take Gluon from GLUON_MIN_SEQ's lengths on (the shorter of queries and
    keys): below them the Triton kernels measured as fast or faster, and a dispatch that picks the
    slower of its own two kernels is a defect (docs/benchmarks.md, "Hopper dispatch")."""
    monkeypatch.setattr(configs, "INTERPRET", False)
    hopper = configs.config_for("hopper", 128)
    fwd_min, bwd_min = configs.GLUON_MIN_SEQ["fwd"][128], configs.GLUON_MIN_SEQ["bwd"][128]
    assert (hopper.gluon_fwd_min_seq, hopper.gluon_bwd_min_seq) == (fwd_min, bwd_min) != (0, 0)
    assert configs.config_for("hopper", 64).gluon_bwd_min_seq == configs.GLUON_MIN_SEQ["bwd"][64]
    q = _t((1, fwd_min, 8, 128))
    assert _ok(cfg=hopper, q=q, sk=fwd_min)
    assert not _ok(cfg=hopper, q=q, sk=fwd_min - 1)  # the keys are the shorter sequence
    assert not _ok(cfg=hopper, q=_t((1, fwd_min // 2, 8, 128)), sk=fwd_min)
    # A causal call has its own threshold, above the unmasked one (at 2048 tokens a causal
    # one-sequence forward measured up to 1.03x the Triton forward's time).
    causal_min = configs.GLUON_MIN_SEQ["fwd_causal"][128]
    assert hopper.gluon_fwd_causal_min_seq == causal_min > fwd_min
    between = _t((1, causal_min - 1, 8, 128))
    assert _ok(cfg=hopper, q=between, sk=causal_min - 1)
    assert not _ok(cfg=hopper, q=between, sk=causal_min - 1, mask=Mask(right=0))
    q_causal = _t((1, causal_min, 8, 128))
    assert _ok(cfg=hopper, q=q_causal, sk=causal_min, mask=Mask(right=0))
    k_long = torch.empty((2, bwd_min, 2, 128), dtype=torch.bfloat16)
    assert _bwd_ok(cfg=hopper, sq=bwd_min, dk=k_long)
    assert not _bwd_ok(cfg=hopper, sq=bwd_min - 1, dk=k_long)
    assert hopper.gluon_fwd_at(128) and hopper.gluon_bwd_at(128)  # the compile check's question
    forced = configs.override(
        hopper, '{"gluon_fwd_min_seq": 0, "gluon_fwd_causal_min_seq": 0, "gluon_bwd_min_seq": 0}'
    )
    assert _ok(cfg=forced) and _ok(cfg=forced, mask=Mask(right=0)) and _bwd_ok(cfg=forced)
    with pytest.raises(ValueError, match="gluon_fwd_causal_min_seq must be 0 or more"):
        configs.override(hopper, '{"gluon_fwd_causal_min_seq": -1}')
    with pytest.raises(ValueError, match="gluon_fwd_min_seq must be 0 or more"):
        configs.override(hopper, '{"gluon_fwd_min_seq": -1}')


# In a child without the interpreter (gluon.jit kernels are not decorated under it): both Gluon
# launchers hand their kernel to ``wrap`` and launch what it returns, on the CPU with a recorder
# that launches nothing.
_WRAPPED = """
import json, torch
from attnforge_kernels.device import flash_sm90 as g
seen = []
class Recorder:
    def __init__(self, fn):
        self.fn = fn
    def __getitem__(self, grid):
        def go(*args, **kwargs):
            # The outputs the launch writes: out and lse (forward), dk and dv (dK/dV).
            writes = [a is w for a, w in zip(args[3:6], WRITES)]
            seen.append((self.fn.__name__, list(grid), writes, kwargs["CAUSAL"]))
        return go
bf = dict(dtype=torch.bfloat16)
q, k, v = torch.zeros(2, 300, 8, 128, **bf), torch.zeros(2, 300, 2, 128, **bf), torch.zeros(2, 300, 2, 128, **bf)
out, lse, dk, dv = torch.zeros_like(q), torch.zeros(2, 8, 300), torch.zeros_like(k), torch.zeros_like(v)
WRITES = (out, lse, None)
g.launch(q, k, v, out, lse, 0.1, causal=True, wrap=Recorder)
g.launch(q, k, v, out, lse, 0.1, causal=False, across=True, wrap=Recorder)
WRITES = (q, dk, dv)
g.launch_bwd_dkdv(q, k, v, q, dk, dv, lse, lse, 0.1, causal=True, wrap=Recorder)
print(json.dumps(seen))
"""


def test_the_gluon_launchers_launch_through_the_plans_recorder():
    """The forward's plan records Hopper's Gluon forward as the backward's records its Gluon
    dK/dV kernel (attnforge_kernels.api.flash_attn.run_forward, _launch_dkdv): each launcher
    passes its kernel through ``wrap`` with the grid it launches on."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _WRAPPED], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    from attnforge_kernels.device.configs import GLUON_BWD_TILES

    m = 128  # flash_sm90.BLOCK_M
    n = GLUON_BWD_TILES[128][1]
    assert json.loads(proc.stdout) == [
        ["attn_fwd_sm90", [-(-300 // m), 2 * 8], [True, True, False], True],
        ["attn_fwd_sm90", [2 * 8, -(-300 // m)], [True, True, False], False],
        ["attn_bwd_dkdv_sm90", [-(-300 // n), 2 * 2], [True, True, True], True],
    ]
