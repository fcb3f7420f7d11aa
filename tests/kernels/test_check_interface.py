"""attnforge_kernels.check as the validation suite calls it (names, verdicts, skip without a GPU),
and the harness behind it (attnforge_kernels/checks/): one case type and name grammar, one judge."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge_kernels import check
from attnforge_kernels.checks import attention, grids, judge
from attnforge_kernels.checks.case import KINDS, Case

REPO = Path(__file__).resolve().parents[2]


def _every_grid() -> list[Case]:
    return (
        grids.attention_grid(False) + grids.attention_grid(True) + grids.attention_boundary()
        + grids.cpu_grid() + grids.interpreter_grid()
        + grids.variant_grid(False) + grids.variant_grid(True) + grids.variant_boundary()
        + grids.kvcache_grid(False) + grids.kvcache_grid(True) + grids.kvcache_boundary()
    )  # fmt: skip


def test_every_case_name_of_every_kind_round_trips():
    cases = _every_grid()
    assert {c.kind for c in cases} == set(KINDS)
    assert all(Case.parse(c.name) == c for c in cases)


@pytest.mark.parametrize(
    "name",
    [
        "attn-bf16-nonsense",
        "dropout-bf16-nonsense",
        "fp8-bf16-b1-sq1-sk1-h2x2-d16-alibi-head",  # fp8 takes no alibi
        "packed-bf16-b1-sq1-sk1-h2x2-d16-full",  # packed needs its pack
        "kvcache-bf16-b1-sq1-sk1-h2x2-d16-causal-page-new0-rope0-s0",
        "mystery-bf16-b1-sq1-sk1-h2x2-d16-full-bshd",
    ],
)
def test_a_wrong_name_is_rejected(name):
    with pytest.raises(ValueError, match="not a kernel check case name"):
        Case.parse(name)


@pytest.mark.parametrize("mask", ["full", "causal", "window", "alibi", "softcap"])
def test_a_masks_flash_attn_arguments_mean_the_references_left_and_right(mask):
    from attnforge_kernels.checks.reference import flash_window

    case = Case("kvcache", "bf16", 1, 5, 9, 2, 2, 16, mask, "contig")
    causal, window, softcap, alibi = case.flash_args()
    left, right, softcap_ref, alibi_ref = case.mask_args()
    assert flash_window(causal, window) == (left, right)
    assert (softcap, alibi) == (softcap_ref, alibi_ref)


def test_a_case_refuses_a_mask_or_layout_its_kind_does_not_take():
    with pytest.raises(ValueError, match="mask"):
        Case("dropout", "bf16", 1, 1, 1, 2, 2, 16, "alibi", "bshd")
    with pytest.raises(ValueError, match="layout"):
        Case("attn", "bf16", 1, 1, 1, 2, 2, 16, "full", "page16")


def test_the_suite_gets_the_short_feature_grids_and_kernels_check_the_full_ones(monkeypatch):
    from attnforge_kernels.device import configs

    monkeypatch.setattr(configs, "INTERPRET", False)  # the GPU lists, named without a GPU
    short = [c.name for c in grids.variant_grid(True) + grids.kvcache_grid(True)]
    full = [c.name for c in grids.variant_grid(False) + grids.kvcache_grid(False)]
    attention = [c.name for c in grids.attention_grid(False)]
    assert len(full) > len(short) > 0
    assert check.list_cases(False) == attention + short + [check.SHIM_CASE]
    assert check.list_cases(False, every_feature_grid=True) == attention + full + [check.SHIM_CASE]
    quick = [c.name for c in grids.attention_grid(True)] + short + [check.SHIM_CASE]
    assert check.list_cases(True) == check.list_cases(True, every_feature_grid=True) == quick


def test_interpreter_lists_a_few_tiny_cases_covering_every_feature():
    names = check.list_cases(quick=False)
    assert names[-1] == check.SHIM_CASE
    cases = [Case.parse(n) for n in names[:-1]]
    assert cases == grids.interpreter_grid()
    assert check.list_cases(quick=True) == names[:1] + [check.SHIM_CASE]
    assert {"causal", "window", "alibi", "softcap"} <= {c.mask for c in cases}
    assert "varlen" in {c.layout for c in cases} and any(c.hq != c.hk for c in cases)
    assert any(c.d not in (16, 32, 64, 128, 256) for c in cases)  # a padded head dim
    assert max(max(c.sq, c.sk) for c in cases) < 32


def test_full_gpu_grid_covers_the_issue_seqlens_and_head_dims():
    cases = grids.attention_grid(False)
    assert {1, 17, 127, 128, 129, 1000, 4096, 6032, 6889} <= {c.sq for c in cases}
    assert {40, 64, 72, 80, 96, 128, 160, 256} <= {c.d for c in cases}
    assert {"varlen", "bhsd"} <= {c.layout for c in cases}
    assert any(c.hq != c.hk for c in cases)


def test_run_case_returns_the_agreed_shape():
    res = check.run_case("attn-fp16-b1-sq19-sk23-h2x1-d32-causal-bshd")
    assert res["status"] == "pass", res["message"]
    assert set(res) == {"status", "message", "metrics"}
    assert all(isinstance(v, float) for v in res["metrics"].values())


def test_shim_case_counts_routed_and_fallback_calls():
    res = check.run_case(check.SHIM_CASE)
    assert res["status"] == "pass", res["message"]
    assert res["metrics"] == {"routed": 2.0, "fallback": 2.0}


def test_rule_fails_an_error_beyond_twice_the_reference_error():
    assert judge.tolerance.within(0.02, 0.01, 1.0, 2**-10)[0]
    assert not judge.tolerance.within(0.03, 0.01, 1.0, 2**-10)[0]


def test_the_judge_holds_outputs_to_twice_and_gradients_to_three_times_the_yardstick():
    import torch

    ref = torch.zeros(4)
    pt = torch.tensor([0.01, 0, 0, 0])  # yardstick 0.01; floor eps * 1e-2 is negligible
    j = judge.Judge(eps=2**-20)
    assert j.tensor("out", torch.tensor([0.019, 0, 0, 0]), ref, pt)
    assert j.tensor("dq", torch.tensor([0.029, 0, 0, 0]), ref, pt)
    assert j.ok and j.metrics()["bound_dq"] > j.metrics()["bound_out"]
    assert not j.tensor("out", torch.tensor([0.021, 0, 0, 0]), ref, pt) and not j.ok


def test_the_judge_fails_non_finite_outputs_and_lse_rows_that_disagree_on_seeing_no_key():
    import torch

    j = judge.Judge(eps=2**-7)
    assert not j.tensor("out", torch.tensor([float("nan")]), torch.zeros(1), torch.zeros(1))
    assert j.metrics()["err_out"] == float("inf")
    lse_ref = torch.tensor([1.0, float("inf")])
    assert judge.Judge(eps=2**-7).lse(torch.tensor([1.005, float("inf")]), lse_ref)
    assert not judge.Judge(eps=2**-7).lse(torch.tensor([1.0, 3.0]), lse_ref)


def test_cases_are_judged_by_the_validation_suites_rule(monkeypatch):
    import torch

    case = Case("attn", "bf16", 1, 1, 1, 2, 2, 16, "causal", "bshd")
    assert attention.compare(case, torch.device("cpu"))["ok"]
    monkeypatch.setattr(judge.tolerance, "within", lambda err, *_a, **_k: (False, 0.0))
    assert not attention.compare(case, torch.device("cpu"))["ok"]


@pytest.mark.slow
def test_skips_without_gpu_or_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    code = "import json, attnforge_kernels.check as c; print(json.dumps(c.run_case(c.list_cases(True)[0])))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert '"status": "skip"' in out.stdout, out.stderr


def test_shards_split_the_list_between_processes(capsys):
    names = [
        "attn-fp16-b1-sq19-sk23-h2x1-d32-causal-bshd",
        "attn-bf16-b1-sq5-sk7-h2x2-d32-full-bshd",
        "attn-fp16-b1-sq9-sk9-h2x1-d32-full-bshd",
    ]
    args = [a for n in names for a in ("--case", n)]
    assert check.main([*args, "--shard", "1/2"]) == 0
    out = capsys.readouterr().out
    assert "1/1 not failed" in out and "sq5-sk7" in out and "sq19" not in out
    for bad in ("2/2", "1", "a/b", "-1/2"):
        with pytest.raises(SystemExit) as e:
            check.main(["--shard", bad])
        assert e.value.code == 2
