"""The per-kernel key of the AOT compile cache (attnforge_kernels/tools/compile_key.py): it follows a kernel's own
source and the jit functions it calls, and nothing else in its module."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge_kernels.tools.compile_key import source_key

REPO = Path(__file__).resolve().parents[2]

MODULE = """\
import triton
import triton.language as tl

SCALE = tl.constexpr(2)


def host(x):  # host code beside the kernels
    return x + 1


@triton.jit
def helper(x):
    return x * SCALE


@triton.jit
def kernel(X, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(X + offs, helper(tl.load(X + offs)))


@triton.jit
def other(X):
    tl.store(X, 1)
"""

# (what changes, the edit, whether `kernel`'s key changes, whether `other`'s does)
EDITS = [
    ("host code", ("    return x + 1", "    y = x * 3\n    return y + 1"), False, False),
    ("lines above the kernels", ("\n\ndef host", "\n\n# a comment\n# and another\ndef host"),
     False, False),
    ("the kernel's body", ("helper(tl.load(X + offs))", "helper(tl.load(X + offs)) + 1"),
     True, False),
    ("a jit helper it calls", ("return x * SCALE", "return x * SCALE + 1"), True, False),
    ("a constexpr global it reads", ("tl.constexpr(2)", "tl.constexpr(3)"), True, False),
    ("the other kernel", ("tl.store(X, 1)", "tl.store(X, 2)"), False, True),
]  # fmt: skip


def _load(folder: Path, text: str, name: str = "mod"):
    """``text`` as a module in a file of its own (inspect reads sources from files)."""
    folder.mkdir(parents=True)
    path = folder / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"keytest_{folder.name}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("what", "edit", "kernel_changes", "other_changes"), EDITS,
                         ids=[e[0] for e in EDITS])  # fmt: skip
def test_the_key_follows_the_kernel_and_its_jit_callees_only(
    tmp_path, what, edit, kernel_changes, other_changes
):
    before = _load(tmp_path / "before", MODULE)
    assert edit[0] in MODULE
    after = _load(tmp_path / "after", MODULE.replace(edit[0], edit[1]))
    assert (source_key(after.kernel) != source_key(before.kernel)) == kernel_changes, what
    assert (source_key(after.other) != source_key(before.other)) == other_changes, what


def test_a_moved_or_renamed_module_keeps_its_keys(tmp_path):
    here = _load(tmp_path / "here", MODULE)
    there = _load(tmp_path / "elsewhere" / "deeper", MODULE, name="device_code")
    assert source_key(here.kernel) == source_key(there.kernel)
    assert source_key(here.kernel) != source_key(here.other)


def test_the_key_is_the_same_in_another_process_and_compiled_or_interpreted(tmp_path):
    """No object address or path enters it, and Triton's interpreter (which the kernels tests
    run under) and its compiler wrap the same function."""
    folder = tmp_path / "mod"
    here = _load(folder, MODULE)
    script = (
        "import importlib.util, json, sys\n"
        "from attnforge_kernels.tools.compile_key import source_key\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(folder / 'mod.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print(json.dumps([source_key(m.kernel), type(m.kernel).__name__]))\n"
    )
    keys = {}
    for interpret in ("0", "1"):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(TRITON_INTERPRET=interpret, PYTHONPATH=str(REPO))
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        key, kind = json.loads(proc.stdout)
        keys[kind] = key
    assert set(keys) == {"JITFunction", "InterpretedFunction"}
    assert set(keys.values()) == {source_key(here.kernel)}


def test_tritons_own_cache_key_moves_with_line_numbers_and_this_one_does_not(tmp_path):
    """Why the key is not ``JITFunction.cache_key`` itself: Triton hashes each function's
    starting line, so a line added above a kernel would compile it again."""
    script = (
        "import importlib.util, json, sys\n"
        "from attnforge_kernels.tools.compile_key import source_key\n"
        "out = []\n"
        "for path in sys.argv[1:]:\n"
        "    spec = importlib.util.spec_from_file_location('m' + str(len(out)), path)\n"
        "    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "    out.append([m.kernel.cache_key, source_key(m.kernel)])\n"
        "print(json.dumps(out))\n"
    )
    shifted = MODULE.replace("\n\ndef host", "\n\n# one more line\ndef host")
    paths = []
    for name, text in (("a", MODULE), ("b", shifted)):
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / "mod.py")
        paths[-1].write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", script, *map(str, paths)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (triton_a, ours_a), (triton_b, ours_b) = json.loads(proc.stdout)
    assert triton_a != triton_b and ours_a == ours_b
