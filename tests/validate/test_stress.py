"""`python -m validate stress`: workload shapes, the pure parts of the parent, and real runs on CPU
torch at --tiny shapes with faults planted through the VALIDATE_STRESS_FAULT testing hook."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from contract import workloads
from validate import cli, stress
from validate._stress_child import FAULT_KINDS, parse_faults
from validate.runner import Outcome

CONTRACT_SHAPE = set(workloads.SHAPE_KEYS)
CONTRACT_RUN = {
    "backend",
    "status",
    "iters_requested",
    "iters_completed",
    "ms_per_iter",
    "first_failure",
    "serialize",
    "message",
}


# --- workloads ----------------------------------------------------------------------------------


def test_qwen_image_joins_text_and_image_tokens_at_both_presets():
    got = {s["name"]: s for s in workloads.shapes("qwen-image")}
    text = workloads.QWEN_TEXT_TOKENS
    assert [s["sq"] for s in got.values()] == [6032 + text, 6889 + text]
    for s in got.values():
        assert (s["b"], s["h"], s["hkv"], s["d"], s["causal"]) == (1, 24, 24, 128, False)
        assert s["sq"] == s["sk"] and s["dtype"] == "bf16"


def test_qwen_image_takes_a_resolution_as_image_tokens_of_16x16_pixels():
    (s,) = workloads.shapes("qwen-image", "1024x1024")
    assert s["sq"] == 64 * 64 + workloads.QWEN_TEXT_TOKENS
    (s,) = workloads.shapes("qwen-image", (928, 1664))
    assert s["sq"] == 6032 + workloads.QWEN_TEXT_TOKENS


def test_sd15_has_head_dims_40_80_160_with_self_and_77_token_cross_attention():
    got = workloads.shapes("sd15")
    assert sorted({s["d"] for s in got}) == [40, 80, 160]
    self_attn = [s for s in got if "self" in s["name"]]
    cross = [s for s in got if "cross" in s["name"]]
    assert [s["sq"] for s in self_attn] == [4096, 1024, 256]
    assert all(s["sk"] == 77 and s["h"] == 8 for s in cross)
    big = workloads.shapes("sd15", "1024x1024")
    assert big[0]["sq"] == 16384


def test_sdxl_is_head_dim_64_with_10_and_20_heads():
    got = workloads.shapes("sdxl")
    assert {s["d"] for s in got} == {64}
    assert [(s["h"], s["sq"]) for s in got if "self" in s["name"]] == [(10, 4096), (20, 1024)]


def test_the_llm_workload_is_causal_gqa():
    for s in workloads.shapes("llm"):
        assert s["causal"] and s["h"] > s["hkv"] and s["h"] % s["hkv"] == 0 and s["d"] == 128


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_every_workload_gives_contract_shapes_and_cites_upstream_sources(name):
    for s in workloads.shapes(name):
        assert set(s) == CONTRACT_SHAPE and s["family"] == "workload"
    wl = workloads.WORKLOADS[name]
    assert wl.sources and all("https://" in src for src in wl.sources)
    assert not any("shared" in src for src in wl.sources)


@pytest.mark.parametrize(
    ("name", "resolution", "custom", "words"),
    [
        ("llm", "512x512", None, "not llm"),
        ("qwen-image", "1000x1000", None, "multiples of 16"),
        ("sd15", "500x512", None, "multiples of 8"),
        ("sdxl", "big", None, "WIDTHxHEIGHT"),
        ("custom", None, None, "needs --shape"),
        ("custom", "512x512", "1,2,2,8,8,64", "custom takes --shape"),
        ("sd15", None, "1,2,2,8,8,64", "--shape is for --workload custom"),
        ("custom", None, "1,2,2,8,8", "b,h,hkv,sq,sk,d"),
        ("custom", None, "1,3,2,8,8,64", "multiple of hkv"),
        ("custom", None, "1,2,2,8,0,64", "at least 1"),
        ("custom", None, "1,2,2,8,8,64,maybe", "causal is"),
        ("nonesuch", None, None, "unknown workload"),
    ],
)
def test_a_shape_the_workload_cannot_take_is_one_sentence(name, resolution, custom, words):
    with pytest.raises(workloads.WorkloadError) as err:
        workloads.shapes(name, resolution, custom=custom)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_custom_shape_is_parsed_with_its_causal_flag():
    (s,) = workloads.shapes("custom", custom="2,16,4,100,300,96,1", dtype="fp16")
    assert (s["b"], s["h"], s["hkv"], s["sq"], s["sk"], s["d"], s["causal"], s["dtype"]) == (
        2, 16, 4, 100, 300, 96, True, "fp16",
    )  # fmt: skip


@pytest.mark.parametrize("name", list(workloads.WORKLOADS))
def test_tiny_keeps_head_dim_causality_gqa_and_cross_attention(name):
    for s in workloads.shapes(name):
        t = workloads.tiny(s)
        assert (t["d"], t["causal"], t["dtype"]) == (s["d"], s["causal"], s["dtype"])
        assert t["b"] == 1 and max(t["sq"], t["sk"]) <= workloads.TINY_SEQ
        assert (t["h"] != t["hkv"]) == (s["h"] != s["hkv"]) and t["h"] % t["hkv"] == 0
        assert (t["sq"] != t["sk"]) == (s["sq"] != s["sk"])


def test_flops_follow_flash_attentions_rule():
    s = workloads.shape("x", 2, 4, 4, 128, 128, 64, True, "bf16")
    assert workloads.flops(s) == 4 * 2 * 128 * 128 * 4 * 64 / 2
    assert workloads.flops(s, "fwd_bwd") == 3.5 * workloads.flops(s)


# --- the parent's pure parts --------------------------------------------------------------------


def test_backends_are_chosen_by_name_list_or_all_in_table_order():
    assert stress.select_backends(None) == list(stress.BACKENDS)
    assert stress.select_backends(["kernels,sdpa.math", "sdpa.math"]) == ["sdpa.math", "kernels"]
    with pytest.raises(ValueError, match="unknown backend 'sdpa.fast'"):
        stress.select_backends(["sdpa.fast"])


PROGRESS = [
    "setup sdpa.math on cpu",
    "setup s1: inputs and fp32 reference",
    "iter 1 s1",
    "iter 1 s2",
    "done 1 2.0",
    "iter 2 s1",
    "iter 2 s2",
    "done 2 4.0",
    "iter 3 s1",
]


def test_a_crash_is_placed_at_the_iteration_the_progress_file_was_in():
    rec = stress.run_record(
        "kernels", 10, False, Outcome(-11, False, None, "boom\n"), stress.read_progress(PROGRESS)
    )
    assert rec["status"] == "crash" and rec["iters_completed"] == 2 and rec["ms_per_iter"] == 3.0
    assert rec["first_failure"]["iteration"] == 3 and rec["first_failure"]["kind"] == "crash"
    assert "SIGSEGV during iteration 3 (s1)" in rec["first_failure"]["message"]
    assert set(rec) == CONTRACT_RUN


def test_a_hang_is_a_timeout_at_its_iteration():
    rec = stress.run_record(
        "sdpa.flash", 10, True, Outcome(None, True, None, ""), stress.read_progress(PROGRESS), 7
    )
    assert rec["status"] == "timeout" and rec["first_failure"]["kind"] == "timeout"
    assert rec["first_failure"]["iteration"] == 3 and rec["serialize"] is True
    assert "no progress for 7 s during iteration 3 (s1)" in rec["message"]


def test_a_crash_in_set_up_is_iteration_0():
    rec = stress.run_record(
        "kernels", 5, False, Outcome(-6, False, None, ""), stress.read_progress(PROGRESS[:2])
    )
    assert rec["first_failure"]["iteration"] == 0 and rec["iters_completed"] == 0
    assert "set-up: s1: inputs and fp32 reference" in rec["message"]


def test_the_childs_own_result_is_used_when_it_exited_cleanly():
    payload = {"status": "fail", "iters_completed": 4, "ms_per_iter": 1.5, "message": "m",
               "first_failure": {"iteration": 5, "kind": "nan", "message": "x"}}  # fmt: skip
    rec = stress.run_record("sdpa.math", 9, False, Outcome(0, False, payload), stress.Progress())
    assert rec["status"] == "fail" and rec["iters_completed"] == 4
    assert rec["first_failure"]["kind"] == "nan"
    bad = stress.run_record(
        "sdpa.math", 9, False, Outcome(0, False, {"status": "great"}), stress.Progress()
    )
    assert bad["status"] == "crash"


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        (["pass", "unsupported"], 0),
        (["pass", "fail"], 1),
        (["pass", "crash"], 1),
        (["timeout"], 1),
        (["unsupported", "unsupported"], 1),  # nothing was stressed
    ],
)
def test_exit_status(statuses, code):
    assert stress.exit_status([{"status": s} for s in statuses]) == code


def test_serialize_sets_both_launch_blocking_variables(monkeypatch):
    monkeypatch.delenv("AMD_SERIALIZE_KERNEL", raising=False)
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    env = stress._child_env(True)
    assert env["AMD_SERIALIZE_KERNEL"] == "3" and env["CUDA_LAUNCH_BLOCKING"] == "1"
    assert "AMD_SERIALIZE_KERNEL" not in stress._child_env(False)


def test_planted_faults_are_parsed_per_backend():
    assert parse_faults("segfault@3, nan@5:sdpa.math", "kernels") == {3: "segfault"}
    assert parse_faults("segfault@3,nan@5:sdpa.math", "sdpa.math") == {3: "segfault", 5: "nan"}
    with pytest.raises(ValueError, match="KIND@ITERATION"):
        parse_faults("explode@3", "kernels")
    assert "hang" in FAULT_KINDS and "segfault" in FAULT_KINDS


def test_the_hugging_face_cache_follows_hf_hub_cache_then_hf_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert stress.hub_cache() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub2"))
    assert stress.hub_cache() == tmp_path / "hub2"
    assert stress.cached_snapshot("Qwen/Qwen-Image", tmp_path / "hub2") is None
    snap = tmp_path / "hub2/models--Qwen--Qwen-Image/snapshots/abc"
    snap.mkdir(parents=True)
    assert stress.cached_snapshot("Qwen/Qwen-Image", tmp_path / "hub2") is None  # incomplete
    (snap / "model_index.json").write_text("{}")
    assert stress.cached_snapshot("Qwen/Qwen-Image", tmp_path / "hub2") == snap


# --- the command, in this process (usage errors never start a child) ---------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--workload", "llm", "--resolution", "512x512"], "not llm"),
        (["--workload", "custom"], "needs --shape"),
        (["--workload", "custom", "--shape", "1,2"], "b,h,hkv,sq,sk,d"),
        (["--backend", "sdpa.fast"], "unknown backend"),
        (["--pipeline", "qwen-image", "--tiny"], "leave out"),
    ],
)
def test_usage_errors_are_one_sentence_and_exit_2(argv, words, capsys):
    assert cli.main(["stress", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_pipeline_without_weights_says_how_to_get_them_and_exits_2(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert cli.main(["stress", "--pipeline", "qwen-image"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "hf download Qwen/Qwen-Image" in err and str(tmp_path / "hub") in err
    if importlib.util.find_spec("diffusers") is None:
        assert "diffusers is not installed" in err


def test_every_option_has_help():
    import argparse

    parser = argparse.ArgumentParser()
    stress.add_arguments(parser)
    for action in parser._actions:
        assert action.help, action.dest


# --- real runs on CPU torch at --tiny shapes -----------------------------------------------------


def _stress(run_validate, tmp_path: Path, *args: str, fault: str | None = None, timeout=240):
    out = tmp_path / "stress.json"
    env = {"VALIDATE_STRESS_FAULT": fault} if fault else {}
    proc = run_validate("stress", "--tiny", "--json", str(out), *args, env=env, timeout=timeout)
    doc = json.loads(out.read_text()) if out.exists() else None
    return proc, doc


@pytest.mark.slow
def test_a_tiny_run_passes_and_writes_the_contract_document(run_validate, tmp_path):
    proc, doc = _stress(
        run_validate, tmp_path, "--workload", "sdxl", "--backend", "sdpa.math,sdpa.default",
        "--iters", "3", "--check-every", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["kind"] == "attnforge.stress" and doc["version"] == 1 and doc["workload"] == "sdxl"
    assert set(doc["env"]) == {"torch", "triton", "device", "arch", "hip", "cuda"}
    assert doc["env"]["device"] == "cpu" and doc["resolution"] is None
    assert [s["d"] for s in doc["shapes"]] == [64] * 4 and all(
        s["name"].endswith("-tiny") for s in doc["shapes"]
    )
    # In the contract's order (contract/names.py), whatever order --backend named them in.
    assert [r["backend"] for r in doc["runs"]] == ["sdpa.math", "sdpa.default"]
    for r in doc["runs"]:
        assert CONTRACT_RUN <= set(r)
        assert r["status"] == "pass" and r["iters_completed"] == 3 and r["first_failure"] is None
        assert r["ms_per_iter"] > 0
    assert "sdpa.math" in proc.stdout and "stress: PASS" in proc.stdout


# Three runs of three backends, each backend with its own planted fault (VALIDATE_STRESS_FAULT
# takes KIND@ITERATION:BACKEND); each backend runs in a child of its own, so a fault stays in its
# backend's run. Per group: the run's extra args, then (fault, status, kind, failing iteration)
# for sdpa.math, sdpa.flash and sdpa.default.
PLANTED_BACKENDS = ("sdpa.math", "sdpa.flash", "sdpa.default")
PLANTED_GROUPS = [
    ([], [("segfault@3", "crash", "crash", 3), ("abort@2", "crash", "crash", 2),
          ("exit@2", "crash", "crash", 2)]),
    ([], [("devicefault@2", "crash", "crash", 2), ("error@2", "fail", "error", 2),
          ("nan@2", "fail", "nan", 2)]),
    (["--check-every", "2", "--timeout", "5"], [("inf@1", "fail", "inf", 1),
     ("mismatch@4", "fail", "mismatch", 4), ("hang@2", "timeout", "timeout", 2)]),
]  # fmt: skip
PLANTED = [
    (group, backend, *row)
    for group, (_, rows) in enumerate(PLANTED_GROUPS)
    for backend, row in zip(PLANTED_BACKENDS, rows, strict=True)
]


@pytest.fixture(scope="module")
def planted_runs(run_validate, tmp_path_factory):
    """Each group's run, started when a test first asks for it: {group: (process, document)}."""
    done = {}

    def get(group):
        if group not in done:
            extra, rows = PLANTED_GROUPS[group]
            fault = ",".join(
                f"{row[0]}:{backend}" for backend, row in zip(PLANTED_BACKENDS, rows, strict=True)
            )
            done[group] = _stress(
                run_validate, tmp_path_factory.mktemp(f"planted{group}"), "--workload", "llm",
                "--backend", ",".join(PLANTED_BACKENDS), "--iters", "5", *extra, fault=fault,
            )  # fmt: skip
        return done[group]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(
    ("group", "backend", "fault", "status", "kind", "iteration"),
    PLANTED,
    ids=[f"{row[2]}-{row[1]}" for row in PLANTED],
)
def test_a_planted_fault_is_reported_with_its_kind_and_iteration(
    planted_runs, group, backend, fault, status, kind, iteration
):
    proc, doc = planted_runs(group)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout
    (run,) = [r for r in doc["runs"] if r["backend"] == backend]
    assert run["status"] == status, run
    assert run["first_failure"]["kind"] == kind
    assert run["first_failure"]["iteration"] == iteration
    assert run["iters_completed"] == iteration - 1
    [row] = [line for line in proc.stdout.splitlines() if line.startswith(f"{backend} ")]
    assert f"iter {iteration} {kind}" in row


@pytest.mark.slow
def test_a_mismatch_between_reference_checks_goes_unseen_until_the_next_one(run_validate, tmp_path):
    """The cost of --check-every: a wrong result at iteration 3 alone is not compared (NaN/Inf
    would be, every iteration)."""
    proc, doc = _stress(
        run_validate, tmp_path, "--workload", "llm", "--backend", "sdpa.math", "--iters", "5",
        "--check-every", "4", fault="mismatch@3",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert doc["runs"][0]["status"] == "pass"


@pytest.mark.slow
def test_a_crash_in_one_backend_leaves_the_others_running(run_validate, tmp_path):
    proc, doc = _stress(
        run_validate, tmp_path, "--workload", "sd15", "--backend", "sdpa.math,sdpa.default",
        "--iters", "3", fault="segfault@2:sdpa.default",
    )  # fmt: skip
    assert proc.returncode == 1
    by = {r["backend"]: r for r in doc["runs"]}
    assert by["sdpa.default"]["status"] == "crash" and by["sdpa.default"]["iters_completed"] == 1
    assert "SIGSEGV" in by["sdpa.default"]["first_failure"]["message"]
    assert by["sdpa.math"]["status"] == "pass" and by["sdpa.math"]["iters_completed"] == 3


FLASH_ATTN_HERE = importlib.util.find_spec("flash_attn") is not None


@pytest.fixture(scope="module")
def unsupported_run(run_validate, tmp_path_factory):
    """One run of the backends this machine cannot run (flash_attn too where it is missing).
    Without --tiny nothing is computed before the reason is known; no GPU on this machine."""
    out = tmp_path_factory.mktemp("unsupported") / "s.json"
    backends = "sdpa.efficient,sdpa.cudnn,kernels" + ("" if FLASH_ATTN_HERE else ",flash_attn")
    proc = run_validate(
        "stress", "--workload", "llm", "--backend", backends, "--iters", "2", "--json", str(out),
    )  # fmt: skip
    doc = json.loads(out.read_text())
    if doc["env"]["device"] != "cpu":
        pytest.skip("a GPU is present: these backends may run")
    return proc, {r["backend"]: r for r in doc["runs"]}


@pytest.mark.slow
def test_backends_that_cannot_run_here_are_unsupported_with_the_reason(unsupported_run):
    proc, by = unsupported_run
    assert proc.returncode == 1, proc.stdout + proc.stderr  # nothing ran: exit 1
    assert {r["status"] for r in by.values()} == {"unsupported"}
    assert "no CPU kernel" in by["sdpa.efficient"]["message"]
    assert "--tiny" in by["kernels"]["message"]


@pytest.mark.slow
@pytest.mark.skipif(FLASH_ATTN_HERE, reason="flash_attn is here")
def test_flash_attn_missing_is_unsupported(unsupported_run):
    run = unsupported_run[1]["flash_attn"]
    assert run["status"] == "unsupported"
    assert run["message"] == "flash_attn is not installed"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_bundled_kernels_and_the_shim_run_in_the_interpreter_at_tiny_shapes(
    run_validate, tmp_path
):
    proc, doc = _stress(
        run_validate, tmp_path, "--workload", "llm", "--backend", "kernels,kernels.sdpa_shim",
        "--iters", "1", timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by = {r["backend"]: r for r in doc["runs"]}
    assert by["kernels"]["status"] == "pass" and by["kernels.sdpa_shim"]["status"] == "pass"
    # both tiny llm shapes, once each (the one iteration is checked against the fp32 reference),
    # through the shim and not SDPA's own kernels
    assert "shim routed 2 call(s), fell back 0" in by["kernels.sdpa_shim"]["message"]
