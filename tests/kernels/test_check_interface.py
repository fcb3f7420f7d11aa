"""kernels.check as the validation suite calls it: names, verdicts, skip without a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import check

REPO = Path(__file__).resolve().parents[2]


def test_every_case_name_round_trips():
    for case in check._grid_full() + check._grid_quick() + check._grid_boundary():
        assert check.Case.parse(case.name) == case


def test_the_suite_gets_the_short_feature_grids_and_kernels_check_the_full_ones(monkeypatch):
    from kernels import check_kvcache, check_variants, configs

    monkeypatch.setattr(configs, "INTERPRET", False)  # the GPU lists, named without a GPU
    short = [c.name for c in check_variants.grid(True) + check_kvcache.grid(True)]
    full = [c.name for c in check_variants.grid(False) + check_kvcache.grid(False)]
    attention = [c.name for c in check._grid_full()]
    assert len(full) > len(short) > 0
    assert check.list_cases(False) == attention + short + [check.SHIM_CASE]
    assert check.list_cases(False, every_feature_grid=True) == attention + full + [check.SHIM_CASE]
    quick = [c.name for c in check._grid_quick()] + short + [check.SHIM_CASE]
    assert check.list_cases(True) == check.list_cases(True, every_feature_grid=True) == quick


def test_interpreter_lists_a_few_tiny_cases_covering_every_feature():
    names = check.list_cases(quick=False)
    assert names[-1] == check.SHIM_CASE
    cases = [check.Case.parse(n) for n in names[:-1]]
    assert cases == check.grid_interpreter()
    assert check.list_cases(quick=True) == names[:1] + [check.SHIM_CASE]
    assert {"causal", "window", "alibi", "softcap"} <= {c.mask for c in cases}
    assert "varlen" in {c.layout for c in cases} and any(c.hq != c.hk for c in cases)
    assert any(c.d not in (16, 32, 64, 128, 256) for c in cases)  # a padded head dim
    assert max(max(c.sq, c.sk) for c in cases) < 32


def test_full_gpu_grid_covers_the_issue_seqlens_and_head_dims():
    cases = check._grid_full()
    assert {1, 17, 127, 128, 129, 1000, 4096, 6032, 6889} <= {c.sq for c in cases}
    assert {40, 64, 72, 80, 96, 128, 160, 256} <= {c.d for c in cases}
    assert {"varlen", "bhsd"} <= {c.layout for c in cases}
    assert any(c.hq != c.hk for c in cases)


def test_a_wrong_name_is_rejected():
    with pytest.raises(ValueError):
        check.Case.parse("attn-bf16-nonsense")


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
    assert check.tolerance.within(0.02, 0.01, 1.0, 2**-10)[0]
    assert not check.tolerance.within(0.03, 0.01, 1.0, 2**-10)[0]


def test_cases_are_judged_by_the_validation_suites_rule(monkeypatch):
    import torch

    from contract import tolerance

    case = check.Case("bf16", 1, 1, 1, 2, 2, 16, "causal")
    assert check.compare(case, torch.device("cpu"))["ok"]
    monkeypatch.setattr(tolerance, "within", lambda err, *_a, **_k: (False, 0.0))
    assert not check.compare(case, torch.device("cpu"))["ok"]


@pytest.mark.slow
def test_skips_without_gpu_or_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    code = "import json, kernels.check as c; print(json.dumps(c.run_case(c.list_cases(True)[0])))"
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
