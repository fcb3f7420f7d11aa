"""The silent failures users reported in the second half of 2026, each planted on CPU torch.

Each new kind of case runs through the real check (``sdpa.case``, ``sdpa.workloads``) honest and
with a planted defect of the kind users met: a backend that corrupts head dim 384 (Wan 2.2's VAE,
vllm-project/vllm-omni#7484), a deferred fault after a tiny causal call (ROCm/TheRock#7407), NaN
only in bf16 at a diffusion shape and only in a forced run (Comfy-Org/ComfyUI#14249, #14379), and
a result that changes with TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL, which unsloth and ComfyUI set
on import (unslothai/unsloth#8821, Comfy-Org/ComfyUI#10168). The plants reuse
test_grid_layouts.py's ``planted`` hook: only runs with math switched off (forced fused runs) are
spoiled, unless a test says otherwise.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from tests.validate.test_grid_layouts import CTX, GFX11_LIMITS, planted, run_case  # noqa: F401
from validate import gate, grid, suite
from validate.checks import sdpa
from validate.checks import workloads as fused_check

BY_NAME = {c.name: c for c in grid.GRID}


@pytest.fixture(autouse=True)
def gate_unset():
    """Each test starts with the gate unset and leaves it as it found it (a check in the other
    state sets it in this process, as it does in its worker)."""
    saved = os.environ.pop(gate.KNOB, None)
    yield
    os.environ.pop(gate.KNOB, None)
    if saved is not None:
        os.environ[gate.KNOB] = saved


D384 = "bf16-d384-s1024-h1"
TINY = "bf16-d128-s8-b1-h16-causal"


# --- head dim 384 ----------------------------------------------------------------------------


def _corrupt_d384(q, k, v, args, kwargs, real, out):
    return out * 1.1 if q.shape[-1] == 384 else out  # 10% off, only at this head dim


def test_head_dim_384_is_in_the_grid_and_in_quick_above_gfx11s_limit():
    c = BY_NAME[D384]
    assert c.head_dim == 384 and "vllm-project/vllm-omni#7484" in c.why
    assert D384 in grid.QUICK and c.head_dim > GFX11_LIMITS["head_dim_max"]


def test_a_backend_that_corrupts_head_dim_384_fails_the_case_naming_it(planted):  # noqa: F811
    assert run_case(D384)["status"] == "pass"
    planted(_corrupt_d384)
    rec = run_case(D384)
    assert rec["status"] == "fail"
    assert "flash: max|err|" in rec["message"] and "> tolerance" in rec["message"]
    assert rec["details"]["backends"]["math"]["run"] == "pass"
    assert run_case(grid.REFERENCE_CASE)["status"] == "pass"  # d64 does not see it


def test_head_dim_384_refused_where_the_arch_table_expects_it_is_the_expected_outcome(planted):  # noqa: F811
    def refuse(q, k, v, args, kwargs, real, out):
        if q.shape[-1] > 256:
            raise RuntimeError("No available kernel. Aborting execution.")
        return out

    planted(refuse)
    rec = run_case(D384, GFX11_LIMITS)
    assert rec["status"] == "pass", rec["message"]
    flash = rec["details"]["backends"]["flash"]
    assert flash["run"] == "unsupported" and flash["expected_refusal"] is True
    assert flash["note"].startswith("refused, as expected on this arch: head dim 384 > 256")
    # Without the arch's limits the same refusal is only "unsupported", not "expected".
    assert "expected_refusal" not in run_case(D384)["details"]["backends"]["flash"]


# --- tiny causal sequences: a deferred fault ----------------------------------------------------


@pytest.fixture
def deferred_after_tiny_causal(monkeypatch):
    """The default SDPA call "succeeds" at a causal length <= 16; the next matmul in the process
    raises the error such a launch leaves behind (TheRock#7407's hipErrorInvalidValue)."""
    real_sdpa = torch.nn.functional.scaled_dot_product_attention
    real_matmul = torch.Tensor.__matmul__
    poisoned: list[bool] = []

    def sdpa(q, k, v, *args, **kwargs):
        out = real_sdpa(q, k, v, *args, **kwargs)
        if kwargs.get("is_causal") and q.shape[-2] <= 16:
            poisoned.append(True)
        return out

    def matmul(self, other):
        if poisoned:
            raise RuntimeError("HIP error: invalid argument (planted deferred fault)")
        return real_matmul(self, other)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(torch.Tensor, "__matmul__", matmul)
    return poisoned


@pytest.mark.parametrize("n", grid.TINY_CAUSAL_SEQLENS)
def test_the_tiny_causal_cases_pass_on_honest_torch(n):
    rec = run_case(f"bf16-d128-s{n}-b1-h16-causal")
    assert rec["status"] == "pass", rec["message"]
    assert rec["details"]["case"]["causal"] and rec["details"]["case"]["batch"] == 1


def test_the_reported_shapes_are_cases():
    shapes = {(c.batch, c.heads_q, c.seqlen_q, c.head_dim, c.causal, c.dtype) for c in grid.GRID}
    assert {(1, 16, 8, 128, True, "bf16"), (1, 16, 512, 64, True, "bf16")} <= shapes
    assert TINY in grid.QUICK


def test_a_deferred_fault_after_a_tiny_causal_call_is_charged_to_the_case(
    deferred_after_tiny_causal,
):
    rec = run_case(TINY)
    assert rec["status"] == "crash"
    assert rec["message"].startswith(
        "GPU fault in the checked op after the default run (deferred, charged to the default run"
    )
    assert "planted deferred fault" in rec["message"]
    assert "deferred_fault" in rec["details"]["default_run"]
    assert "run" not in rec["details"]["backends"]["math"]  # the poisoned case stopped there
    deferred_after_tiny_causal.clear()
    # The (1,16,512,64) neighbour is not tiny: the same plant leaves it alone.
    assert run_case("bf16-d64-s512-b1-h16-causal")["status"] == "pass"


# --- bf16 NaN in diffusion attention -------------------------------------------------------------


def _nan_in_bf16_at_diffusion_shapes(q, k, v, args, kwargs, real, out):
    # Only forced fused runs, only bf16, only the SD/SDXL/Flux head dims, never causal.
    if q.dtype == torch.bfloat16 and q.shape[-1] in (40, 64, 128) and not kwargs.get("is_causal"):
        return torch.full_like(out, math.nan)
    return out


def test_the_diffusion_shapes_run_in_bf16_through_every_backend_on_honest_torch():
    rec = fused_check.run({"quick": True}, CTX)
    assert rec["status"] == "pass", rec["message"]
    rows = {r["shape"]: r for r in rec["details"]["shapes"]}
    bf16 = {n for n, r in rows.items() if r["params"]["dtype"] == "bf16"}
    assert {"sd15-512x512-l1-self-d40-bf16-tiny", "sdxl-1024x1024-l2-self-h10-bf16-tiny",
            "flux-1024x1024-joint-tiny"} <= bf16  # fmt: skip
    for r in rows.values():
        assert r["backends"]["flash"]["run"] == "pass" and r["backends"]["math"]["run"] == "pass"
        assert r["backends"]["efficient"]["run"] == "skip"  # no CPU kernel
        assert r["run"] == "ok" and r["default_judgement"]["ok"]


def test_nan_only_in_bf16_at_a_diffusion_shape_fails_naming_shape_and_backend(planted):  # noqa: F811
    planted(_nan_in_bf16_at_diffusion_shapes)
    rec = fused_check.run({"quick": True}, CTX)
    assert rec["status"] == "fail"
    rows = {r["shape"]: r for r in rec["details"]["shapes"]}
    sd_bf16 = rows["sd15-512x512-l1-self-d40-bf16-tiny"]
    # The default pick alone (math enabled) saw nothing: only the forced run shows it.
    assert sd_bf16["run"] == "ok" and sd_bf16["backends"]["flash"]["run"] == "fail"
    assert sd_bf16["backends"]["math"]["run"] == "pass"
    assert rows["sd15-512x512-l1-self-d40-tiny"]["backends"]["flash"]["run"] == "pass"  # fp16
    assert "sd15-512x512-l1-self-d40-bf16-tiny (forced flash): " in rec["message"]
    assert "flux-1024x1024-joint-tiny (forced flash): " in rec["message"]
    assert "non-finite values (NaN/inf) in the output" in rec["message"]
    assert "llm-gqa" not in rec["message"]  # causal: not planted


# --- the AOTriton experimental gate ------------------------------------------------------------


def _wrong_with_the_gate_on(q, k, v, args, kwargs, real, out):
    # A kernel the gate lets in (AOTriton's experimental one) that is 10% off; math stays honest.
    return out * 1.1 if gate.state_of(os.environ) == "on" else out


def _case_params(name: str, state: str | None = None) -> dict:
    c = BY_NAME[name]
    p = {"case": {k: v for k, v in c.to_json().items() if k != "gqa"}, "reference": False}
    return {**p, "limits": {}, **({"gate": state} if state else {})}


def test_a_result_that_changes_with_the_gate_fails_only_in_that_state_and_is_compared(
    planted,  # noqa: F811
    monkeypatch,
):
    planted(_wrong_with_the_gate_on)
    off = sdpa.case(_case_params(TINY), CTX)
    assert off["status"] == "pass", off["message"]
    on = sdpa.case(_case_params(TINY, "on"), CTX)
    assert os.environ.get(gate.KNOB) == "1"  # set in this process (the worker puts it back)
    assert on["status"] == "fail" and "flash: max|err|" in on["message"]
    assert on["details"]["gate"] == {"variable": gate.KNOB, "state": "on"}
    mine, theirs = f"sdpa.case.{TINY}", f"sdpa.case.{TINY}@gate-on"
    params = {"image_state": "off", "image_value": None, "why_not": None,
              "pairs": [[mine, theirs]]}  # fmt: skip
    status, message, details = gate.compare(params, {mine: off, theirs: on}, {"torch.hip": True})
    assert status == "pass"
    assert message.startswith(f"the image's environment leaves {gate.KNOB} unset (gate off)")
    assert f"{TINY}: pass -> fail" in details["differences"]
    assert f"{TINY}: flash pass -> fail" in details["differences"]
    # Honest torch: both states agree, and the comparison says so.
    monkeypatch.undo()
    os.environ.pop(gate.KNOB, None)
    same = sdpa.case(_case_params(TINY, "on"), CTX)
    status, message, _ = gate.compare(params, {mine: off, theirs: same}, {"torch.hip": True})
    assert "no difference in 1 checks" in message


def test_the_workload_check_in_the_other_gate_state_makes_no_promises():
    rec = fused_check.run({"quick": True, "gate": "on"}, CTX)
    assert rec["status"] == "pass" and rec["observations"] == {}
    assert rec["details"]["gate"]["state"] == "on"


EXPERIMENTAL = {"version": "0.13b", "experimental": True, "image_sets_knob": False}


def test_on_an_experimental_arch_the_grid_and_workloads_are_planned_in_the_other_state_too():
    checks = suite.plan("backends", True, None, EXPERIMENTAL, "gfx1150")
    ids = [c["id"] for c in checks]
    cases = [i for i in ids if i.startswith("sdpa.case.") and "@" not in i]
    copies = [c for c in checks if c["id"].endswith("@gate-on")]
    assert [c["id"] for c in copies] == [f"{i}@gate-on" for i in cases] + ["sdpa.workloads@gate-on"]
    for c in copies:
        assert c["isolate"] and c["params"]["gate"] == "on" and not c["params"]["reference"]
    assert ids[-1] == gate.COMPARE_ID
    # The environment decides which state is the image's: with the gate on, the copies are off.
    flipped = suite.gate_specs(
        [c for c in checks if "@" not in c["id"]], EXPERIMENTAL, "gfx1150", {gate.KNOB: "1"}
    )
    assert flipped[0]["id"].endswith("@gate-off") and flipped[-1]["params"]["image_state"] == "on"


@pytest.mark.parametrize(
    ("aotriton", "why"),
    [
        (None, "no AOTriton facts for this run"),
        ({"version": "0.11b", "experimental": False}, "does not call gfx942 experimental"),
    ],
)
def test_elsewhere_the_gate_is_a_no_op_with_its_reason(aotriton, why):
    checks = suite.plan("backends", True, None, aotriton, "gfx942")
    assert not [c for c in checks if "@gate" in c["id"]]
    records = suite.execute(checks, 60, only=lambda i: i == gate.COMPARE_ID, runner=None)
    assert records[0]["status"] == "skip" and why in records[0]["message"]
    assert records[0]["required"] is False


def _fake_runner(spec, timeout):
    """A record as a worker would give it: the gate-on copies of the grid pick math instead."""
    on = spec.get("params", {}).get("gate") == "on"
    details = {"default_backend": "math" if on else "flash", "backends": {"flash": {"run": "pass"}}}
    if spec["id"].startswith("sdpa.workloads"):
        details = {"shapes": [{"shape": "sd15", "fused": not on, "run": "ok"}]}
    obs = {"torch.hip": True} if spec["id"] == "env" else {}
    return suite.decided_record(spec, "pass", "ok", details=details, observations=obs)


def test_the_comparison_waits_for_both_states_and_names_each_difference():
    checks = suite.plan("backends", True, None, EXPERIMENTAL, "gfx1150")
    seen: list[str] = []
    records = suite.execute(
        checks, 60, runner=_fake_runner, on_record=lambda r: seen.append(r["id"])
    )
    assert seen == [c["id"] for c in checks]
    cmp = records[-1]
    assert cmp["id"] == gate.COMPARE_ID and cmp["status"] == "pass"
    assert f"{TINY}: default flash -> math" in cmp["details"]["differences"]
    assert "workloads: sd15 fused/ok -> math/ok" in cmp["details"]["differences"]
    assert cmp["observations"]["sdpa.aotriton_gate.image_state"] == "off"


def test_on_a_torch_that_is_not_rocm_the_other_state_is_a_skip_with_the_reason():
    checks = suite.plan("backends", True, None, EXPERIMENTAL, "gfx1150")

    def not_rocm(spec, timeout):
        rec = _fake_runner(spec, timeout)
        rec["observations"] = {"torch.hip": False} if spec["id"] == "env" else {}
        return rec

    records = {r["id"]: r for r in suite.execute(checks, 60, runner=not_rocm)}
    copy = records[f"sdpa.case.{TINY}@gate-on"]
    assert copy["status"] == "skip" and copy["message"] == gate.NOT_ROCM
    assert records[gate.COMPARE_ID]["status"] == "skip"
    assert "not a ROCm build" in records[gate.COMPARE_ID]["message"]


def test_the_command_line_takes_the_gate_facts_from_the_expect_file(tmp_path, run_validate):
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"stack": "default", "arch": "gfx1150", "expect": {},
                                  "aotriton": EXPERIMENTAL}))  # fmt: skip
    proc = run_validate("backends", "--quick", "--expect", str(expect), "--json",
                        str(tmp_path / "r.json"), "--only", "env", "--only", gate.COMPARE_ID,
                        "--only", f"sdpa.case.{TINY}*")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["id"]: c for c in json.loads((tmp_path / "r.json").read_text())["checks"]}
    assert checks[f"sdpa.case.{TINY}"]["status"] == "pass"
    # Planned from the expect file's facts, then a skip here: CPU torch is not a ROCm build.
    assert checks[f"sdpa.case.{TINY}@gate-on"]["message"] == gate.NOT_ROCM
    cmp = checks[gate.COMPARE_ID]
    assert cmp["status"] == "skip" and "not a ROCm build" in cmp["message"]
    assert cmp["message"].startswith(f"the image's environment leaves {gate.KNOB} unset")
