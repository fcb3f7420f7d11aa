"""The breakdown's product count per kernel and the rate it prints (attnforge_kernels/tools/benchmark.py):
kernel names as torch.profiler reports them on an H100 (ours, SDPA-cuDNN's, SDPA-flash's); and
the bench's ``--json`` file, which a failed run must not destroy."""

import json

import pytest

from attnforge_kernels.tools.benchmark import _write, breakdown_text, kernel_products, product_rate

NAMES = {
    "attn_fwd": 2,
    "attn_fwd_sm90": 2,
    "attn_bwd_dq": 3,
    "attn_bwd_dkdv": 4,
    "attn_bwd_dkdv_sm90": 4,
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128": 2,
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_7_64x128x128": 5,
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4": 2,
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_k": 5,
    "void cudnn::fusion::compute_dot_do_o_specialized<true>": None,
    "void cudnn::fusion::convert_dq_to_16bits<true>(void": None,
    "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits": None,
    "void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128": None,
    "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor": None,
}


@pytest.mark.parametrize("name", NAMES)
def test_each_kernel_counts_the_products_it_issues(name):
    assert kernel_products(name) == NAMES[name]


def test_the_rate_is_the_products_flops_over_the_kernels_time():
    shape = (4, 16, 4096, 128)
    product = 2.0 * 4 * 16 * 4096 * 4096 * 128  # one (s x s x d) product: 274.9 GFLOP
    assert product_rate("attn_fwd", 1.148, 1, shape, False) == pytest.approx(2 * product / 1.148e9)
    assert product_rate("attn_bwd_dq", 1.3, 1, shape, True) == pytest.approx(
        3 * product / 2 / 1.3e9
    )


def test_no_rate_where_the_products_are_unknown_or_split_over_launches():
    shape = (4, 16, 4096, 128)
    assert (
        product_rate("void at::native::vectorized_elementwise_kernel", 0.2, 3, shape, False) is None
    )
    # d > 128 on Hopper: dV then dK, two launches of one kernel that issue 2 and 3 products.
    assert product_rate("attn_bwd_dkdv", 4.9, 2, shape, False) is None


def test_the_text_gives_each_providers_kernels_and_errors():
    result = {
        "ours": {
            "total_ms": 3.0,
            "kernels": [
                {"name": "attn_bwd_dkdv", "ms": 2.0, "launches": 1, "tflops": 550.0},
                {"name": "elementwise", "ms": 1.0, "launches": 3, "tflops": None},
            ],
        },
        "sdpa-cudnn": {"error": "RuntimeError: no kernel"},
    }
    lines = breakdown_text(result, (4, 16, 4096, 128), False).splitlines()
    assert lines[0].startswith(
        "per-kernel GPU time a fwd+bwd step at (4, 16, 4096, 128), causal=False"
    )
    assert lines[1:] == [
        "  ours: 3.000 ms of kernels",
        "       2.000 ms  x1    550.0 TFLOP/s  attn_bwd_dkdv",
        "       1.000 ms  x3                  elementwise",
        "  sdpa-cudnn: RuntimeError: no kernel",
    ]


def test_the_json_is_replaced_whole_and_a_failed_write_keeps_the_last_one(tmp_path):
    out = tmp_path / "bench.json"
    _write({"rows": [1]}, str(out))
    _write({"rows": [2]}, str(out))
    assert json.loads(out.read_text()) == {"rows": [2]}
    with pytest.raises(TypeError):  # not serialisable: fails before the file is touched
        _write({"rows": [object()]}, str(out))
    assert json.loads(out.read_text()) == {"rows": [2]}
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temporary left beside it
