"""The warm-up steps that early-started workers run (validate/checks/*.py ``warm_up``), here on
the CPU: each leaves its worker in the state its checks would set up themselves."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.validate.conftest import REPO

SCRIPT = """
import json, os, sys
from validate.checks import apps, flash_attn, kernels, sdpa
sdpa.warm_up({})
flash_attn.warm_up({})
kernels.warm_up({})
apps.warm_up({"models": ["llama-gqa", "vit", "unet-attn", "qwen-image"]})
from attnforge_kernels.device import configs
print(json.dumps({
    "interpret": os.environ.get("TRITON_INTERPRET"),
    "configs_interpret": configs.INTERPRET,
    "offline": os.environ.get("HF_HUB_OFFLINE"),
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in ("attnforge_kernels", "transformers", "diffusers")),
}))
"""


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("diffusers") is None,
    reason="the apps layer (transformers, diffusers) is not installed here",
)
def test_warm_up_steps_import_what_the_checks_need_as_the_checks_would():
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "HF_HUB_OFFLINE")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, as the cpu stack runs it
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # No GPU: the interpreter is switched on before the kernels are imported, as the checks do.
    assert got["interpret"] == "1" and got["configs_interpret"] is True
    assert got["offline"] == "1"
    mods = set(got["modules"])
    assert {
        "attnforge_kernels.check",
        "attnforge_kernels.api.flash_attn",
        "attnforge_kernels.sdpa_shim",
    } <= mods
    assert "transformers.models.llama.modeling_llama" in mods
    assert "transformers.models.vit.modeling_vit" in mods
    assert "diffusers.models.attention_processor" in mods
    assert "diffusers.models.transformers.transformer_qwenimage" in mods
