"""invoke validate --bench/--stress: which tool commands run after the suite, and how they are judged."""

from __future__ import annotations

import pytest

from attnforge.cli.validate import stress_workloads, workload_names
from attnforge.errors import UserError
from attnforge.validation import tool_failures, tool_runs
from tests.conftest import REPO


def test_bench_runs_bench_and_bench_train_into_the_output_folder():
    runs = tool_runs(True, [], quick=False, tiny=False, timeout=0, stress_iters=100)
    assert [(r.name, r.output) for r in runs] == [
        ("bench", "bench.json"),
        ("bench-train", "bench_train.json"),
    ]
    assert runs[0].argv("python3", "/out") == [
        "python3", "-m", "validate", "bench", "--json", "/out/bench.json",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("quick", "tiny", "bench_size", "train_size"),
    [
        (True, False, ["--quick"], ["--quick"]),
        (False, True, ["--tiny"], ["--tiny"]),
        # the cpu stack with --quick: bench's one-shape tiny sweep; bench-train has no smaller model
        (True, True, ["--tiny", "--quick"], ["--tiny"]),
    ],
)
def test_quick_and_the_cpu_stack_shrink_the_tools(quick, tiny, bench_size, train_size):
    runs = tool_runs(True, ["llm"], quick=quick, tiny=tiny, timeout=60, stress_iters=10)
    for r, size in zip(runs[:2], (bench_size, train_size), strict=True):
        assert r.args[-len(size) - 2 :] == [*size, "--timeout", "60"]
        assert not {"--quick", "--tiny"} - set(size) & set(r.args)
    stress = runs[2].argv("python3", "/out")
    assert stress[:8] == [
        "python3", "-m", "validate", "stress", "--workload", "llm", "--backend", "all",
    ]  # fmt: skip
    assert stress[stress.index("--iters") + 1] == "10"
    assert stress[stress.index("--json") + 1] == "/out/stress-llm.json"
    assert ("--tiny" in stress) is tiny and "--quick" not in stress  # stress has no --quick


def test_stress_takes_repeats_and_comma_lists_and_refuses_unknown_workloads():
    known = workload_names(REPO)
    assert "qwen-image" in known and "llm" in known
    assert stress_workloads(["llm,sdxl", "llm"], known) == ["llm", "sdxl"]
    with pytest.raises(UserError, match="--stress sd3: no such workload"):
        stress_workloads(["sd3"], known)
    with pytest.raises(UserError, match="custom needs a shape"):
        stress_workloads(["custom"], known)


def test_a_tool_fails_the_run_when_it_exits_nonzero_or_writes_nothing(tmp_path):
    runs = tool_runs(True, ["llm"], quick=True, tiny=True, timeout=0, stress_iters=2)
    (tmp_path / "bench.json").write_text("{}")
    (tmp_path / "stress-llm.json").write_text("{}")
    codes = {"bench": 0, "bench-train": 1, "stress llm": 1}
    assert tool_failures(runs, codes, tmp_path) == [
        "bench-train wrote no bench_train.json (exit 1); the previous one, if any, is kept",
        "stress llm failed (exit 1): see stress-llm.json",
    ]
    assert tool_failures(runs[:1], {"bench": 0}, tmp_path) == []


def test_the_hosts_thread_caps_go_into_the_image_when_set():
    from attnforge.validation import thread_env

    assert thread_env({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2", "PATH": "/bin"}) == {
        "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2",
    }  # fmt: skip
    assert thread_env({"OMP_NUM_THREADS": "", "PATH": "/bin"}) == {}
    source = (REPO / "attnforge/cli/validate.py").read_text()
    assert '{"ATTNFORGE_ENGINE": eng.describe(), **thread_env()}' in source
