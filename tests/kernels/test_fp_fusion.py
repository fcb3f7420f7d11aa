"""The kernels state their floating-point fusion, so Triton 3.10's new default changes nothing.

Triton 3.9 warns that 3.10 turns fusion off by default (``TRITON_DEFAULT_FP_FUSION``); the kernels
pass ``enable_fp_fusion`` themselves (attnforge_kernels/device/configs.py ``FP_FUSION``), at every
launch and in the AOT check. Here: every launch in attnforge_kernels/ states it; Triton's default
flipped gives the same compiled kernels; ``ATTNFORGE_FP_FUSION=0`` reaches the code (fewer fused
multiply-adds) and the AOT check of the default configs finds the same problems under both settings;
and on Triton 3.9 a compile that leaves the choice to Triton fails the strict warning filter the
kernel tests run under (tests/kernels/strict_triton.py), so that filter is live.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge_kernels.device import configs
from tests.conftest import installed_triton
from tests.kernels.strict_triton import MESSAGE, PRELUDE, module_args

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "env, want",
    [({}, True), ({"ATTNFORGE_FP_FUSION": "1"}, True), ({"ATTNFORGE_FP_FUSION": "0"}, False)],
)
def test_the_setting_comes_from_the_environment(env, want):
    assert configs.fp_fusion_from(env) is want


@pytest.mark.parametrize("bad", ["", "yes", "true", "2"])
def test_a_bad_setting_is_refused_naming_the_variable(bad):
    with pytest.raises(ValueError, match=f"ATTNFORGE_FP_FUSION={bad!r}: expected 1"):
        configs.fp_fusion_from({"ATTNFORGE_FP_FUSION": bad})


@pytest.mark.parametrize("hip", [True, False])
def test_every_tile_launch_states_it(hip):
    assert (
        configs.Tile(64, 64, 4, 1, 2).launch_options(hip)["enable_fp_fusion"] is configs.FP_FUSION
    )


def _launches(path: Path):
    """(line, call) of every ``kernel[grid](...)`` call in ``path``: a grid is a name or a tuple
    (``table["name"](...)``, ``table[case.kind](...)`` are lookups, not launches)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Subscript)
            and isinstance(node.func.slice, (ast.Name, ast.Tuple))
        ):
            yield node.lineno, node


def _states_fusion(call: ast.Call) -> bool:
    for kw in call.keywords:
        if kw.arg == "enable_fp_fusion":
            return True
        # **tile.launch_options(hip), **_launch_options(tile): Tile.launch_options states it
        if kw.arg is None and isinstance(kw.value, ast.Call):
            f = kw.value.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name.endswith("launch_options"):
                return True
    return False


def test_every_kernel_launch_in_the_package_states_it():
    """A launch that left fusion to Triton would change with Triton 3.10's default."""
    launches, missing = 0, []
    for path in sorted((REPO / "attnforge_kernels").rglob("*.py")):
        for line, call in _launches(path):
            # attnforge_kernels/launch/plans.py's recorder forwards a launch's own keywords
            # (**kwargs)
            forwards = any(
                kw.arg is None and isinstance(kw.value, ast.Name) for kw in call.keywords
            )
            launches += 1
            if not forwards and not _states_fusion(call):
                missing.append(f"{path.relative_to(REPO)}:{line}")
    assert launches >= 8, launches  # the walk found the launches (forward, backward, Gluon, decode)
    assert not missing, f"launches that leave floating-point fusion to Triton: {missing}"


def _aot(tmp: Path, *args: str, **env: str) -> list[dict]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "ATTNFORGE_FP"))}
    clean.update(TRITON_CACHE_DIR=str(tmp / "triton-cache"), **env)
    proc = subprocess.run(
        [sys.executable, *module_args("attnforge_kernels.aot", *args, "--json")],
        cwd=REPO, env=clean, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.stdout.startswith("["), proc.stderr[-3000:]
    return json.loads(proc.stdout)


# One AMD kernel (WMMA on Strix Halo) and one NVIDIA kernel (ptxas), compiled cold.
ONE_EACH = ["--arch", "gfx1151", "--arch", "sm90", "--head-dims", "64", "--kernel", "fwd",
            "--no-cache"]  # fmt: skip


@pytest.mark.slow
def test_tritons_default_flipped_changes_nothing_and_the_setting_reaches_the_code(tmp_path):
    stated = _aot(tmp_path / "a", *ONE_EACH)
    flipped = _aot(tmp_path / "b", *ONE_EACH, TRITON_DEFAULT_FP_FUSION="0")
    assert flipped == stated  # what Triton 3.10 will default to
    off = _aot(tmp_path / "c", *ONE_EACH, ATTNFORGE_FP_FUSION="0")
    assert len(stated) == len(off) == 2
    for on_r, off_r in zip(stated, off, strict=True):
        assert on_r["fp_fusion"] is True and off_r["fp_fusion"] is False
        assert 0 < off_r["fmas"] < on_r["fmas"], (on_r, off_r)  # fewer fused multiply-adds
        assert not on_r["problems"] and not off_r["problems"]


@pytest.mark.slow
def test_the_aot_check_finds_the_same_problems_under_both_settings(tmp_path, aot_cache):
    """The default configs of one RDNA and one CDNA arch, both head dims, fusion off: no spill or
    compile failure that fusion on does not have (through the kept compile cache, whose keys hold
    the setting)."""
    args = ["--arch", "gfx1151", "--arch", "gfx942", "--cache-dir", str(aot_cache)]
    on = _aot(tmp_path / "on", *args)
    off = _aot(tmp_path / "off", *args, ATTNFORGE_FP_FUSION="0")

    def problems(reports):
        return {(r["arch"], r["head_dim"], r["kernel"]): r["problems"] for r in reports}

    assert {r["fp_fusion"] for r in off} == {False} and {r["fp_fusion"] for r in on} == {True}
    assert problems(off) == problems(on)


LEAVE_IT_TO_TRITON = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget

@triton.jit
def axpy(x, y, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, 2.0 * tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)

src = triton.compiler.ASTSource(fn=axpy, signature={"x": "*fp32", "y": "*fp32", "n": "i32",
                                "BLOCK": "constexpr"}, constexprs={"BLOCK": 64})
triton.compile(src, target=GPUTarget("hip", "gfx1151", 32), options=OPTIONS)
print("compiled")
"""


@pytest.mark.slow
@pytest.mark.parametrize("options, fails", [({}, True), ({"enable_fp_fusion": True}, False)])
def test_on_triton_39_leaving_it_to_triton_fails_the_kernel_checks(tmp_path, options, fails):
    folder = installed_triton("3.9.0")  # None: the venv's own
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITON_", "PYTHONPATH"))}
    env.update(PYTHONPATH=os.pathsep.join(str(f) for f in (folder, REPO) if f),
               TRITON_CACHE_DIR=str(tmp_path))  # fmt: skip
    script = tmp_path / "leave_it.py"  # Triton reads a jit function's source from its file
    script.write_text(PRELUDE + "\n" + LEAVE_IT_TO_TRITON.replace("OPTIONS", repr(options)))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    if fails:
        assert proc.returncode != 0 and "TRITON_DEFAULT_FP_FUSION is unset" in proc.stderr, (
            proc.stdout + proc.stderr[-2000:]
        )
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == "compiled", proc.stderr[-2000:]


def test_pyproject_filters_what_the_subprocesses_filter():
    """pyproject.toml's filterwarnings (this process) and strict_triton.MESSAGE (subprocesses)."""
    import tomllib

    filters = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "filterwarnings"
    ]
    assert f"error:{MESSAGE}:UserWarning:triton" in filters
    assert {"error::DeprecationWarning:triton", "error::FutureWarning:triton"} <= set(filters)
