"""The causal prefill bench (attnforge_kernels/tools/prefill.py, ``bench --prefill``): each path
timed there and back, TFLOP/s as flash-attention counts causal work, and each variant's results
compared with the default path's, bit for bit, on the kernels themselves (Triton's interpreter;
the timer is a stand-in, as no GPU times here)."""

import json

import pytest

from attnforge_kernels.tools import benchmark, prefill

ACROSS = json.dumps({"across_heads": True, "across_waves": [0, 1e9]})


@pytest.fixture
def timer(monkeypatch):
    """A stand-in for do_bench: 1 ms for the default path, 0.8 for any other; the calls noted."""
    calls = []

    def fake(fn, spec, grads):
        fn()
        calls.append(spec)
        return 1.0 if spec is None else 0.8

    monkeypatch.setattr("attnforge_kernels.tools.dispatch.time_under", fake)
    return calls


def test_a_launch_order_variant_is_timed_there_and_back_and_computes_the_same(timer):
    result = prefill.run_prefill({"across": ACROSS}, shapes=[(1, 2, 1, 40, 16)], rounds=1,
                                 device="cpu")  # fmt: skip
    (row,) = result["prefill_rows"]
    assert row["equal"] == {"across": True}
    assert timer[4:] == [None, None, ACROSS, ACROSS, ACROSS, ACROSS, None, None]  # after warm-up
    assert row["ms"]["fwd"] == {"default": 1.0, "across": 0.8}
    # 2*b*h*s*s*d causal forward FLOPs in 1 ms, 3.5 times that for forward + backward.
    assert prefill.tflops(row, "fwd", "default") == pytest.approx(2 * 2 * 40 * 40 * 16 / 1e9)
    assert prefill.tflops(row, "fwd+bwd", "across") == pytest.approx(
        3.5 * 2 * 2 * 40 * 40 * 16 / 0.8e9
    )
    table = prefill.prefill_table(result)
    assert "| (1, 2/1, 40, 16) |" in table and "| 0.800 |" in table and table.endswith("| yes |")
    assert result["variants"] == {"default": None, "across": json.loads(ACROSS)}
    assert row["reference"] == "default"


def test_with_two_variants_the_first_is_the_reference(timer):
    heads = json.dumps({"across_heads": False})
    result = prefill.run_prefill({"heads": heads, "across": ACROSS}, shapes=[(1, 2, 1, 40, 16)],
                                 rounds=1, device="cpu")  # fmt: skip
    (row,) = result["prefill_rows"]
    assert row["reference"] == "heads" and row["equal"] == {"default": True, "across": True}
    assert "| default = heads | across = heads |" in prefill.prefill_table(result)


def test_a_variant_that_changes_the_results_is_reported(timer):
    # Another tile changes the order of the sums: no longer equal bit for bit, so the table says so.
    tile = json.dumps({"fwd": [16, 32, 4, 1], "bwd_q": [16, 32, 4, 1]})
    result = prefill.run_prefill({"tile": tile}, shapes=[(1, 1, 1, 70, 16)], rounds=1,
                                 device="cpu")  # fmt: skip
    assert result["prefill_rows"][0]["equal"] == {"tile": False}
    assert prefill.prefill_table(result).endswith("| **no** |")


def test_the_command_line_names_the_prefill_bench():
    args = benchmark._parser().parse_args(["--prefill", "--variant", f"across={ACROSS}"])
    assert args.prefill and args.variant == [f"across={ACROSS}"]
