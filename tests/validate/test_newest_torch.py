"""The validation suite and the kernels under the newest torch on PyPI, the one a user installs today.

The cpu stack and the dev extra keep the last torch PyPI serves as a +cpu build; `tools/setup.sh
newest-torch` makes a venv with the newest torch release and the Triton it requires (a CUDA
build, which imports on a machine without a GPU), and `make test` names its interpreter in
ATTNFORGE_NEWEST_TORCH_PYTHON. Here the suite's quick run and the kernels' interpreter checks run
with it, on the CPU, as they run in the cpu stack's image with the older torch.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from attnforge.tritons import load_table
from tests.kernels.strict_triton import module_args

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "tools" / "setup.sh"


def pins() -> dict[str, str]:
    """tools/setup.sh's NEWEST_TORCH pins, name -> version."""
    line = re.search(r"^NEWEST_TORCH=\((.*)\)$", SETUP.read_text(), flags=re.M)
    assert line, "tools/setup.sh has no NEWEST_TORCH=(...) line"
    return dict(p.strip('"').split("==") for p in line.group(1).split())


def test_the_pins_are_the_newest_torch_line_and_the_triton_it_requires():
    table = load_table(REPO)
    newest = max(table.torch, key=lambda r: tuple(int(x) for x in r.torch.split(".")))
    want = pins()
    assert ".".join(want["torch"].split(".")[:2]) == newest.torch, "recipes/tritons.yaml"
    assert want["triton"] == newest.triton


def python() -> str:
    path = os.environ.get(
        "ATTNFORGE_NEWEST_TORCH_PYTHON", str(REPO / "build/newest-torch/bin/python")
    )
    if not Path(path).is_file():
        why = f"no newest-torch venv at {path}; run tools/setup.sh newest-torch"
        if os.environ.get("ATTNFORGE_REQUIRE_E2E") == "1" or os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return path


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("VALIDATE_", "TRITON_"))}
    clean.update(PYTHONPATH=str(REPO), TRITON_CACHE_DIR=str(tmp_path / "triton"), **env)
    return subprocess.run(
        [python(), *args], cwd=tmp_path, env=clean, capture_output=True, text=True, timeout=600
    )


def test_its_versions_are_the_pins(tmp_path):
    proc = run(
        ["-c", "import torch, triton; print(torch.__version__, triton.__version__)"], tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    torch, triton = proc.stdout.split()
    assert torch.split("+")[0] == pins()["torch"] and triton == pins()["triton"]


def test_the_quick_suite_passes_under_it(tmp_path):
    """Every check passes or is skipped with a reason: none crashes on a torch that is a CUDA build
    on a machine without a GPU (torch 2.15's can_use_cudnn_attention raised there). The apps'
    transformers checks fail here, as they should (the test below)."""
    report = tmp_path / "report.json"
    args = ["validate", "all", "--quick", "--json", str(report), "--skip", "apps.llama-gqa"]
    proc = run(module_args(*args, "--skip", "apps.vit"), tmp_path, USE_HUB_KERNELS="NO")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    checks = json.loads(report.read_text())["checks"]
    assert not [c["id"] for c in checks if c["status"] not in ("pass", "skip")]
    env = next(c for c in checks if c["id"] == "env")
    assert pins()["torch"] in env["message"]
    ran = {c["id"] for c in checks if c["status"] == "pass"}
    assert any(n.startswith("sdpa.case.") for n in ran) and "kernels.case.shim-routing" in ran


def test_the_kernels_interpreter_checks_pass_under_it(tmp_path):
    proc = run(module_args("attnforge_kernels.check", "--quick"), tmp_path, TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"^(\d+)/\1 not failed$", proc.stdout, flags=re.M), proc.stdout[-2000:]


def test_transformers_5_25_takes_a_hub_kernel_for_flash_attention_2_even_with_the_switch_off(
    tmp_path,
):
    """transformers 5.25.0 with Hugging Face's `kernels` (its required dependency) and no
    flash_attn: `attn_implementation="flash_attention_2"` fetches kernels-community/flash-attn2,
    and USE_HUB_KERNELS=NO does not stop it (modeling_utils.py's
    _check_and_adjust_attn_implementation never reads the switch). The apps check catches the
    fetch with the network off and says the switch is no remedy; if a later transformers honours
    the switch, this test fails and the apps layer can move (docs/validation.md)."""
    report = tmp_path / "r.json"
    proc = run(["-m", "validate", "apps", "--only", "apps.llama-gqa", "--json", str(report)],
               tmp_path, USE_HUB_KERNELS="NO")  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    [check] = [c for c in json.loads(report.read_text())["checks"] if c["id"] == "apps.llama-gqa"]
    assert check["message"].startswith("transformers 5.25.0 llama-gqa: flash_attention_2 fell back")
    assert (
        "to a Hub kernel (kernels-community/flash-attn2) although USE_HUB_KERNELS=NO, which does "
        "not gate this fallback" in check["message"]
    )
    rows = {r["impl"]: r for r in json.loads(report.read_text())["apps"]["models"]}
    assert rows["flash_attention_2"]["source"] == "a Hub kernel (kernels-community/flash-attn2)"
    assert rows["sdpa"]["correct"] is True  # the other implementations ran as before
