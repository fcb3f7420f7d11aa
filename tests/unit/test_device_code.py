"""Device code for the arch is on disk: the device_code smoke check, against real code objects.

Triton's AMD backend compiles a tiny kernel to an hsaco (an AMDGPU ELF) for gfx1151 and gfx942 on
the CPU, as attnforge_kernels/tools/compile_check.py does; the tests wrap those in clang offload bundles written here from
the documented layout (clang's ClangOffloadBundler: magic, entry table, payloads), plain and
zlib-compressed ('CCOB'), lay out a torch tree with aotriton.images and .kpack in a temp dir, and
run the smoke runner on them as build.smoke does. No GPU, no ROCm tools, no network.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from attnforge.image import smoke_runner
from attnforge.plan import resolve
from attnforge.recipes import load_recipes

REPO = Path(__file__).resolve().parents[2]
EM_AMDGPU = 224


_COMPILE = """
import sys
from pathlib import Path
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1.0, mask=i < n)

for arch, wave in (("gfx1151", 32), ("gfx942", 64)):
    src = triton.compiler.ASTSource(
        fn=add_one, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 64},
    )
    hsaco = triton.compile(src, target=GPUTarget("hip", arch, wave)).asm["hsaco"]
    Path(sys.argv[1], arch + ".hsaco").write_bytes(hsaco)
"""


@pytest.fixture(scope="module")
def hsaco(tmp_path_factory) -> dict[str, bytes]:
    """{arch: hsaco bytes} for gfx1151 (wave32) and gfx942 (wave64), compiled by Triton in its
    own process: the kernels tests set TRITON_INTERPRET=1 for this one, which makes no code."""
    pytest.importorskip("triton")
    out_dir = tmp_path_factory.mktemp("hsaco")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    script = out_dir / "compile.py"  # @triton.jit reads the kernel's source from its file
    script.write_text(_COMPILE)
    proc = subprocess.run(
        [sys.executable, str(script), str(out_dir)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return {arch: (out_dir / f"{arch}.hsaco").read_bytes() for arch in ("gfx1151", "gfx942")}


def bundle(entries: list[tuple[str, bytes]]) -> bytes:
    """A clang offload bundle: '__CLANG_OFFLOAD_BUNDLE__', u64 entry count, then per entry u64
    offset (from the bundle start), u64 size, u64 id length, the id; then the payloads. The host
    entry comes first, empty, as hipcc writes it."""
    entries = [("host-x86_64-unknown-linux-gnu-", b""), *entries]
    head = 24 + 8 + sum(24 + len(i) for i, _ in entries)
    table, body, at = b"", b"", head
    for ident, payload in entries:
        table += struct.pack("<QQQ", at, len(payload), len(ident)) + ident.encode()
        body += payload
        at += len(payload)
    return b"__CLANG_OFFLOAD_BUNDLE__" + struct.pack("<Q", len(entries)) + table + body


def compressed(blob: bytes) -> bytes:
    """clang's CompressedOffloadBundle v2: 'CCOB', u16 version 2, u16 method 0 (zlib), u32 total
    size, u32 uncompressed size, u64 hash, the data."""
    data = zlib.compress(blob)
    return b"CCOB" + struct.pack("<HHIIQ", 2, 0, 24 + len(data), len(blob), 0) + data


def host_library(*bundles: bytes) -> bytes:
    """A stand-in host shared library: an x86-64 ELF header, filler, then .hip_fatbin-style
    bundles (the runner finds bundles by their magic, wherever the section lies)."""
    elf = b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HH", 3, 62) + b"\0" * 44
    return elf + b"\xcc" * 5000 + b"".join(b + b"\0" * 64 for b in bundles)


def hip_id(arch: str) -> str:
    return f"hipv4-amdgcn-amd-amdhsa--{arch}"


@pytest.fixture
def site(tmp_path: Path, hsaco) -> Path:
    """A site-packages with torch's device files as AMD's split wheels lay them out, and a
    flash-attention-like extension whose fat binary holds gfx1151 code."""
    root = tmp_path / "site"
    (root / "torch").mkdir(parents=True)
    (root / "torch/__init__.py").write_text("")
    images = root / "torch/lib/aotriton.images/amd-gfx115x/flash"
    images.mkdir(parents=True)
    (images / "attn_fwd.aks2").write_bytes(b"AKS2" + hsaco["gfx1151"])
    (root / "torch/.kpack").mkdir()
    (root / "torch/.kpack/torch_gfx1151.kpack").write_bytes(hsaco["gfx1151"])
    (root / "fa").mkdir()
    (root / "fa/__init__.py").write_text("")
    lib = host_library(bundle([(hip_id("gfx1151"), hsaco["gfx1151"])]))
    (root / "fa/flash_attn_2_cuda.so").write_bytes(lib)
    return root


def run(site: Path, checks: list[dict]) -> list[dict]:
    source = Path(smoke_runner.__file__).read_text()
    proc = subprocess.run(
        [sys.executable, "-", json.dumps(checks)],
        input=source,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert proc.returncode in (0, 1), proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def one(site: Path, targets: str, arch: str) -> dict:
    [result] = run(site, [{"name": "c", "device_code": targets, "arch": arch}])
    return result


TARGETS = "torch:lib/aotriton.images torch:.kpack fa:flash_attn_2_cuda.so"


def test_triton_gives_amdgpu_code_objects_with_the_arch_in_e_flags(hsaco):
    # The reference values the runner's table holds (LLVM AMDGPUUsage.rst, EF_AMDGPU_MACH).
    for arch, mach in (("gfx1151", 0x04A), ("gfx942", 0x04C)):
        elf = hsaco[arch]
        assert elf[:4] == b"\x7fELF"
        assert struct.unpack_from("<H", elf, 18)[0] == EM_AMDGPU
        assert struct.unpack_from("<I", elf, 48)[0] & 0xFF == mach
        assert smoke_runner._elf_amdgpu_target(elf) == arch


def test_the_right_arch_passes(site):
    result = one(site, TARGETS, "gfx1151")
    assert result["ok"], result["detail"]
    assert "amd-gfx115x: 1 images" in result["detail"]
    assert "1 kernel packs for gfx1151" in result["detail"]
    assert "flash_attn_2_cuda.so: gfx1151" in result["detail"]


def test_the_wrong_arch_fails_naming_what_is_missing(site):
    result = one(site, TARGETS, "gfx942")
    assert not result["ok"]
    detail = result["detail"]
    assert "has no AOTriton kernel images for gfx942 (amd-gfx942); it has amd-gfx115x" in detail
    assert "holds no kernel pack for gfx942 (*_gfx942.kpack); it has torch_gfx1151.kpack" in detail
    assert "flash_attn_2_cuda.so holds device code for gfx1151, not gfx942" in detail


def test_an_extension_built_for_another_arch_fails(tmp_path, hsaco):
    path = tmp_path / "ck.so"
    path.write_bytes(host_library(bundle([(hip_id("gfx942"), hsaco["gfx942"])])))
    result = one(tmp_path, str(path), "gfx1151")
    assert not result["ok"]
    assert result["detail"] == f"{path} holds device code for gfx942, not gfx1151"
    assert one(tmp_path, str(path), "gfx942")["ok"]


def test_a_compressed_bundle_among_several_is_read(tmp_path, hsaco):
    # hipcc --offload-compress writes 'CCOB' bundles; zlib ones are read with the stdlib.
    lib = host_library(
        bundle([(hip_id("gfx942"), hsaco["gfx942"])]),
        compressed(bundle([(hip_id("gfx1151"), hsaco["gfx1151"])])),
    )
    path = tmp_path / "libfused.so"
    path.write_bytes(lib)
    result = one(tmp_path, str(path), "gfx1151")
    assert result["ok"], result["detail"]
    assert result["detail"] == "libfused.so: gfx1151, gfx942"


def test_a_bundle_entry_whose_elf_is_another_arch_fails(tmp_path, hsaco):
    path = tmp_path / "liar.so"
    path.write_bytes(host_library(bundle([(hip_id("gfx1151"), hsaco["gfx942"])])))
    result = one(tmp_path, str(path), "gfx1151")
    assert not result["ok"]
    assert "gfx1151 (but its ELF says gfx942), not gfx1151" in result["detail"]


def test_a_bare_hsaco_and_a_host_library_without_device_code(tmp_path, hsaco):
    (tmp_path / "k.hsaco").write_bytes(hsaco["gfx1151"])
    assert one(tmp_path, str(tmp_path / "k.hsaco"), "gfx1151")["ok"]
    (tmp_path / "plain.so").write_bytes(host_library())
    result = one(tmp_path, str(tmp_path / "plain.so"), "gfx1151")
    assert not result["ok"]
    assert "holds no AMDGPU device code" in result["detail"]


def test_an_empty_images_folder_fails(site):
    shutil.rmtree(site / "torch/lib/aotriton.images/amd-gfx115x")
    (site / "torch/lib/aotriton.images/amd-gfx115x").mkdir()
    result = one(site, "torch:lib/aotriton.images", "gfx1151")
    assert not result["ok"]
    images = site / "torch/lib/aotriton.images"
    assert result["detail"] == (
        f"{images}/amd-gfx115x has no kernel images for gfx1151 (the folder is empty)"
    )


def test_a_dropped_hidden_folder_fails(site):
    # A copy step that skips dot-folders (lemonade's post-mortem) leaves torch/.kpack behind.
    shutil.rmtree(site / "torch/.kpack")
    result = one(site, TARGETS, "gfx1151")
    assert not result["ok"]
    assert result["detail"] == (
        f"{site}/torch/.kpack is missing (a hidden folder, which a copy step may have dropped)"
    )


def test_an_older_aotriton_family_folder_serves_the_arch(site):
    # AOTriton <= 0.11 packed all of gfx11 as amd-gfx11xx (split in 0.12b).
    images = site / "torch/lib/aotriton.images"
    (images / "amd-gfx115x").rename(images / "amd-gfx11xx")
    assert one(site, "torch:lib/aotriton.images", "gfx1151")["ok"]
    assert not one(site, "torch:lib/aotriton.images", "gfx1201")["ok"]


def test_the_aotriton_recipe_check_on_a_tree_built_for_the_arch(tmp_path, hsaco):
    # The check aotriton.yaml renders for gfx1151, pointed at a temp /opt/aotriton.
    plan = resolve(load_recipes(REPO), "gfx1151", "source")
    step = next(s for s in plan.steps if s.layer == "aotriton")
    [check] = [c for c in step.smoke if "device_code" in c]
    assert check["device_code"] == "/opt/aotriton/lib/aotriton.images"
    assert check["arch"] == "gfx1151"
    prefix = tmp_path / "opt/aotriton"
    moved = dict(check, device_code=check["device_code"].replace("/opt/aotriton", str(prefix)))
    [result] = run(tmp_path, [moved])
    assert not result["ok"]
    assert "is missing" in result["detail"]
    (prefix / "lib/aotriton.images/amd-gfx115x").mkdir(parents=True)
    (prefix / "lib/aotriton.images/amd-gfx115x/k.aks2").write_bytes(hsaco["gfx1151"])
    (prefix / "lib/aotriton.images/amd-gfx942").mkdir()
    [result] = run(tmp_path, [moved])
    assert result["ok"], result["detail"]


def test_a_single_file_extension_module_is_found_by_its_name(tmp_path, hsaco):
    # flash-attention's CK build installs flash_attn_2_cuda.<abi>.so at the top of site-packages.
    ext = tmp_path / f"flash_attn_2_cuda{_ext_suffix()}"
    ext.write_bytes(host_library(bundle([(hip_id("gfx942"), hsaco["gfx942"])])))
    assert one(tmp_path, "flash_attn_2_cuda:", "gfx942")["ok"]
    result = one(tmp_path, "flash_attn_2_cuda:", "gfx1151")
    assert result["detail"] == f"{ext} holds device code for gfx942, not gfx1151"


def _ext_suffix() -> str:
    import importlib.machinery

    return importlib.machinery.EXTENSION_SUFFIXES[0]


def test_a_missing_package_is_named(tmp_path):
    result = one(tmp_path, "no_such_pkg_xyz:lib", "gfx1151")
    assert not result["ok"]
    assert result["detail"] == "no_such_pkg_xyz:lib: package no_such_pkg_xyz is not installed"


# --- variants: what is reported, and what the arch table marks harmful (TheRock#7081) -------


def with_features(elf: bytes, xnack: int, sramecc: int = 0) -> bytes:
    """The code object with its e_flags feature settings changed (code object V4+: 0 unsupported,
    1 any, 2 off, 3 on; LLVM AMDGPUUsage.rst, EF_AMDGPU_FEATURE_XNACK_V4 / SRAMECC_V4)."""
    assert elf[8] >= 2, "Triton writes code object V4 or later"
    flags = struct.unpack_from("<I", elf, 48)[0] & ~0xF00
    flags |= (xnack << 8) | (sramecc << 10)
    return elf[:48] + struct.pack("<I", flags) + elf[52:]


def test_elf_feature_settings_are_read_as_target_id_features(hsaco):
    elf = hsaco["gfx942"]
    assert smoke_runner._elf_amdgpu_target(with_features(elf, 3)) == "gfx942:xnack+"
    assert smoke_runner._elf_amdgpu_target(with_features(elf, 2, 3)) == "gfx942:sramecc+:xnack-"
    assert smoke_runner._elf_amdgpu_target(with_features(elf, 1, 1)) == "gfx942"  # 'any'


def test_the_variants_of_an_extension_are_reported(tmp_path, hsaco):
    path = tmp_path / "libmha.so"
    path.write_bytes(
        host_library(
            bundle([(hip_id("gfx942"), hsaco["gfx942"])]),
            bundle([(hip_id("gfx942:xnack+"), with_features(hsaco["gfx942"], 3))]),
        )
    )
    result = one(tmp_path, str(path), "gfx942")
    assert result["ok"], result["detail"]
    assert result["detail"] == "libmha.so: gfx942, gfx942:xnack+"
    [bad] = run(tmp_path, [{"name": "c", "device_code": str(path), "arch": "gfx942",
                            "harmful": "gfx942:xnack+"}])  # fmt: skip
    assert not bad["ok"]
    assert (
        "libmha.so [gfx942:xnack+] is a gfx942:xnack+ variant, which recipes/arches.yaml "
        in (bad["detail"])
    )


@pytest.fixture
def gfx90a_site(tmp_path: Path) -> Path:
    """torch's device files for gfx90a as torch 2.12.0+rocm7.14.0 laid them out: the plain kernel
    pack, and the xnack+/- packs of TheRock#7081."""
    root = tmp_path / "site"
    (root / "torch/.kpack").mkdir(parents=True)
    (root / "torch/__init__.py").write_text("")
    images = root / "torch/lib/aotriton.images/amd-gfx90a/flash"
    images.mkdir(parents=True)
    (images / "attn_fwd.aks2").write_bytes(b"AKS2")
    for name in ("torch_gfx90a.kpack", "torch_gfx90a:xnack+.kpack", "torch_gfx90a:xnack-.kpack"):
        (root / "torch/.kpack" / name).write_bytes(b"KPACK")
    return root


def _recipe_check(arch: str, layer: str = "pytorch-wheels") -> dict:
    plan = resolve(load_recipes(REPO), arch, "default")
    step = next(s for s in plan.steps if s.layer == layer)
    return next(c for c in step.smoke if "device_code" in c)


def test_the_recipe_check_fails_on_the_extra_gfx90a_xnack_kernel_packs(gfx90a_site):
    check = _recipe_check("gfx90a")
    assert check["harmful"] == "gfx90a:xnack+ gfx90a:xnack-"  # from recipes/arches.yaml
    [result] = run(gfx90a_site, [check])
    assert not result["ok"]
    assert "torch_gfx90a:xnack+.kpack is a gfx90a:xnack+ variant" in result["detail"]
    assert "torch_gfx90a:xnack-.kpack is a gfx90a:xnack- variant" in result["detail"]
    assert "marks harmful for this arch (harmful_code_variants): remove it" in result["detail"]


def test_the_recipe_check_passes_once_the_xnack_packs_are_gone(gfx90a_site):
    for sign in "+-":
        (gfx90a_site / f"torch/.kpack/torch_gfx90a:xnack{sign}.kpack").unlink()
    [result] = run(gfx90a_site, [_recipe_check("gfx90a")])
    assert result["ok"], result["detail"]
    assert "1 kernel packs for gfx90a (variants gfx90a)" in result["detail"]


def test_an_arch_without_harmful_variants_only_reports_them(site):
    (site / "torch/.kpack/torch_gfx1151:xnack-.kpack").write_bytes(b"KPACK")
    check = _recipe_check("gfx1151")
    assert check["harmful"] == ""
    [result] = run(site, [check])
    assert result["ok"], result["detail"]
    assert "2 kernel packs for gfx1151 (variants gfx1151, gfx1151:xnack-)" in result["detail"]


def test_the_pytorch_org_recipe_check_reads_libtorch_hip_and_the_images(tmp_path, hsaco):
    # pytorch.org's torch has no .kpack: its own GPU code is an offload bundle per arch inside
    # torch/lib/libtorch_hip.so, and AOTriton's images ship in the torch wheel.
    plan = resolve(load_recipes(REPO), "gfx1151", "pytorch-org")
    step = next(s for s in plan.steps if s.layer == "pytorch-org")
    # two checks: a rehearsal runs the library's on hipcc-built code and cannot show the images'
    images_check, check = [c for c in step.smoke if "device_code" in c]
    assert images_check["device_code"] == "torch:lib/aotriton.images"
    assert check["device_code"] == "torch:lib/libtorch_hip.so"
    root = tmp_path / "site"
    images = root / "torch/lib/aotriton.images/amd-gfx115x/flash"
    images.mkdir(parents=True)
    (root / "torch/__init__.py").write_text("")
    (images / "attn_fwd.aks2").write_bytes(b"AKS2" + hsaco["gfx1151"])
    lib = root / "torch/lib/libtorch_hip.so"
    lib.write_bytes(host_library(bundle([(hip_id("gfx942"), hsaco["gfx942"])])))
    [result] = run(root, [check])
    assert not result["ok"]  # built for gfx942 only
    assert "libtorch_hip.so holds device code for gfx942, not gfx1151" in result["detail"]
    lib.write_bytes(
        host_library(
            bundle([(hip_id("gfx942"), hsaco["gfx942"]), (hip_id("gfx1151"), hsaco["gfx1151"])])
        )
    )
    [result, images] = run(root, [check, images_check])
    assert result["ok"], result["detail"]
    assert images["ok"] and images["detail"] == "amd-gfx115x: 1 images", images["detail"]
