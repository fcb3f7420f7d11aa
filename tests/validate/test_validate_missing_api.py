"""ROCm-only and version-dependent APIs: present or not, the checks answer without a traceback.

There is no ROCm torch here, so the ROCm branch runs against CPU torch with torch.version.hip
patched: that exercises the code path, not ROCm's answers.
"""

import json

import pytest
import torch

from validate.checks import numerics, sdpa


class Ctx:
    quick = True

    def __init__(self):
        self.stages = []

    def progress(self, stage):
        self.stages.append(stage)


def test_rocm_check_skips_on_a_non_rocm_build():
    res = sdpa.rocm({}, Ctx())
    assert res["status"] == "skip"
    assert "torch.version.hip is None" in res["message"]
    assert res["details"]["api"] == {
        "preferred_rocm_fa_library": True,
        "is_ck_sdpa_available": True,
    }


def test_rocm_branch_runs_and_restores_the_preference(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "7.1.0", raising=False)
    before = torch.backends.cuda.preferred_rocm_fa_library()
    ctx = Ctx()
    res = sdpa.rocm({}, ctx)
    assert res["status"] == "pass", res
    obs = res["observations"]
    assert obs["rocm.preferred_fa_library"] in ("default", "aotriton", "ck")
    assert obs["rocm.effective_fa_library"] in ("aotriton", "ck")
    assert obs["rocm.ck_sdpa_available"] is False
    assert set(res["details"]["preferences"]) == {"default", "aotriton", "ck"}
    assert "preferred_rocm_fa_library('ck')" in ctx.stages
    assert torch.backends.cuda.preferred_rocm_fa_library() == before


def test_rocm_without_preferred_library_api_is_a_skip_with_reason(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", "6.2.0", raising=False)
    monkeypatch.delattr(torch.backends.cuda, "preferred_rocm_fa_library")
    monkeypatch.delattr(torch.backends.cuda, "is_ck_sdpa_available")
    res = sdpa.rocm({}, Ctx())
    assert res["status"] == "skip"
    assert "preferred_rocm_fa_library is missing in this torch (added in 2.7)" in res["message"]
    assert "is_ck_sdpa_available is missing" in res["message"]


def test_missing_fused_sdp_choice_falls_back_to_the_profiler(monkeypatch):
    monkeypatch.delattr(torch, "_fused_sdp_choice")
    case = {
        "name": "t",
        "dtype": "fp16",
        "causal": False,
        "head_dim": 16,
        "heads_q": 2,
        "heads_kv": 2,
        "seqlen_q": 8,
        "seqlen_k": 8,
        "batch": 1,
    }
    res = sdpa.case({"case": case, "reference": True}, Ctx())
    assert res["status"] == "pass"
    assert res["details"]["default_backend_source"] == "profiler (aten op name)"
    assert res["observations"]["sdpa.default_backend"] == "flash"


def test_missing_can_use_api_is_reported_not_raised(monkeypatch):
    monkeypatch.delattr(torch.backends.cuda, "can_use_cudnn_attention")
    q, k, v = numerics.make_inputs(
        numerics.Case("t", "fp16", False, 16, 2, 2, 8, 8, batch=1), "cpu"
    )
    params = sdpa.sdpa_params(torch, q, k, v, numerics.Case("t", "fp16", False, 16, 2, 2, 8, 8))
    answer, reasons = sdpa.can_use(torch, "cudnn", params)
    assert answer is None
    assert reasons == ["torch.backends.cuda.can_use_cudnn_attention is missing in this torch"]


FAKE_FA = {
    "flash_attn/__init__.py": "__version__ = '2.8.3'\n",
    "flash_attn/flash_attn_triton_amd/__init__.py": "",
    "flash_attn/flash_attn_triton_amd/interface_fa.py": "",
    "flash_attn/flash_attn_interface.py": "from .flash_attn_triton_amd import interface_fa as flash_attn_gpu\n",
}


@pytest.mark.slow
def test_flash_attn_backend_is_read_from_the_bound_module(tmp_path, run_validate):
    for rel, text in FAKE_FA.items():
        p = tmp_path / "site" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    proc = run_validate(
        "flash-attn",
        "--json",
        str(tmp_path / "r.json"),
        env={"PYTHONPATH": str(tmp_path / "site"), "FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"},
    )
    report = json.loads((tmp_path / "r.json").read_text())
    info = next(c for c in report["checks"] if c["id"] == "flash_attn.info")
    assert info["status"] == "pass", info
    assert report["observations"]["flash_attn.backend"] == "triton"
    assert report["observations"]["flash_attn.version"] == "2.8.3"
    assert (
        "flash_attn.flash_attn_triton_amd.interface_fa" in info["details"]["backend_determined_by"]
    )
    assert "'TRUE'" in info["details"]["backend_determined_by"]
    run = next(c for c in report["checks"] if c["id"] == "flash_attn.run")
    assert run["status"] == "skip" and "no GPU" in run["message"]
    assert proc.returncode == 0
    assert report["environment"]["env"]["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "TRUE"


@pytest.mark.slow
def test_a_broken_flash_attn_install_fails_instead_of_skipping(tmp_path, run_validate):
    site = tmp_path / "site" / "flash_attn"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text(
        "import flash_attn_2_cuda  # the compiled extension is missing\n"
    )
    proc = run_validate(
        "flash-attn", "--json", str(tmp_path / "r.json"), env={"PYTHONPATH": str(tmp_path / "site")}
    )
    report = json.loads((tmp_path / "r.json").read_text())
    info = next(c for c in report["checks"] if c["id"] == "flash_attn.info")
    assert info["status"] == "fail"
    assert "No module named 'flash_attn_2_cuda'" in info["message"]
    assert proc.returncode == 1
