"""validate bench and bench-train: shapes, numbers, the per-item process runner, the CLI on CPU."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.validate.conftest import run_validate
from validate import bench, bench_train, item_runner
from validate.cli import UsageError
from validate.cli import main as cli_main

# --- shapes and numbers ---------------------------------------------------------------------


def test_the_full_sweep_is_flash_attentions_benchmark_grid():
    shapes = bench.sweep("full", "fp16")
    assert len(shapes) == 6 * 2 * 2
    assert {s["b"] * s["sq"] for s in shapes} == {16384}
    assert {s["h"] * s["d"] for s in shapes} == {2048}
    assert {s["d"] for s in shapes} == {64, 128}
    assert sorted({s["sq"] for s in shapes}) == [512, 1024, 2048, 4096, 8192, 16384]
    assert {s["causal"] for s in shapes} == {False, True}
    assert all(s["sq"] == s["sk"] and s["h"] == s["hkv"] for s in shapes)
    assert len({s["name"] for s in shapes}) == len(shapes)
    assert all(s["family"] == "sweep" and s["dtype"] == "fp16" for s in shapes)


@pytest.mark.parametrize(
    ("size", "quick", "count", "tokens", "model_dim"),
    [
        ("full", True, 4, 16384, 2048),  # (4, 4096) x d 64/128 x causal
        ("tiny", False, 8, 64, 128),
        ("tiny", True, 1, 64, 128),  # the interpreter's quickest: one head of 128
    ],
)
def test_smaller_sweeps_keep_the_construction(size, quick, count, tokens, model_dim):
    shapes = bench.sweep(size, "bf16", quick)
    assert len(shapes) == count
    assert {s["b"] * s["sq"] for s in shapes} == {tokens}
    assert {s["h"] * s["d"] for s in shapes} == {model_dim}


@pytest.mark.parametrize(
    ("mode", "factor"),
    [("fwd", 1.0), ("bwd", 2.5), ("fwd_bwd", 3.5)],
)
def test_tflops_use_flash_attentions_flop_count(mode, factor):
    shape = {"name": "x", "b": 2, "h": 4, "hkv": 4, "sq": 1000, "sk": 500, "d": 64}
    row = bench.result_row(
        "sdpa.math", {**shape, "causal": False}, mode, {"status": "ok", "ms_all": [3.0, 1.0, 2.0]}
    )
    assert row["ms"] == 2.0  # the median, not the mean or the first
    assert row["ms_all"] == [3.0, 1.0, 2.0]
    assert row["tflops"] == pytest.approx(4 * 2 * 1000 * 500 * 4 * 64 * factor / 2e-3 / 1e12)
    causal = bench.result_row(
        "sdpa.math", {**shape, "causal": True}, mode, {"status": "ok", "ms_all": [2.0]}
    )
    assert causal["tflops"] == pytest.approx(row["tflops"] / 2)


def test_a_result_that_did_not_run_has_no_numbers():
    row = bench.result_row(
        "sdpa.cudnn", bench.sweep("tiny", "fp16")[0], "fwd",
        {"status": "unsupported", "ms_all": [1.0], "peak_mem_mb": 5.0, "message": "why"},
    )  # fmt: skip
    assert (row["ms"], row["ms_all"], row["tflops"], row["peak_mem_mb"]) == (None, [], None, None)
    assert row["message"] == "why"


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        (["ok", "unsupported"], 0),
        (["ok", "error"], 1),
        (["crash"], 1),
        (["timeout", "ok"], 1),
    ],
)
def test_bench_fails_on_error_crash_or_timeout_not_on_refusal(statuses, code):
    assert bench.exit_code([{"status": s} for s in statuses]) == code


def test_backend_lists_take_repeats_commas_and_all():
    known = bench.BACKENDS
    assert bench.picked_names(None, known, "backend") == list(known)
    assert bench.picked_names(["kernels,sdpa.math", "kernels"], known, "backend") == [
        "kernels",
        "sdpa.math",
    ]
    assert bench.picked_names(["all"], known, "backend") == list(known)
    with pytest.raises(UsageError, match="unknown backend 'sdpa.fast'; choose from"):
        bench.picked_names(["sdpa.fast"], known, "backend")


def test_workload_shapes_come_from_contract_workloads():
    from contract import workloads

    full = bench.workload_shapes(None, None, tiny=False)
    names = [n for n in workloads.names() if n != workloads.CUSTOM]
    assert full == [s for n in names for s in workloads.shapes(n)]
    quick = bench.workload_shapes(None, None, tiny=False, quick=True)
    assert len(quick) == len(names)
    assert bench.workload_shapes(None, None, tiny=True) == []  # tiny: the sweep only, unless named
    tiny = bench.workload_shapes(["llm"], None, tiny=True)
    assert tiny == [workloads.tiny(s) for s in workloads.shapes("llm")]
    assert bench.workload_shapes(["none"], None, tiny=False) == []
    # --resolution goes to the image workloads only (llm's shapes are fixed)
    sized = bench.workload_shapes(["sdxl", "llm"], "512x512", tiny=False)
    assert any("512x512" in s["name"] for s in sized) and any("llm" in s["name"] for s in sized)
    with pytest.raises(UsageError):
        bench.workload_shapes(["sdxl"], "12x7", tiny=False)


# --- bench-train's loss check ---------------------------------------------------------------


def _run(backend, loss, status="ok"):
    return {"backend": backend, "status": status, "first_loss": loss if status == "ok" else None}


@pytest.mark.parametrize(
    ("runs", "dtype", "ok", "reference", "in_message"),
    [
        ([_run("sdpa.math", 5.0), _run("kernels", 5.04)], "bf16", True, "sdpa.math", "agree"),
        ([_run("sdpa.math", 5.0), _run("kernels", 5.06)], "bf16", False, "sdpa.math", "kernels"),
        ([_run("sdpa.math", 5.0), _run("kernels", 5.001)], "fp32", False, "sdpa.math", "kernels"),
        ([_run("sdpa.math", 0, "error"), _run("sdpa.flash", 5.0), _run("kernels", 5.0)], "fp16", True, "sdpa.flash", "agree"),
        ([_run("sdpa.math", 5.0), _run("kernels", 0, "unsupported")], "bf16", True, "sdpa.math", "nothing to compare"),
        ([_run("sdpa.math", 0, "crash")], "bf16", False, "sdpa.math", "no backend ran"),
    ],
)  # fmt: skip
def test_the_first_step_losses_must_agree_with_the_reference(
    runs, dtype, ok, reference, in_message
):
    check = bench_train.loss_check(runs, dtype)
    assert check["ok"] is ok
    assert check["reference"] == reference
    assert check["tolerance"] == bench_train.TOLERANCE[dtype]
    assert in_message in check["message"]


def test_a_disagreeing_loss_fails_bench_train():
    runs = [{**_run("sdpa.math", 5.0)}, {**_run("kernels", 6.0)}]
    assert bench_train.exit_code(runs, bench_train.loss_check(runs, "bf16")) == 1
    assert bench_train.exit_code(runs[:1], bench_train.loss_check(runs[:1], "bf16")) == 0


@pytest.mark.slow
def test_the_loss_check_sees_an_attention_with_the_wrong_mask():
    """The real model on the CPU in fp32: a non-causal attention moves the first loss past 1e-4."""
    torch = pytest.importorskip("torch")
    cfg = dict(bench_train.PRESETS["tiny"], dtype="fp32", seed=0)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def first_loss(causal: bool) -> float:
        def attend(q, k, v):
            t = (x.transpose(1, 2) for x in (q, k, v))
            return sdpa(*t, is_causal=causal).transpose(1, 2)

        torch.manual_seed(0)
        model = bench_train.build_model(torch, cfg, attend)
        gen = torch.Generator().manual_seed(1)
        data = torch.randint(cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen)
        with torch.no_grad():
            logits = model(data[:, :-1])
        return float(
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, cfg["vocab"]), data[:, 1:].reshape(-1)
            )
        )

    runs = [_run("sdpa.math", first_loss(True)), _run("kernels", first_loss(False))]
    assert not bench_train.loss_check(runs, "fp32")["ok"]
    same = [_run("sdpa.math", first_loss(True)), _run("kernels", first_loss(True))]
    assert bench_train.loss_check(same, "fp32")["ok"]


# --- the per-item process runner ------------------------------------------------------------

FAKE_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from validate.item_runner import EventWriter

    spec = json.load(open(sys.argv[2]))
    out = EventWriter(sys.argv[3])
    out.emit({"event": "env", "env": {"torch": "fake"}})
    for i in spec["indices"]:
        out.emit({"event": "start", "index": i})
        what = spec["items"][i]
        if what == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if what == "hang":
            time.sleep(60)
        if what == "exit":
            sys.exit(7)
        out.emit({"event": "result", "index": i, "result": {"status": "ok", "pid": os.getpid()}})
    """
)


def _run_fake(tmp_path: Path, items: list[str], timeout: float = 30.0):
    (tmp_path / "fake_child.py").write_text(FAKE_CHILD)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    results: dict[int, dict] = {}
    outcomes: dict[int, item_runner.ItemOutcome] = {}
    seen = item_runner.run_items(
        "fake_child", {"items": items}, len(items), timeout,
        lambda i, r: results.__setitem__(i, r), lambda i, o: outcomes.__setitem__(i, o), env=env,
    )  # fmt: skip
    return seen, results, outcomes


def test_a_crash_is_charged_to_its_item_and_a_fresh_process_runs_the_rest(tmp_path):
    env, results, outcomes = _run_fake(tmp_path, ["a", "segv", "b", "exit", "c"])
    assert env == {"torch": "fake"}
    assert sorted(results) == [0, 2, 4]
    assert {i: o.status for i, o in outcomes.items()} == {1: "crash", 3: "crash"}
    assert "SIGSEGV" in outcomes[1].message
    assert "status 7" in outcomes[3].message
    assert results[0]["pid"] != results[2]["pid"] != results[4]["pid"]


def test_an_item_past_the_timeout_is_killed_and_the_rest_still_run(tmp_path):
    _, results, outcomes = _run_fake(tmp_path, ["a", "hang", "b"], timeout=1.0)
    assert sorted(results) == [0, 2]
    assert outcomes[1].status == "timeout" and "1 s" in outcomes[1].message


def test_a_process_that_dies_outside_any_item_charges_every_item_left(tmp_path):
    items = ["a", "b"]
    (tmp_path / "fake_child.py").write_text("import sys\nsys.exit(3)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    outcomes: dict = {}
    item_runner.run_items(
        "fake_child", {"items": items}, 2, 30, lambda i, r: None, outcomes.__setitem__, env=env
    )
    assert sorted(outcomes) == [0, 1]
    assert all(
        o.status == "crash" and "before this item started" in o.message for o in outcomes.values()
    )


def test_a_process_that_hangs_outside_any_item_times_out_every_item_left(tmp_path):
    (tmp_path / "fake_child.py").write_text("import time\ntime.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    outcomes: dict = {}
    item_runner.run_items(
        "fake_child",
        {"items": ["a", "b"]},
        2,
        1.0,
        lambda i, r: None,
        outcomes.__setitem__,
        env=env,
    )
    assert sorted(outcomes) == [0, 1]
    assert all(o.status == "timeout" and "outside any item" in o.message for o in outcomes.values())


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["bench", "--backend", "nope"], "unknown backend 'nope'"),
        (["bench", "--mode", "fwd,sideways"], "unknown mode 'sideways'"),
        (["bench", "--warmup", "-1"], "--warmup must be 0 or more"),
        (["bench-train", "--backend", "sdpa.fast"], "unknown backend"),
    ],
)
def test_usage_errors_are_one_sentence_before_anything_runs(argv, words, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_bench_train_refuses_a_width_the_heads_do_not_divide(capsys):
    assert cli_main(["bench-train", "--tiny", "--width", "65", "--backend", "sdpa.math"]) == 2
    assert "--width 65 is not a multiple of --heads 2" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_on_cpu_times_math_and_refuses_the_gpu_only_backends(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_validate(
        "bench", "--backend", "sdpa.math,sdpa.efficient", "--mode", "fwd,fwd_bwd",
        "--quick", "--repeats", "2", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no GPU here: timing the tiny shapes" in proc.stdout
    doc = json.loads(out.read_text())
    assert (doc["kind"], doc["version"], doc["size"], doc["repeats"]) == (
        "attnforge.bench",
        1,
        "tiny",
        2,
    )
    assert doc["env"]["device"] == "cpu" and doc["env"]["torch"]
    by = {(r["backend"], r["mode"]): r for r in doc["results"]}
    assert set(by) == {(b, m) for b in ("sdpa.math", "sdpa.efficient") for m in ("fwd", "fwd_bwd")}
    for mode in ("fwd", "fwd_bwd"):
        ok = by["sdpa.math", mode]
        assert ok["status"] == "ok" and len(ok["ms_all"]) == 2 and ok["ms"] > 0 and ok["tflops"] > 0
        assert ok["peak_mem_mb"] is None  # no memory figure on a CPU
        refused = by["sdpa.efficient", mode]
        assert refused["status"] == "unsupported" and "no CPU kernel" in refused["message"]
    assert doc["results"][0]["shape"] == bench.sweep("tiny", "fp16", True)[0]


@pytest.mark.slow
def test_bench_runs_the_bundled_kernels_in_the_interpreter_without_a_gpu(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_validate(
        "bench", "--backend", "kernels", "--mode", "fwd", "--quick", "--repeats", "1",
        "--warmup", "0", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["backend"] == "kernels" and row["status"] == "ok", row


@pytest.mark.slow
def test_bench_train_on_cpu_agrees_on_the_first_loss(tmp_path):
    out = tmp_path / "bench_train.json"
    proc = run_validate(
        "bench-train", "--backend", "sdpa.math,sdpa.flash,sdpa.cudnn", "--dtype", "fp32",
        "--steps", "2", "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["kind"] == "attnforge.bench_train" and doc["config"]["width"] == 64
    by = {r["backend"]: r for r in doc["results"]}
    assert by["sdpa.cudnn"]["status"] == "unsupported"
    for name in ("sdpa.math", "sdpa.flash"):
        r = by[name]
        assert r["status"] == "ok" and len(r["step_ms"]) == 2 and r["tokens_per_s"] > 0
    check = doc["loss_check"]
    assert check["ok"] and check["reference"] == "sdpa.math" and check["tolerance"] == 1e-4
    assert check["max_rel_diff"] <= 1e-4


def test_a_json_path_that_cannot_be_written_is_refused_before_timing(tmp_path, capsys):
    assert cli_main(["bench", "--json", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "is a directory" in captured.err
    assert "bench:" not in captured.out  # refused before the torch probe and any timing
