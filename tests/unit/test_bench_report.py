"""tools/bench_report.py: the tables and plots of docs/benchmarks.md, made from the JSON that
`python -m attnforge_kernels.bench --json FILE` writes.

The fixtures are written by attnforge_kernels.bench itself, run as
`python -m attnforge_kernels.bench` with its timer replaced by a script of known times and its CUDA
tensors by meta tensors (no GPU, no memory), so they have exactly the schema the GPU run writes and
cannot drift from it."""

from __future__ import annotations

import importlib.util
import json
import runpy
import shutil
import sys
import warnings

import pytest

from tests.conftest import REPO

REFUSED = None  # a scripted call that raises, as SDPA's refusal of a shape does
TRITON = 'triton={"gluon_fwd": false, "gluon_bwd": false}'


def _tool():
    spec = importlib.util.spec_from_file_location(
        "bench_report", REPO / "tools" / "bench_report.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench_report = _tool()


def run_bench(monkeypatch, tmp_path, argv: list[str], script: list) -> dict:
    """`python -m attnforge_kernels.bench ARGV --json FILE` on meta tensors, do_bench answering from
    ``script`` in call order (cycled; REFUSED raises); the JSON it wrote."""
    import torch
    import triton.testing

    real_randn = torch.randn
    monkeypatch.setattr(
        torch, "randn", lambda *a, device=None, **k: real_randn(*a, device="meta", **k)
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Test GPU 141GB")
    calls = iter(range(10**6))

    def do_bench(fn, **kwargs):
        ms = script[next(calls) % len(script)]
        if ms is REFUSED:
            raise RuntimeError("No available kernel. Aborting execution.")
        return ms

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    out = tmp_path / f"bench-{len(list(tmp_path.iterdir()))}.json"
    monkeypatch.setattr(
        sys, "argv", ["python -m attnforge_kernels.bench", *argv, "--json", str(out)]
    )
    with warnings.catch_warnings(), pytest.raises(SystemExit) as done:
        warnings.simplefilter("ignore", RuntimeWarning)  # the bench module may be imported already
        runpy.run_module("attnforge_kernels.bench", run_name="__main__")
    assert done.value.code == 0
    return json.loads(out.read_text())


# per workload row: ours, ours[triton], SDPA-flash, SDPA-cuDNN (ms); the rows alternate fwd and
# fwd+bwd, so every forward cell is 1.5 / 1.0 = 1.50 and every fwd+bwd cell 1.0 / 2.0 = 0.50
WORKLOAD_SCRIPT = [1.0, 1.25, 1.5, 0.8, 2.0, 2.0, 1.0, 0.5]
# per decode row: ours, SDPA-flash, SDPA-efficient (refuses GQA), SDPA-cuDNN (ms)
DECODE_SCRIPT = [0.020, 0.030, REFUSED, 0.025, 0.050, 0.040, REFUSED, 0.045]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    folder = tmp_path_factory.mktemp("bench-json")
    try:
        docs = {
            "workloads": run_bench(
                mp, folder, ["--workloads", "--variant", TRITON], WORKLOAD_SCRIPT
            ),
            "decode": run_bench(
                mp,
                folder,
                ["--decode", "--batches", "1,8", "--caches", "4096,16384"],
                DECODE_SCRIPT,
            ),  # fmt: skip
            "sweep": run_bench(mp, folder, ["--quick"], [0.5, 1.0, 0.4]),
        }
    finally:
        mp.undo()
    return docs


def between(page: str, name: str) -> str:
    start, end = f"<!-- bench_report:{name} -->\n", f"\n<!-- /bench_report:{name} -->"
    return page[page.index(start) + len(start) : page.index(end)]


def write(tmp_path, docs: dict) -> list:
    paths = []
    for name, doc in docs.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    return paths


def test_the_workload_tables_give_each_ours_path_over_sdpa_flash_per_shape_mode_and_layout(
    fixtures,
):
    doc = {**fixtures["workloads"], "_date": "2026-12-04", "_file": "workloads.json"}
    text = bench_report.workload_tables(doc)
    shapes = list(dict.fromkeys(r["name"] for r in doc["workload_rows"]))
    assert len(shapes) == 14
    assert "*2026-12-04, Test GPU 141GB, torch " in text
    assert "| shape | fwd bshd | fwd bhsd | fwd+bwd bshd | fwd+bwd bhsd |" in text
    # ours: 1.5 ms for SDPA-flash's 1.0 forward and 1.0 for 2.0 fwd+bwd, per the script
    assert f"| {shapes[0]} | **1.50** | **1.50** | 0.50 | 0.50 |" in text
    assert "ours / SDPA-flash (TFLOP/s over TFLOP/s; bold: at or above 1.00; fwd: 28 of 28, " \
        "fwd+bwd: 0 of 28 at or above)" in text  # fmt: skip
    assert f"| {shapes[-1]} | **1.20** | **1.20** | 0.50 | 0.50 |" in text  # ours[triton]
    assert "ours[triton] / SDPA-flash" in text and "ours / SDPA-cuDNN" in text
    assert f"| {shapes[0]} | 0.80 | 0.80 | 0.25 | 0.25 |" in text  # over cuDNN
    assert "ours[triton] / SDPA-cuDNN" in text  # what AMD GPUs run, against cuDNN too


def test_the_workload_tables_give_the_all_triton_path_and_cudnn_as_shares_of_the_dense_peak(
    fixtures,
):
    doc = {**fixtures["workloads"], "_date": "2026-12-04", "_file": "workloads.json"}
    unknown = bench_report.workload_tables(doc)
    assert "No dense 16-bit peak is known for Test GPU 141GB" in unknown
    assert "% of the dense" not in unknown
    h200 = bench_report.workload_tables({**doc, "device": "NVIDIA H200"})
    given = bench_report.workload_tables({**doc, "_peak": 989.4})  # --peak 989.4
    assert (
        h200.replace("NVIDIA H200", "Test GPU 141GB").split("\n", 1)[1] == given.split("\n", 1)[1]
    )
    first = doc["workload_rows"][0]  # the first shape's forward, bshd
    for provider in ("ours[triton]", "sdpa-cudnn"):
        title = f"{bench_report.label(provider)} as % of the dense 16-bit peak (989.4 TFLOP/s, "
        section = given[given.index(title) :]
        row = next(line for line in section.splitlines() if line.startswith(f"| {first['name']} |"))
        assert row.split(" | ")[1] == f"{100 * first['tflops'][provider] / 989.4:.0f}"
    assert bench_report.dense_peak("NVIDIA H100 PCIe") == 756.5  # before the SXM name's match
    assert bench_report.dense_peak("NVIDIA H100 80GB HBM3") == 989.4
    assert bench_report.dense_peak("AMD Instinct MI300X") == 1307.4


def test_a_peak_that_is_not_positive_is_refused_and_nothing_is_written(fixtures, tmp_path, capsys):
    files = write(tmp_path, {"workloads": fixtures["workloads"]})
    out = tmp_path / "out"
    assert bench_report.main([*map(str, files), "--out", str(out), "--peak", "0"]) == 2
    assert "--peak 0: expected a positive TFLOP/s figure." in capsys.readouterr().err
    assert not out.exists()


def test_the_decode_table_names_the_best_sdpa_backend_and_leaves_a_refusing_one_out(fixtures):
    doc = {**fixtures["decode"], "_date": "2026-12-04", "_file": "decode.json"}
    text = bench_report.decode_tables(doc)
    assert "SDPA-efficient µs" in text
    assert "| 1 | 4096 | 20.0 | 30.0 | n/a | 25.0 | SDPA-cuDNN | **1.25** |" in text
    assert "| 1 | 16384 | 50.0 | 40.0 | n/a | 45.0 | SDPA-flash | 0.80 |" in text
    assert "GQA 32/8, d=128" in text and "host time included" in text
    assert "2 of 4 rows" in text


def test_the_sweep_table_gives_tflops_and_both_ratios_and_reports_a_failed_memory_probe(fixtures):
    doc = {**fixtures["sweep"], "_date": "2026-12-04", "_file": "bench.json"}
    text = bench_report.sweep_tables(doc)
    # ours 0.5 ms, SDPA-flash 1.0, SDPA-cuDNN 0.4: 2.00 and 0.80
    assert "| (4, 16, 4096, 128) | no | fwd | " in text
    assert text.count("| **2.00** | 0.80 |") == 4
    assert (
        "At (4, 16, 4096, 128), not causal, ours over SDPA-flash: fwd 2.00x, fwd+bwd 2.00x." in text
    )
    assert "error" in text  # the memory probe cannot run on meta tensors: said, not dropped


def test_the_command_writes_tables_and_plots_into_the_folder_and_fills_the_page(fixtures, tmp_path):
    files = write(tmp_path, {"workloads": fixtures["workloads"], "decode": fixtures["decode"],
                             "decode-gpu": {**fixtures["decode"], "gpu_time": True}})  # fmt: skip
    page = tmp_path / "benchmarks.md"
    shutil.copy(REPO / "docs" / "benchmarks.md", page)
    before = page.read_text()
    out = tmp_path / "out"
    assert bench_report.main([*map(str, files), "--out", str(out), "--page", str(page),
                              "--date", "2026-12-04"]) == 0  # fmt: skip
    for name in ("workloads", "decode", "decode-gpu"):
        png = (out / f"{name}.png").read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
        block = between(page.read_text(), name).splitlines()
        assert block[0].startswith("*2026-12-04, Test GPU 141GB") and any("| batch |" in line for line in block) \
            or name == "workloads"  # fmt: skip
        assert f"![{name}: the table below as a plot](out/{name}.png)" in block
        written = (out / f"{name}.md").read_text().splitlines()
        assert f"![{name}: the table below as a plot]({name}.png)" in written
        tables = [line for line in block if not line.startswith("![")]
        assert [line for line in written if not line.startswith("![")][: len(tables)] == tables
    assert (
        "| shape | layout | mode | ours | ours[triton] | SDPA-flash | SDPA-cuDNN |"
        in (out / "workloads.md").read_text()
    )
    after = page.read_text()
    outside = bench_report.splice(after, {n: "" for n in ("workloads", "decode", "decode-gpu")}, "")
    assert outside == bench_report.splice(
        before, {n: "" for n in ("workloads", "decode", "decode-gpu")}, ""
    )


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "cannot read it as JSON"),
        ('{"rows_of_something": []}', "not the JSON of `python -m attnforge_kernels.bench --json`"),
    ],
)
def test_a_bad_input_file_is_named_and_nothing_is_written(tmp_path, capsys, content, said):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "out"
    assert bench_report.main([str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and said in err
    assert not out.exists()


def test_a_page_without_the_block_is_refused_and_left_as_it_was(fixtures, tmp_path, capsys):
    (files,) = [write(tmp_path, {"decode": fixtures["decode"]})]
    page = tmp_path / "page.md"
    page.write_text("# Benchmarks\n\nno blocks here\n")
    out = tmp_path / "out"
    assert bench_report.main([*map(str, files), "--out", str(out), "--page", str(page)]) == 2
    assert "no `<!-- bench_report:decode -->`" in capsys.readouterr().err
    assert page.read_text() == "# Benchmarks\n\nno blocks here\n"
    assert not out.exists()


def test_two_files_of_one_kind_are_refused(fixtures, tmp_path, capsys):
    a, b = write(tmp_path, {"a": fixtures["decode"], "b": fixtures["decode"]})
    assert bench_report.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 2
    assert "a second decode file" in capsys.readouterr().err


def test_the_memory_table_gives_each_peak_in_mib_and_over_sdpa_flash(fixtures):
    doc = {**fixtures["sweep"], "_date": "2026-12-04", "_file": "bench.json"}
    mib = 2**20
    # what a GPU run's probe records in place of the meta run's errors
    peaks = {"ours": 1152, "sdpa-flash": 1540, "sdpa-cudnn": 1284}
    memory = {**doc["memory"]}
    for name, peak in peaks.items():
        assert "error" in memory[name]
        memory[name] = {"inputs_bytes": 512 * mib, "peak_bytes": peak * mib}
    text = bench_report.sweep_tables({**doc, "memory": memory})
    assert "Peak memory, fwd+bwd at (1,16,32768,128) bf16, inputs included:" in text
    assert "| ours | 1152 MiB | 0.75 |" in text and "| SDPA-cuDNN | 1284 MiB | 0.83 |" in text


def test_a_failure_on_the_way_leaves_the_last_tables_plots_and_page_as_they_were(
    fixtures, tmp_path, monkeypatch
):
    files = write(tmp_path, {"workloads": fixtures["workloads"], "decode": fixtures["decode"]})
    out, page = tmp_path / "out", tmp_path / "benchmarks.md"
    shutil.copy(REPO / "docs" / "benchmarks.md", page)
    out.mkdir()
    for name in ("workloads.md", "workloads.png", "decode.md"):
        (out / name).write_text(f"the last good {name}")

    def broken_plot(doc, path):
        raise RuntimeError("the plot failed")

    monkeypatch.setitem(bench_report.PLOTS, "decode", broken_plot)
    before = page.read_text()
    with pytest.raises(RuntimeError, match="the plot failed"):
        bench_report.main([*map(str, files), "--out", str(out), "--page", str(page)])
    assert page.read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["decode.md", "workloads.md", "workloads.png"]
    for p in out.iterdir():
        assert p.read_text() == f"the last good {p.name}"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# per workload row with --rounds 3: ours, ours[triton], SDPA-flash, SDPA-cuDNN in turn, three
# times; cuDNN refuses in the second round and is not timed in the third (11 calls a row)
ROUNDS_SCRIPT = [2.0, 2.0, 2.0, 2.0, 1.0, 3.0, 1.5, REFUSED, 1.5, 1.0, 4.0]


def test_with_rounds_each_provider_is_timed_in_turn_and_keeps_its_fastest_round(
    tmp_path, monkeypatch
):
    argv = ["--workloads", "--layout", "bshd", "--mode", "fwd", "--variant", TRITON]
    doc = run_bench(monkeypatch, tmp_path, [*argv, "--rounds", "3"], ROUNDS_SCRIPT)
    assert doc["rounds"] == 3 and len(doc["workload_rows"]) == 14
    for row in doc["workload_rows"]:  # the script's order holds only if the turns interleave
        assert row["ms"] == {
            "ours": 1.0,
            "ours[triton]": 1.0,
            "sdpa-flash": 1.5,
            "sdpa-cudnn": None,
        }
        assert row["ms_rounds"] == {"ours": [2.0, 1.0, 1.5], "ours[triton]": [2.0, 3.0, 1.0],
                                    "sdpa-flash": [2.0, 1.5, 4.0], "sdpa-cudnn": [2.0]}  # fmt: skip
        assert "No available kernel" in row["errors"]["sdpa-cudnn"]
    text = bench_report.workload_tables({**doc, "_date": "2026-12-07", "_file": "w.json"})
    assert "each time the best of 3 rounds, every provider in turn; from `w.json`" in text
    once = run_bench(monkeypatch, tmp_path, argv, [1.0, 1.25, 1.5, 0.8])
    assert once["rounds"] == 1 and "ms_rounds" not in once["workload_rows"][0]
    assert once["workload_rows"][0]["ms"]["ours[triton]"] == 1.25
    assert "best of" not in bench_report.workload_tables({**once, "_date": "d", "_file": "f"})


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--rounds", "0"], "--rounds: 1 or more"),
        (["--host", "--rounds", "2"], "--rounds times the sweep, --workloads and --decode"),
        (["--dispatch", "--rounds", "3"], "--rounds times the sweep, --workloads and --decode"),
    ],
)
def test_bad_rounds_are_refused_before_anything_runs(argv, said, capsys):
    from attnforge_kernels.tools import benchmark

    with pytest.raises(SystemExit) as done:
        benchmark.main(argv)
    assert done.value.code == 2 and said in capsys.readouterr().err
