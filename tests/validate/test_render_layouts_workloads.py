"""The report's sections for issue 25: layouts/masks/values and fused-or-math per workload."""

from __future__ import annotations

from validate import render


def report() -> dict:
    bad = {"can_use": False, "reasons": ["r"], "run": "unsupported", "error": "No kernel",
           "note": "refused, as expected on this arch: head dim 512 > 256: pytorch#194280"}  # fmt: skip
    ok = {"can_use": None, "reasons": [], "run": "pass", "max_abs_err": 1e-3, "tolerance": 2e-3}
    nan = {"can_use": True, "reasons": [], "run": "fail", "max_abs_err": "nan", "tolerance": 1e-2}
    return {
        "summary": {"status": "fail", "counts": {"fail": 1}},
        "checks": [
            {
                "id": "sdpa.workloads",
                "status": "pass",
                "details": {
                    "shapes": [
                        {
                            "workload": "vit",
                            "shape": "vit-224x224-siglip-so400m-d72",
                            "fused": False,
                            "params": {
                                "b": 1,
                                "h": 16,
                                "hkv": 16,
                                "sq": 256,
                                "sk": 256,
                                "d": 72,
                                "dtype": "fp16",
                                "causal": False,
                            },
                            "default_backend": "math",
                            "profiler_backend": "math",
                            "kernels": [],
                            "run": "ok",
                        },
                        {
                            "workload": "sdxl",
                            "shape": "sdxl-1024x1024-l2-self-h10",
                            "fused": True,
                            "params": {
                                "b": 2,
                                "h": 10,
                                "hkv": 10,
                                "sq": 4096,
                                "sk": 4096,
                                "d": 64,
                                "dtype": "fp16",
                                "causal": False,
                            },
                            "default_backend": "flash",
                            "profiler_backend": "flash",
                            "kernels": ["flash_fwd_kernel"],
                            "run": "ok",
                        },
                    ]
                },
            }
        ],  # fmt: skip
        "backend_matrix": [
            {
                "case": "fp16-d64-s512",
                "params": {"layout": "bhsd", "head_dim": 64},
                "backends": {"math": ok},
            },
            {
                "case": "bf16-d512-s256",
                "params": {
                    "layout": "bhsd",
                    "head_dim": 512,
                    "dtype": "bf16",
                    "why": "head dim 512",
                },
                "backends": {"flash": bad, "math": ok},
            },
            {
                "case": "bf16-d128-s512-big-v",
                "params": {
                    "layout": "bhsd",
                    "values": "big-v",
                    "head_dim": 128,
                    "dtype": "bf16",
                    "why": "aotriton#54",
                },
                "backends": {"flash": nan, "math": ok},
            },
        ],  # fmt: skip
    }


def test_markdown_shows_the_new_cases_their_notes_and_the_math_fallback():
    md = render.to_markdown(report())
    layouts = md.split("### Layouts, masks and values apps pass")[1].split("###")[0]
    assert "fp16-d64-s512" not in layouts  # contiguous plain cases stay in the main matrix
    assert "| bf16-d512-s256 | bhsd, d512 bf16 | head dim 512 |" in layouts
    assert "bf16-d512-s256 / flash: refused, as expected on this arch" in layouts
    assert "| bf16-d128-s512-big-v | bhsd, big-v, d128 bf16 | aotriton#54 | ❌" in layouts
    work = md.split("### Fused or math at workload shapes")[1]
    assert "| vit | vit-224x224-siglip-so400m-d72 | b1 h16/16 sq256 sk256 d72 fp16 | math" in work
    assert "❌ math" in work and "| ✅ | flash_fwd_kernel |" in work


def test_html_has_both_sections():
    page = render.to_html(report())
    assert "<section id='layouts'>" in page and "<section id='workload-fused'>" in page
    assert "<td class='cell-bad'>math</td>" in page and "<td class='cell-pass'>fused</td>" in page


def test_a_report_without_them_renders_no_empty_sections():
    plain = {"summary": {"status": "pass", "counts": {}}, "checks": [], "backend_matrix": []}
    assert "Layouts" not in render.to_markdown(plain)
    page = render.to_html(plain)
    assert "id='workload-fused'" not in page and "id='layouts'" not in page
    assert "href='#layouts'" not in page  # nor a link to them
