"""The Hopper dispatch sweep's report (attnforge_kernels/tools/dispatch.py): ratios per length and
the worst default/triton against the target, from rows shaped as run_dispatch records them."""

from attnforge_kernels.tools.dispatch import TARGET, dispatch_table, ratios


def row(d, s, causal, fwd, fwdbwd):
    """fwd / fwdbwd: (default, triton, gluon) milliseconds."""
    ms = {
        m: dict(zip(("default", "triton", "gluon"), t, strict=True))
        for m, t in (("fwd", fwd), ("fwd+bwd", fwdbwd))
    }
    return {"d": d, "s": s, "b": 1, "hq": 16, "hkv": 16, "causal": causal, "ms": ms}


ROWS = [
    row(128, 512, False, (1.0, 1.0, 2.0), (3.0, 3.0, 4.5)),  # short: default = Triton, Gluon slower
    row(128, 512, True, (1.0, 1.0, 1.5), (3.0, 3.0, 3.3)),
    row(128, 4096, False, (0.8, 1.0, 0.8), (2.7, 3.0, 2.7)),  # long: default = Gluon, faster
    row(128, 4096, True, (1.1, 1.0, 1.1), (3.0, 3.0, 3.0)),  # one timing 10% slower: flagged
]


def test_ratios_are_each_path_over_the_all_triton_path():
    assert ratios(ROWS[2], "fwd") == (0.8, 0.8)
    assert ratios(ROWS[0], "fwd+bwd") == (1.0, 1.5)


def test_the_table_gives_ranges_per_length_and_counts_timings_over_the_target():
    text = dispatch_table({"dispatch_rows": ROWS})
    assert "| 128 | 512 | 1.00-1.00 | 1.50-2.00 | 1.00-1.00 | 1.10-1.50 |" in text
    assert "| 128 | 4096 | 0.80-1.10 | 0.80-1.10 | 0.90-1.00 | 0.90-1.00 |" in text
    assert text.splitlines()[-1] == f"default/triton worst 1.100; 1 of 8 timings above {TARGET}"


def test_each_path_is_timed_there_and_back_so_a_steady_drift_cancels(monkeypatch):
    """The paths run the same kernel here; the clock slows by the same step at every timing (as
    after a heavy shape). Timed in one order, the first path would read fastest; there and back,
    each path's mean is the same."""
    import torch

    from attnforge_kernels.tools import dispatch

    calls = []

    def timer(fn, spec, grads):
        calls.append((spec, grads is not None))
        return 1.0 + 0.01 * len(calls)

    monkeypatch.setattr(dispatch, "time_under", timer)
    q = torch.zeros(1, 4, 2, 8)
    out = dispatch._timings(q, q, q, causal=True)
    assert len(calls) == 2 + 4 * len(dispatch.PATHS)  # an untimed round first
    specs = [s for s, _ in calls[2::2]]
    assert specs == specs[::-1]  # default, triton, gluon, gluon, triton, default
    for mode in ("fwd", "fwd+bwd"):
        assert len({round(t, 9) for t in out[mode].values()}) == 1, out[mode]


def test_more_rounds_keep_the_drift_cancelled_and_report_medians(monkeypatch):
    import torch

    from attnforge_kernels.tools import dispatch

    calls = []

    def timer(fn, spec, grads):
        calls.append(spec)
        return 1.0 + 0.01 * len(calls)

    monkeypatch.setattr(dispatch, "time_under", timer)
    q = torch.zeros(1, 4, 2, 8)
    out = dispatch._timings(q, q, q, causal=True, rounds=3)
    assert len(calls) == 2 + 4 * len(dispatch.PATHS) * 3
    for mode in ("fwd", "fwd+bwd"):
        assert len({round(t, 9) for t in out[mode].values()}) == 1, out[mode]


def test_gpu_time_times_every_path_by_its_graphs_and_the_table_says_so(monkeypatch):
    """--gpu-time: each timing, the untimed round's too, is the GPU's time alone
    (graph_time_under), and none is do_bench's; the report's last line names the timer."""
    import torch

    from attnforge_kernels.tools import dispatch

    used = []

    def graphs(fn, spec, grads):
        used.append("graph")
        return 1.0

    def do_bench_timer(fn, spec, grads):
        used.append("do_bench")
        return 1.0

    monkeypatch.setattr(dispatch, "graph_time_under", graphs)
    monkeypatch.setattr(dispatch, "time_under", do_bench_timer)
    q = torch.zeros(1, 4, 2, 8)
    dispatch._timings(q, q, q, causal=False, gpu_time=True)
    assert used == ["graph"] * (2 + 4 * len(dispatch.PATHS))
    used.clear()
    dispatch._timings(q, q, q, causal=False)
    assert set(used) == {"do_bench"}
    row = {"d": 128, "s": 2048, "b": 1, "hq": 16, "hkv": 16, "causal": True,
           "ms": {m: {"default": 1.0, "triton": 1.0, "gluon": 1.2} for m in ("fwd", "fwd+bwd")}}  # fmt: skip
    assert "worst 1.000 (the GPU's time alone);" in dispatch.dispatch_table(
        {"dispatch_rows": [row], "gpu_time": True}
    )
    assert "worst 1.000;" in dispatch.dispatch_table({"dispatch_rows": [row]})


def test_a_row_over_the_target_is_timed_again_and_keeps_its_first_reading(monkeypatch):
    """The default path of the first round reads 8% slow (one slow timing, as a shape change can
    leave the clock); the row counts by the median of the confirming rounds, and its line and
    JSON keep the first reading. A row within the target is timed once."""
    from attnforge_kernels.tools import dispatch

    slow = {"fwd": {"default": 1.0, "triton": 1.0, "gluon": 1.0},
            "fwd+bwd": {"default": 3.24, "triton": 3.0, "gluon": 3.0}}  # fmt: skip
    level = {m: {p: t for p, t in by.items()} for m, by in slow.items()}
    level["fwd+bwd"]["default"] = 3.0
    calls = []

    def timings(q, k, v, causal, rounds=1, gpu_time=False):
        calls.append(rounds)
        return slow if len(calls) == 1 else level

    monkeypatch.setattr(dispatch, "_timings", timings)
    ms, first = dispatch._row_times(None, None, None, True)
    assert calls == [1, dispatch.CONFIRM_ROUNDS]
    assert ms is level and first is slow
    r = {
        "d": 64,
        "s": 1024,
        "b": 8,
        "hq": 16,
        "hkv": 16,
        "causal": True,
        "ms": ms,
        "first_ms": first,
    }
    assert "(re-timed; the first round: default/triton fwd 1.000, fwd+bwd 1.080)" in dispatch._line(
        r
    )
    table = dispatch_table({"dispatch_rows": [r]})
    assert table.splitlines()[-1] == (
        f"default/triton worst 1.000; 0 of 2 timings above {TARGET} (re-timed in "
        f"{dispatch.CONFIRM_ROUNDS} rounds: 1 of 1 rows)"
    )
    calls.clear()
    monkeypatch.setattr(dispatch, "_timings", lambda *a, **kw: calls.append(1) or level)
    assert dispatch._row_times(None, None, None, True) == (level, None) and calls == [1]


def test_the_command_line_selects_a_part_of_the_sweep():
    """--seqs, --head-dims and --gqa narrow the sweep (one part per device call) and --tokens sets
    its batch; values the sweep does not have, or the options without --dispatch, stop before any
    GPU work."""
    import pytest

    from attnforge_kernels.tools.benchmark import _dispatch_selection, _parser

    def select(*argv):
        ap = _parser()
        return _dispatch_selection(ap, ap.parse_args(list(argv)))

    assert select("--dispatch") == {}
    assert select("--dispatch", "--seqs", "2048,4096", "--head-dims", "128", "--gqa", "1,7") == {
        "seqs": (2048, 4096),
        "head_dims": (128,),
        "gqa": (1, 7),
    }
    assert select("--dispatch", "--tokens", "2048") == {"tokens": 2048}
    for bad in (
        ("--dispatch", "--tokens", "0"),
        ("--tokens", "2048"),
        ("--dispatch", "--head-dims", "96"),
        ("--dispatch", "--gqa", "2"),
        ("--dispatch", "--seqs", "0"),
        ("--seqs", "4096"),
    ):
        with pytest.raises(SystemExit) as exc:
            select(*bad)
        assert exc.value.code == 2, bad


def test_the_sweep_fills_the_gpu_by_default_and_runs_one_sequence_under_a_small_token_count():
    """Each shape runs TOKENS // s sequences (8192 tokens: short sequences still fill the GPU);
    --tokens at or below a length makes every shape one sequence, a single prompt's small grid."""
    from attnforge_kernels.tools.dispatch import RATIOS, shapes

    full = shapes(seqs=(512, 2048, 32768), head_dims=(128,))
    assert len(full) == 3 * len(RATIOS) * 2
    assert {r["s"]: r["b"] for r in full} == {512: 16, 2048: 4, 32768: 1}
    small = shapes(seqs=(2048, 3072), head_dims=(128,), gqa=(4,), tokens=2048)
    assert [(r["s"], r["b"], r["hq"], r["hkv"], r["causal"]) for r in small] == [
        (2048, 1, 32, 8, False),
        (2048, 1, 32, 8, True),
        (3072, 1, 32, 8, False),
        (3072, 1, 32, 8, True),
    ]
