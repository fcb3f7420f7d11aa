"""The baseline gate, as specifications: rows from two bench documents (medians, ratios, verdicts),
gates from recipes and text, the kept baseline (written aside, never lost), published snapshots
and how --baseline finds one. Pure code and files under tmp_path only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from attnforge.baseline import gate as bl
from attnforge.baseline import store
from attnforge.bisection import search as bs
from attnforge.errors import RecipeError, UserError
from attnforge.recipes import load_recipes

SHAPE_A = "sweep-b1-h1-s64-d128-fp16"
SHAPE_B = "sweep-b2-h2-s32-d64-fp16"


def result(backend, shape, mode, ms_all=None, status="ok", message=""):
    return {
        "backend": backend,
        "shape": {"name": shape, "family": "sweep", "b": 1, "h": 1, "hkv": 1, "sq": 64,
                  "sk": 64, "d": 128, "causal": False, "dtype": "fp16"},
        "mode": mode, "status": status,
        "ms": sorted(ms_all)[len(ms_all) // 2] if ms_all else None,
        "ms_all": list(ms_all or []), "tflops": None, "peak_mem_mb": None, "message": message,
    }  # fmt: skip


def bench(*results, size="tiny", device="cpu", torch="2.13.0+cpu"):
    return {"kind": "attnforge.bench", "version": 1, "created": "2026-11-24T00:00:00Z",
            "env": {"torch": torch, "triton": "3.6.0", "device": device, "arch": None,
                    "hip": None, "cuda": None},
            "size": size, "warmup": 1, "repeats": 3, "results": list(results)}  # fmt: skip


KERNELS = bl.Gate("kernels")  # every shape and mode, the default threshold


# ---------------------------------------------------------------------------- one row


@pytest.mark.parametrize(
    ("why", "base", "now", "gates", "verdict", "ratio", "words"),
    [
        ("faster now: passes its gate", [2.0, 2.0, 2.0], [1.0, 1.0, 1.0], [KERNELS], "pass", 2.0, ""),
        ("at exactly the threshold: passes", [0.9, 0.9, 0.9], [1.0, 1.0, 1.0], [KERNELS], "pass",
         0.9, ""),
        ("slower than the threshold: fails, naming the ratio and the threshold", [1.0] * 3,
         [2.0] * 3, [KERNELS], "fail", 0.5, "0.50x the baseline's speed (1 ms -> 2 ms, medians), "
         "below the gate's 0.9x"),
        ("one noisy repeat moves nothing: medians", [1.0, 1.0, 50.0], [1.0, 60.0, 1.0], [KERNELS],
         "pass", 1.0, ""),
        ("a gate's own threshold wins over the default", [1.0] * 3, [1.5] * 3,
         [bl.Gate("kernels", min_ratio=0.5)], "pass", 1 / 1.5, ""),
        ("no gate matches: shown, never failing", [1.0] * 3, [10.0] * 3,
         [bl.Gate("sdpa.*")], "ungated", 0.1, ""),
        ("a gate for another mode does not apply", [1.0] * 3, [10.0] * 3,
         [bl.Gate("kernels", mode="bwd")], "ungated", 0.1, ""),
    ],
)  # fmt: skip
def test_a_row_timed_on_both_sides(why, base, now, gates, verdict, ratio, words):
    (row,) = bl.compare_rows(
        bench(result("kernels", SHAPE_A, "fwd", base)), bench(result("kernels", SHAPE_A, "fwd", now)),
        gates,
    )  # fmt: skip
    assert row["verdict"] == verdict, why
    assert row["ratio"] == pytest.approx(ratio)
    assert words in row["message"]
    assert row["gated"] == (verdict in ("pass", "fail"))
    assert (row["baseline_repeats"], row["now_repeats"]) == (len(base), len(now))


@pytest.mark.parametrize(
    ("why", "base", "now", "gated", "verdict", "words"),
    [
        ("new in this run", None, "ok", True, "no-baseline", "not in the baseline"),
        ("refused in the baseline", "unsupported", "ok", True, "no-baseline",
         "baseline: unsupported: flash_attn does not import"),
        ("not benched this run (fewer backends asked for)", "ok", None, True, "not-run",
         "not in this run"),
        ("ran in the baseline, refused now, gated: worse than slow", "ok", "unsupported", True,
         "fail", "ran in the baseline (1 ms), now unsupported: flash_attn does not import"),
        ("ran in the baseline, crashed now, gated", "ok", "crash", True, "fail", "now crash"),
        ("ran in the baseline, refused now, ungated", "ok", "unsupported", False, "not-run",
         "now unsupported"),
        ("refused on both sides", "unsupported", "unsupported", True, "not-run",
         "now unsupported: flash_attn does not import; baseline unsupported"),
    ],
)  # fmt: skip
def test_missing_or_refused_results_are_verdicts_not_errors(why, base, now, gated, verdict, words):
    def doc(status):
        if status is None:
            return bench()
        ms = [1.0, 1.0, 1.0] if status == "ok" else None
        return bench(result("flash_attn", SHAPE_A, "fwd", ms, status, "flash_attn does not import"))

    gates = [bl.Gate("flash_attn")] if gated else []
    (row,) = bl.compare_rows(doc(base), doc(now), gates)
    assert (row["verdict"], row["ratio"]) == (verdict, None), why
    assert words in row["message"], row["message"]


def test_rows_follow_this_run_then_what_only_the_baseline_has():
    base = bench(
        result("kernels", SHAPE_B, "fwd", [1.0]), result("sdpa.math", SHAPE_A, "fwd", [1.0])
    )
    now = bench(result("kernels", SHAPE_A, "fwd", [1.0]), result("kernels", SHAPE_B, "fwd", [1.0]))
    rows = bl.compare_rows(base, now, [])
    assert [(r["backend"], r["shape"]) for r in rows] == [
        ("kernels", SHAPE_A), ("kernels", SHAPE_B), ("sdpa.math", SHAPE_A),
    ]  # fmt: skip


def test_the_first_matching_gate_decides():
    gates = [bl.Gate("kernels", shape="*-d128-*", min_ratio=0.5), bl.Gate("kernels", mode="fwd")]
    base = bench(result("kernels", SHAPE_A, "fwd", [1.0]), result("kernels", SHAPE_B, "fwd", [1.0]))
    now = bench(result("kernels", SHAPE_A, "fwd", [1.6]), result("kernels", SHAPE_B, "fwd", [1.6]))
    a, b = bl.compare_rows(base, now, gates, default_min_ratio=0.8)
    assert (a["min_ratio"], a["verdict"]) == (0.5, "pass")  # d128: its own looser gate
    assert (b["min_ratio"], b["verdict"]) == (0.8, "fail")  # d64: the broad gate, the default


# ---------------------------------------------------------------------------- the document


def test_the_document_says_what_failed_where_and_what_it_could_not_compare():
    base = bench(result("kernels", SHAPE_A, "fwd", [1.0] * 3), result("kernels", SHAPE_A, "bwd", [1.0]),
                 size="quick", torch="2.12.0+cpu")  # fmt: skip
    now = bench(
        result("kernels", SHAPE_A, "fwd", [4.0] * 3), result("kernels", SHAPE_A, "bwd", [1.0])
    )
    gates = [bl.Gate("kernels", mode="fwd"), bl.Gate("sdpa.flash")]
    doc = bl.compare(base, now, gates, baseline_source="base/bench.json", created="now")
    assert (doc["kind"], doc["version"], doc["passed"]) == ("attnforge.baseline_compare", 1, False)
    assert doc["failures"] == [
        f"kernels at {SHAPE_A} fwd: 0.25x the baseline's speed (1 ms -> 4 ms, medians), below "
        "the gate's 0.9x"
    ]
    assert doc["counts"] == {"pass": 0, "fail": 1, "ungated": 1, "no-baseline": 0, "not-run": 0}
    assert doc["unmatched_gates"] == ["sdpa.flash * all >= 0.9x"]  # a gate that gated nothing
    assert "torch differs: baseline 2.12.0+cpu, now 2.13.0+cpu" in doc["notes"]
    assert any("a quick bench, this run a tiny one" in n for n in doc["notes"])
    assert doc["gates"][0] == {"backend": "kernels", "shape": "*", "mode": "fwd", "min_ratio": 0.9}
    md = bl.to_markdown(doc)
    assert (
        doc["failures"][0] in md
        and f"| kernels | `{SHAPE_A}` | fwd | 1 | 4 | 0.25x | >= 0.9x | **fail**" in md
    )
    assert bl.headline(doc).startswith("baseline gate: FAIL (1 gated (1 below the threshold)")


def test_nothing_in_common_is_said_not_passed_silently():
    doc = bl.compare(bench(result("kernels", SHAPE_A, "fwd", [1.0])),
                     bench(result("kernels", SHAPE_B, "fwd", [1.0])), [KERNELS])  # fmt: skip
    assert doc["passed"]  # nothing gated was timed on both sides: no failure to report ...
    assert "no result was timed in both runs: nothing could be compared" in doc["notes"]  # ... said


def test_a_long_table_keeps_the_gated_and_the_slowest_rows():
    base = bench(*(result("sdpa.math", f"s{i}", "fwd", [1.0]) for i in range(100)),
                 result("kernels", SHAPE_A, "fwd", [1.0]))  # fmt: skip
    now = bench(*(result("sdpa.math", f"s{i}", "fwd", [1.0 + i / 100]) for i in range(100)),
                result("kernels", SHAPE_A, "fwd", [1.0]))  # fmt: skip
    lines = bl.table_lines(bl.compare(base, now, [KERNELS]), limit=10)
    assert len(lines) == 1 + 10 + 1 and lines[-1].startswith("(91 more ungated rows")
    assert any(line.startswith("kernels") for line in lines)
    assert any(" s99 " in line for line in lines) and not any(" s0 " in line for line in lines)


# ---------------------------------------------------------------------------- gates as text


@pytest.mark.parametrize(
    ("text", "gate"),
    [
        ("kernels", bl.Gate("kernels")),
        ("kernels,mode=fwd", bl.Gate("kernels", mode="fwd")),
        (" sdpa.* , shape=sweep-*-d128-* , min_ratio=0.85 ", bl.Gate("sdpa.*", "sweep-*-d128-*",
                                                                     min_ratio=0.85)),
    ],
)  # fmt: skip
def test_gates_parse(text, gate):
    assert bl.parse_gate(text) == gate


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "expected BACKEND"),
        ("mode=fwd", "expected BACKEND"),
        ("kernels,speed=2", "'speed=2' is not shape=GLOB"),
        ("kernels,mode=sideways", "mode 'sideways' is not one of fwd, bwd, fwd_bwd, all"),
        ("kernels,min_ratio=fast", "min_ratio 'fast' is not a number"),
        ("kernels,min_ratio=0", "min_ratio must be more than 0"),
    ],
)
def test_bad_gates_are_one_sentence(text, words):
    with pytest.raises(bl.BaselineError, match=words):
        bl.parse_gate(text)


# ---------------------------------------------------------------------------- files


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_a_baseline_is_a_bench_file_or_what_lies_beside_a_report(tmp_path):
    doc = bench(result("kernels", SHAPE_A, "fwd", [1.0]))
    path = write(tmp_path / "run" / "bench.json", doc)
    write(tmp_path / "run" / "report.json", {"schema_version": "1.1"})
    for given in (path, tmp_path / "run", tmp_path / "run" / "report.json"):
        assert bl.bench_file(given) == path and bl.load_bench(given) == doc
    renamed = write(tmp_path / "elsewhere" / "mine.json", doc)
    assert bl.load_bench(renamed) == doc
    with pytest.raises(bl.BaselineError, match="no benchmark there"):
        bl.bench_file(tmp_path / "nothing")
    stress = write(tmp_path / "s" / "bench.json", {"kind": "attnforge.stress", "version": 1})
    with pytest.raises(
        bl.BaselineError, match="expected kind 'attnforge.bench' .* kind 'attnforge.stress'"
    ):
        bl.load_bench(stress)


def test_the_command_line_exits_0_pass_1_below_2_usage(tmp_path, capsys):
    base = write(tmp_path / "a.json", bench(result("kernels", SHAPE_A, "fwd", [1.0] * 3)))
    slow = write(tmp_path / "b.json", bench(result("kernels", SHAPE_A, "fwd", [3.0] * 3)))
    assert bl.main([str(base), str(base), "--gate", "kernels"]) == 0
    out_json, out_md = tmp_path / "c.json", tmp_path / "c.md"
    assert bl.main([str(base), str(slow), "--gate", "kernels", "--json", str(out_json),
                    "--md", str(out_md)]) == 1  # fmt: skip
    printed = capsys.readouterr().out
    assert f"below the threshold: kernels at {SHAPE_A} fwd: 0.33x" in printed
    assert json.loads(out_json.read_text())["passed"] is False and out_md.is_file()
    assert bl.main([str(base), str(slow)]) == 0  # no gate: shown, not failing
    assert bl.main([str(base), str(slow), "--gate", "kernels,mode=up"]) == 2
    assert "mode 'up' is not one of" in capsys.readouterr().err


# ---------------------------------------------------------------------------- the kept baseline


def report_folder(tmp_path: Path, ms: float, created: str) -> Path:
    reports = tmp_path / "reports" / "cpu" / "cpu"
    doc = bench(result("kernels", SHAPE_A, "fwd", [ms]))
    doc["created"] = created
    write(reports / "bench.json", doc)
    write(reports / "report.json", {"created": created})
    return reports


def test_keeping_a_baseline_copies_the_report_and_bench_and_replaces_the_last(tmp_path):
    reports = report_folder(tmp_path, 1.0, "first")
    assert store.kept_dir(reports) is None
    kept = store.keep(reports, {"kept": "first"})
    assert kept == reports / "baseline" == store.kept_dir(reports)
    assert sorted(p.name for p in kept.iterdir()) == ["baseline.json", "bench.json", "report.json"]
    report_folder(tmp_path, 2.0, "second")
    store.keep(reports, {"kept": "second"})
    assert json.loads((kept / "bench.json").read_text())["created"] == "second"
    assert sorted(p.name for p in reports.iterdir() if p.name.startswith(".")) == []


def test_a_swap_interrupted_between_its_renames_loses_nothing(tmp_path, monkeypatch):
    reports = report_folder(tmp_path, 1.0, "first")
    store.keep(reports, {})
    report_folder(tmp_path, 2.0, "second")
    real = os.replace
    calls = []

    def dies_on_the_second_rename(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process is gone between old-aside and new-in-place
        real(src, dst)

    monkeypatch.setattr(store.os, "replace", dies_on_the_second_rename)
    with pytest.raises(KeyboardInterrupt):
        store.keep(reports, {})
    monkeypatch.setattr(store.os, "replace", real)
    assert not (reports / "baseline").exists()
    found = store.kept_dir(reports)
    assert found is not None and found.name.startswith(".baseline.old-")
    assert json.loads((found / "bench.json").read_text())["created"] == "first"  # the last one


# ---------------------------------------------------------------------------- published images

FINAL_ID, LAYER_ID = "sha256:" + "f" * 64, "sha256:" + "1" * 64
FINAL_DIGEST, LAYER_DIGEST = "sha256:" + "d" * 64, "sha256:" + "e" * 64


def publish_manifest(documents: dict[str, str]) -> dict:
    return {
        "arch": "cpu", "stack": "cpu", "image_id": FINAL_ID,
        "validation": {"image_id": FINAL_ID, "passed": True, "documents": documents},
        "refs": [
            {"ref": "reg/ns/base:cpu-abc", "digest": LAYER_DIGEST, "image_id": LAYER_ID},
            {"ref": "reg/ns/validate:cpu-def", "digest": FINAL_DIGEST, "image_id": FINAL_ID},
            {"ref": "reg/ns/cpu:cpu", "digest": FINAL_DIGEST, "image_id": FINAL_ID},
        ],
    }  # fmt: skip


def test_a_published_snapshot_keeps_the_validated_documents_only(tmp_path):
    reports = report_folder(tmp_path, 1.0, "validated")
    hashes = {n: store.sha256_file(reports / n) for n in ("report.json", "bench.json")}
    folder = store.snapshot_published(reports, publish_manifest(hashes), FINAL_DIGEST)
    assert folder == reports / "published" / ("d" * 12)
    assert {"publish.json", "report.json", "bench.json"} <= {p.name for p in folder.iterdir()}
    report_folder(tmp_path, 9.0, "a later --local run")  # replaces bench.json, not validated.json
    again = store.snapshot_published(reports, publish_manifest(hashes), FINAL_DIGEST)
    assert not (again / "bench.json").exists()
    assert json.loads((again / "publish.json").read_text())["snapshot_left_out"] == [
        "report.json", "bench.json"]  # fmt: skip


@pytest.mark.parametrize(
    ("spec", "local_id", "registry", "found"),
    [
        (f"reg/ns/cpu@{FINAL_DIGEST}", None, None, True),
        ("reg/ns/cpu:cpu", FINAL_ID, None, True),  # pulled here: its image id
        ("reg/ns/cpu:cpu", None, FINAL_DIGEST, True),  # asked of the registry
        ("reg/ns/base:cpu-abc", LAYER_ID, LAYER_DIGEST, False),  # a lower layer was not published with a report
        (f"reg/ns/cpu@{LAYER_DIGEST}", None, None, False),
    ],
)  # fmt: skip
def test_an_image_finds_the_report_published_with_it(tmp_path, spec, local_id, registry, found):
    reports = report_folder(tmp_path, 1.0, "validated")
    hashes = {"bench.json": store.sha256_file(reports / "bench.json")}
    store.snapshot_published(reports, publish_manifest(hashes), FINAL_DIGEST)
    calls = {"image_id": lambda ref: local_id, "registry_digest": lambda ref: registry}
    if not found:
        with pytest.raises(
            UserError, match=f"--baseline {spec}: no report published with that image"
        ):
            store.resolve(spec, tmp_path / "reports", **calls)
        return
    got = store.resolve(spec, tmp_path / "reports", **calls)
    assert got.folder == reports / "published" / ("d" * 12) and "(published;" in got.source
    assert got.bench["results"][0]["ms_all"] == [1.0]


def test_an_unreachable_registry_is_named_in_the_sentence(tmp_path):
    def no_registry(ref):
        raise RuntimeError("connection refused")

    with pytest.raises(UserError, match=r"no registry answer \(connection refused\)"):
        store.resolve("reg/ns/cpu:cpu", tmp_path, image_id=lambda r: None,
                      registry_digest=no_registry)  # fmt: skip


# ---------------------------------------------------------------------------- recipes and bisect


def test_the_shipped_amd_stacks_gate_the_default_pick_and_the_kernels():
    recipes = load_recipes(Path(__file__).resolve().parents[2])
    gates = recipes.stacks["default"].bench_gates
    assert gates.min_ratio == 0.9
    assert {(g.backend, g.mode) for g in gates.gates} == {
        ("sdpa.default", "fwd"), ("sdpa.default", "fwd_bwd"), ("kernels", "fwd"),
        ("kernels", "fwd_bwd")}  # fmt: skip
    assert recipes.stacks["cpu"].bench_gates is None  # CPU timings are too noisy to gate


@pytest.mark.parametrize(
    ("gate", "words"),
    [
        ("{backend: kernel}", "bench_gates.gates.0.backend: unknown bench backend 'kernel' (valid:"),
        ("{backend: 'cudnn*'}", "backend glob 'cudnn*' matches no bench backend"),
        ("{backend: kernels, speed: 2}", "speed: unknown key (valid: backend, min_ratio, mode, shape)"),
        ("{backend: kernels, mode: sideways}", "mode: input should be 'fwd', 'bwd', 'fwd_bwd' or 'all'"),
        ("{backend: kernels, min_ratio: 0}", "min_ratio: Input should be greater than 0"),
    ],
)  # fmt: skip
def test_bench_gates_in_a_recipe_are_checked_strictly(repo_copy, gate, words):
    stacks = repo_copy / "recipes/stacks.yaml"
    text = stacks.read_text()
    anchor = (
        "      kernels.works: true       # their cases run in Triton's CPU interpreter (no GPU)\n"
    )
    assert anchor in text
    stacks.write_text(
        text.replace(anchor, anchor + f"    bench_gates:\n      gates:\n        - {gate}\n")
    )
    line = 1 + text.split(anchor)[0].count("\n") + 3  # the gate's own line
    with pytest.raises(RecipeError) as info:
        load_recipes(repo_copy)
    assert str(info.value).startswith(f"recipes/stacks.yaml:{line}: stacks.cpu.bench_gates.gates.0")
    assert words in str(info.value)


def test_the_bisect_bench_selector_benches_at_the_baselines_size_and_judges_by_the_gate():
    base = bench(result("kernels", SHAPE_A, "fwd", [1.0] * 3), size="quick")
    spec = bs.parse_check("bench:kernels,mode=fwd,min_ratio=0.8", baseline="b/bench.json",
                          baseline_doc=base, timeout=60)  # fmt: skip
    assert (spec.kind, spec.output, spec.baseline) == ("bench", "bench.json", "b/bench.json")
    assert list(spec.argv) == ["python3", "-m", "validate", "bench", "--json", "/out/bench.json",
                               "--backend", "kernels", "--mode", "fwd", "--quick", "--repeats",
                               "3", "--timeout", "60"]  # fmt: skip
    # a baseline from `validate --quick --bench` on the cpu stack: the one-shape tiny sweep
    tiny = {**bench(result("kernels", SHAPE_A, "fwd", [1.0] * 3), size="tiny"), "quick": True}
    argv = bs.parse_check("bench:kernels", baseline_doc=tiny).argv
    assert argv[argv.index("--tiny") :] == ("--tiny", "--quick", "--repeats", "3")
    slow = bench(result("kernels", SHAPE_A, "fwd", [2.0] * 3))
    same = bench(result("kernels", SHAPE_A, "fwd", [1.1] * 3))
    other = bench(result("kernels", SHAPE_B, "fwd", [1.0] * 3))
    verdict, reason = bs.verdict_of_bench(base, slow, spec.gates)
    assert verdict == bs.BAD and reason.startswith(f"kernels at {SHAPE_A} fwd: 0.50x")
    verdict, reason = bs.verdict_of_bench(base, same, spec.gates)
    assert verdict == bs.GOOD and "slowest 0.91x" in reason
    assert bs.verdict_of_bench(base, other, spec.gates)[0] == bs.SKIP
    rows = bs.report_rows(base, slow)
    assert rows == [(f"kernels {SHAPE_A} fwd", "1 ms", "2 ms")]


# ---------------------------------------------------------------------------- the HTML report


def test_the_html_report_draws_the_comparison_beside_it(tmp_path):
    from validate import render, report

    folder = tmp_path / "reports" / "cpu" / "cpu"
    write(folder / "report.json", {"summary": {"status": "pass"}})
    doc = bl.compare(bench(result("kernels", SHAPE_A, "fwd", [1.0] * 3)),
                     bench(result("kernels", SHAPE_A, "fwd", [2.0] * 3)), [KERNELS],
                     baseline_source="the kept baseline")  # fmt: skip
    write(folder / "baseline-compare.json", doc)
    siblings = report.load_siblings(folder / "report.json")
    assert siblings["baseline_compare"] == doc
    page = render.to_html({"summary": {"status": "pass"}}, siblings)
    section = page.split("<section id='baseline'>", 1)[1].split("</section>", 1)[0]
    assert "Baseline gate: FAIL" in section and "Baseline the kept baseline" in section
    assert f"<li>kernels at {SHAPE_A} fwd: 0.50x the baseline" in section
    assert "<td>0.50×</td><td>≥ 0.9×</td>" in section
    assert "No baseline-compare.json" in render.to_html({"summary": {}}, {})
    write(folder / "baseline-compare.json", bench())
    with pytest.raises(report.ReportError, match="write it again with `invoke validate --bench`"):
        report.load_siblings(folder / "report.json")


def test_bench_backend_reaches_bench_and_bench_train_not_stress():
    from attnforge.cli.validate import bench_backends
    from attnforge.validation import tool_runs

    picked = bench_backends(["kernels, sdpa.default", "kernels"])
    assert picked == ("kernels", "sdpa.default")
    runs = {t.name: t.args for t in tool_runs(True, ["llm"], quick=True, tiny=False, timeout=0,
                                               stress_iters=2, backends=picked)}  # fmt: skip
    for name in ("bench", "bench-train"):
        assert runs[name][-2:] == ["--backend", "kernels,sdpa.default"], name
    assert "--backend" in runs["stress llm"] and "kernels,sdpa.default" not in runs["stress llm"]
    with pytest.raises(UserError, match="--bench-backend kernel: no such backend"):
        bench_backends(["kernel"])
