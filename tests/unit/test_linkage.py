"""The `linkage` smoke check on real shared objects: tiny extensions compiled here with the host's
C++ compiler against this venv's torch (libc10), in temp dirs, then checked by the smoke runner
exactly as build.smoke runs it (`python - CHECKS` with the runner on stdin). Each planted defect is
also loaded with the real dynamic loader (ctypes after `import torch`), so the check is held to
what ld.so does, not only to its own model of it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.image import smoke_runner
from attnforge.recipes import SmokeCheck

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(
    CXX is None or shutil.which("readelf") is None, reason="needs a C++ compiler and binutils"
)

torch = pytest.importorskip("torch")
TORCH_LIB = Path(torch.__file__).parent / "lib"

# Calls a real c10 function (exported by libc10.so), declared by hand so the compile takes
# milliseconds instead of torch's headers' half minute.
HONEST = """
namespace c10 { struct Allocator; Allocator* GetCPUAllocator(); }
extern "C" void* attnforge_probe() { return (void*)c10::GetCPUAllocator(); }
"""
# The same, plus a c10 function this torch does not have: what an extension built against
# another torch carries.
FOREIGN = (
    HONEST
    + """
namespace c10 { void attnforge_not_in_this_torch(int); }
extern "C" void attnforge_other() { c10::attnforge_not_in_this_torch(7); }
"""
)
HELPER = 'extern "C" int attnforge_helper() { return 42; }\n'
USES_HELPER = (
    'extern "C" int attnforge_helper();\nextern "C" int probe() { return attnforge_helper(); }\n'
)
WEAK = 'extern "C" void maybe_there() __attribute__((weak));\nextern "C" int probe() { return maybe_there ? 1 : 0; }\n'


def compile_so(out: Path, source: str, *flags: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(".cpp")
    src.write_text(source)
    subprocess.run([CXX, "-shared", "-fPIC", "-o", str(out), str(src), *flags], check=True)
    return out


def torch_ext(out: Path, source: str = HONEST) -> Path:
    """Linked the way torch.utils.cpp_extension links: -L torch/lib -lc10, no RPATH."""
    return compile_so(out, source, f"-L{TORCH_LIB}", "-lc10")


def run_checks(specs: list[dict], env: dict | None = None) -> list[dict]:
    """The smoke runner on SPECS in one process, as build.smoke runs an image's checks."""
    proc = subprocess.run(
        [sys.executable, "-", json.dumps(specs)],
        input=Path(smoke_runner.__file__).read_text(),
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode in (0, 1), proc.stderr
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["name"] for r in results] == [s["name"] for s in specs]
    assert proc.returncode == (0 if all(r["ok"] for r in results) else 1)
    return results


def check(targets: str, preload: str | None = "torch", env: dict | None = None) -> dict:
    spec = {"name": "linkage", "linkage": targets}
    if preload:
        spec["preload"] = preload
    [result] = run_checks([spec], env)
    return result


def real_loader(*paths: Path, preload: str | None = "torch") -> list[str]:
    """What the dynamic loader says of each extension, loaded in turn in one process after
    `import PRELOAD` (as the check models it)."""
    code = "import ctypes, os, sys\n"
    code += f"import {preload}\n" if preload else ""
    code += "for path in sys.argv[1:]:\n    try:\n"
    code += "        ctypes.CDLL(path, mode=os.RTLD_NOW)\n    except OSError as e:\n"
    code += "        print(e)\n    else:\n        print('loaded')\n"
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True, check=True
    ).stdout.splitlines()


@pytest.fixture(scope="module")
def after_torch(tmp_path_factory) -> dict[str, tuple[dict, str | None]]:
    """The planted extensions whose check preloads torch, checked in one smoke run (one `import
    torch` for all, as an image's checks share it), and the loose ones loaded by the real loader
    in one process after `import torch`: {name: (check result, loader verdict or None)}."""
    root = tmp_path_factory.mktemp("linkage")
    loose = {
        "honest": torch_ext(root / "honest_ext.so"),
        "foreign": torch_ext(root / "foreign_ext.so", FOREIGN),
    }
    lib = compile_so(root / "lib" / "libattnforge_helper.so", HELPER)
    loose["missing"] = compile_so(
        root / "needs_helper.so", USES_HELPER, f"-L{lib.parent}", "-lattnforge_helper"
    )
    lib.unlink()  # shipped without it
    pkg = root / "site" / "planted_pkg"
    torch_ext(pkg / "good.so")
    torch_ext(pkg / "sub" / "bad.so", FOREIGN)
    (pkg / "__init__.py").write_text("")
    targets = {name: str(path) for name, path in loose.items()}
    targets["folder"] = "planted_pkg:"
    targets["nothing"] = "/nonexistent/attnforge/*.so"
    specs = [{"name": n, "linkage": t, "preload": "torch"} for n, t in targets.items()]
    env = {**os.environ, "PYTHONPATH": str(root / "site")}
    results = dict(zip(targets, run_checks(specs, env), strict=True))
    verdicts = dict(zip(loose, real_loader(*loose.values()), strict=True))
    return {name: (results[name], verdicts.get(name)) for name in targets}


def test_an_extension_built_against_this_torch_passes(after_torch):
    result, loader = after_torch["honest"]
    assert result["ok"], result["detail"]
    assert "honest_ext.so: " in result["detail"] and "libc10.so" in result["detail"]
    assert loader == "loaded"


def test_torchs_own_extension_module_passes_through_its_runpath():
    # torch/_C*.so finds libtorch_python.so by RUNPATH $ORIGIN/lib, and libtorch_python.so's
    # Python C-API symbols are the interpreter's.
    result = check("torch:_C*.so torch:lib/libtorch_python.so", preload=None)
    assert result["ok"], result["detail"]
    assert "libtorch_python.so: " in result["detail"]


def test_an_undefined_symbol_no_loaded_library_defines_fails_naming_it_and_the_extension(
    after_torch,
):
    result, loader = after_torch["foreign"]
    assert not result["ok"]
    detail = result["detail"]
    assert detail.startswith("foreign_ext.so: 1 undefined symbol(s) defined by none of the")
    assert (
        "c10::attnforge_not_in_this_torch(int) [_ZN3c1027attnforge_not_in_this_torchEi]" in detail
    )
    assert "libc10.so" in detail
    assert "undefined symbol: _ZN3c1027attnforge_not_in_this_torchEi" in loader


def test_a_missing_library_fails_naming_the_library_and_the_extension(after_torch):
    result, loader = after_torch["missing"]
    assert not result["ok"]
    assert result["detail"].startswith(
        "needs_helper.so: library libattnforge_helper.so is not found"
    )
    assert "not loaded after `import torch`" in result["detail"]
    assert "libattnforge_helper.so: cannot open shared object file" in loader


@pytest.mark.parametrize(
    "dtags", ["--enable-new-dtags", "--disable-new-dtags"], ids=["runpath", "rpath"]
)
def test_a_library_beside_the_extension_resolves_through_origin(tmp_path, dtags):
    compile_so(tmp_path / "pkg" / "lib" / "libattnforge_helper.so", HELPER)
    ext = compile_so(
        tmp_path / "pkg" / "ext.so", USES_HELPER, f"-L{tmp_path / 'pkg' / 'lib'}",
        "-lattnforge_helper", f"-Wl,{dtags},-rpath,$ORIGIN/lib",
    )  # fmt: skip
    result = check(str(ext), preload=None)
    assert result["ok"], result["detail"]
    assert real_loader(ext, preload=None) == ["loaded"]


def test_without_torch_imported_first_libc10_is_not_found(tmp_path):
    # cpp_extension sets no RPATH: the extension relies on `import torch` having loaded libc10.
    ext = torch_ext(tmp_path / "honest_ext.so")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = check(str(ext), preload=None, env=env)
    assert not result["ok"]
    assert "library libc10.so is not found" in result["detail"]


def test_a_weak_reference_may_stay_unresolved(tmp_path):
    ext = compile_so(tmp_path / "weak.so", WEAK)
    result = check(str(ext), preload=None)
    assert result["ok"], result["detail"]


def test_a_package_folder_target_checks_every_shared_object_in_it(after_torch):
    result, _ = after_torch["folder"]  # planted_pkg/good.so and planted_pkg/sub/bad.so
    assert not result["ok"]
    assert "bad.so: 1 undefined symbol(s)" in result["detail"]
    assert "good.so" not in result["detail"]  # only failures are reported when one fails


def test_without_binutils_the_check_says_what_to_install(tmp_path):
    ext = torch_ext(tmp_path / "honest_ext.so")
    result = check(str(ext), preload=None, env={**os.environ, "PATH": str(tmp_path)})
    assert result == {
        "name": "linkage",
        "ok": False,
        "detail": "readelf is not in the image (install binutils)",
    }


def test_a_target_that_matches_nothing_fails(after_torch):
    result, _ = after_torch["nothing"]
    assert not result["ok"] and "holds no ELF shared object" in result["detail"]


def test_the_recipe_schema_takes_linkage_with_preload_and_rejects_strays():
    SmokeCheck(name="x", linkage="torch_ext:*.so /opt/x/lib", preload="torch")
    with pytest.raises(ValueError, match="preload goes with linkage"):
        SmokeCheck(name="x", python="pass", preload="torch")
    with pytest.raises(ValueError, match="linkage entry 'relative/path' is not an absolute"):
        SmokeCheck(name="x", linkage="relative/path")
    with pytest.raises(ValueError, match="preload entry '1bad' is not a module name"):
        SmokeCheck(name="x", linkage="/x.so", preload="1bad")
