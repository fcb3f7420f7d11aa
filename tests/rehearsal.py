"""A rehearsal mirror for the AMD stacks: stand-in wheels with AMD's real names, versions, local
labels, extras and Requires-Dist as the recipes pin them, and contents that make the rehearsal
honest where they can:

- torch is the real CPU torch of the wheelhouse relabelled (`import torch` really runs), with
  torch.version.hip set to the ROCm version so that build scripts take their ROCm branches (e.g.
  flash-attention's setup.py reads torch.utils.cpp_extension.IS_HIP_EXTENSION): hence every smoke
  check that asks whether torch is a HIP build is "not rehearsable";
- triton is the real Triton of the line the stack's torch requires (recipes/tritons.yaml: 3.7 for
  torch 2.12-2.13, 3.8 for 2.14, 3.9 for 2.15), PyPI's wheel relabelled (its CPU interpreter
  runs, and flash_attn's import meets that line's autotune checks);
- `rocm` carries a working `rocm-sdk` command (version, targets, path --root, init) over the
  stand-in SDK parts (rocm-sdk-core, -libraries, -devel with a hipcc that refuses to compile,
  -device-<arch>);
- torchvision, torchaudio and the amd-*-device-<arch> wheels are metadata and file layout only
  (AOTriton's images folder, the .kpack overlay), no compiled code;
- pytorch.org's torch carries a libtorch_hip.so whose offload bundle holds real code objects for
  the arches, compiled by Debian experimental's hipcc (`tools/setup.sh hip-tools`), so its
  device-code check reads real AMDGPU ELF (the code is a stand-in kernel, not PyTorch's);
- flash-attention's source is Dao-AILab's tree from the flash-attn sdist on PyPI (v2.8.3), which
  holds the same Triton AMD backend module (flash_attn/flash_attn_triton_amd), committed to a
  small git repository that stands in for ROCm's fork (its commit is given with --set).
- Dao-AILab's own tree (the dao stack) is the same sdist relabelled 2.8.4 (the version its pinned
  commit declares), with its third_party/aiter submodule: a gitlink to a small repository that
  stands in for ROCm/aiter, named by an absolute URL in .gitmodules as upstream's is, so the
  layer's `git submodule update` fetches it from the mirror (its commit is given with --set).

Built once per machine into ~/.cache/attnforge/rehearsal/<key> (the key covers this file and the
source wheels), so a warm run reuses them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tarfile
import urllib.request
import zipfile
from pathlib import Path

from tests.conftest import TRITONS_DIR

TAG = "py3-none-any"
FA_SDIST = ("https://files.pythonhosted.org/packages/3b/b2/8d76c41ad7974ee264754709c22963447f7f8134613fd9ce80984ed0dab7/"
            "flash_attn-2.8.3.tar.gz")  # fmt: skip
FA_SDIST_SHA256 = None  # checked against PyPI's own page hash on download (see fetch_sdist)


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "attnforge" / "rehearsal"


def _put(zf: zipfile.ZipFile, name: str, data: bytes | str) -> None:
    """One entry with a fixed date, so that a stand-in built twice is the same bytes."""
    info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = (0o755 if "/bin/" in name else 0o644) << 16
    zf.writestr(info, data)


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def _metadata(name: str, version: str, requires: list[str], extras: list[str]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             "Summary: attnforge rehearsal stand-in (not AMD's wheel)"]  # fmt: skip
    lines += [f"Provides-Extra: {e}" for e in extras]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return "\n".join(lines) + "\n"


def make_wheel(
    dest: Path, name: str, version: str, files: dict[str, bytes], *, requires: list[str] = (),
    extras: list[str] = (), scripts: dict[str, str] | None = None,
) -> Path:  # fmt: skip
    """A pure-Python wheel with these files and this metadata."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    meta = {
        f"{info}/METADATA": _metadata(name, version, list(requires), list(extras)).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: attnforge-rehearsal\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if scripts:
        body = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
        meta[f"{info}/entry_points.txt"] = body.encode()
    content = {**files, **meta}
    record = [_record_line(p, d) for p, d in content.items()] + [f"{info}/RECORD,,"]
    path = dest / f"{stem}-{TAG}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p, d in content.items():
            _put(zf, p, d)
        _put(zf, f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def relabel(
    src: Path, dest: Path, version: str, *, add_requires: list[str] = (), extras: list[str] = (),
    replace: dict[str, bytes] | None = None, rename: str | None = None, drop: tuple[str, ...] = (),
) -> Path:  # fmt: skip
    """A copy of a real wheel under another version (its local label) or project name, with more
    Requires-Dist, files replaced and the folders ``drop`` (prefixes ending in /) left out, without
    recompressing the rest (zip -d, then append)."""
    old_name, old_version, tail = src.name.split("-", 2)
    name = rename.replace("-", "_") if rename else old_name
    new = dest / f"{name}-{version}-{tail}"
    shutil.copy2(src, new)
    old_info, new_info = f"{old_name}-{old_version}.dist-info", f"{name}-{version}.dist-info"
    with zipfile.ZipFile(src) as zf:
        metadata = zf.read(f"{old_info}/METADATA").decode()
        others = {n: zf.read(n) for n in zf.namelist() if n.startswith(old_info + "/")
                  and n.rsplit("/", 1)[1] not in ("METADATA", "RECORD")}  # fmt: skip
        record = zf.read(f"{old_info}/RECORD").decode().splitlines()
    replace = dict(replace or {})
    gone = [f"{d}*" for d in drop]
    subprocess.run(["zip", "-q", "-d", str(new), f"{old_info}/*", *replace, *gone], check=True)
    head, sep, body = metadata.partition("\n\n")
    head = head.replace(f"Version: {old_version}", f"Version: {version}", 1)
    if rename:
        head = "\n".join(
            f"Name: {rename}" if ln.startswith("Name: ") else ln for ln in head.splitlines()
        )
    head += "".join(f"\nProvides-Extra: {e}" for e in extras)
    head += "".join(f"\nRequires-Dist: {r}" for r in add_requires)
    files = {f"{new_info}/{n.rsplit('/', 1)[1]}": d for n, d in others.items()}
    files[f"{new_info}/METADATA"] = (head + sep + body).encode()
    files.update(replace)
    kept = [
        ln
        for ln in record
        if ln and not ln.startswith((old_info + "/", *drop)) and ln.split(",")[0] not in replace
    ]
    lines = kept + [_record_line(p, d) for p, d in files.items()] + [f"{new_info}/RECORD,,"]
    with zipfile.ZipFile(new, "a", zipfile.ZIP_DEFLATED) as zf:
        for p, d in files.items():
            _put(zf, p, d)
        _put(zf, f"{new_info}/RECORD", "\n".join(lines) + "\n")
    return new


ROCM_SDK_CLI = '''"""rocm-sdk (attnforge rehearsal stand-in): the subcommands the Dockerfiles use."""
import importlib.metadata as md
import os
import shutil
import sys
from pathlib import Path

import _rocm_sdk_core


def root():
    return Path(_rocm_sdk_core.__file__).parent


def targets():
    names = (d.metadata["Name"] for d in md.distributions())
    return sorted(n[len("rocm-sdk-device-"):] for n in names if n and n.startswith("rocm-sdk-device-"))


def init():
    try:
        import _rocm_sdk_devel
    except ImportError:
        sys.exit("rocm-sdk init: rocm-sdk-devel is not installed (install rocm[devel])")
    shutil.copytree(Path(_rocm_sdk_devel.__file__).parent / "tree", root(), dirs_exist_ok=True)
    for tool in (root() / "bin").iterdir():
        tool.chmod(0o755)
    print(f"rocm-sdk init: devel tree expanded into {root()}")


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = args[0] if args else "help"
    if cmd == "version":
        print(md.version("rocm-sdk-core"))
    elif cmd == "targets":
        print(";".join(targets()))
    elif cmd == "path" and args[1:] == ["--root"]:
        print(root())
    elif cmd == "init":
        init()
    else:
        sys.exit(f"rocm-sdk (rehearsal stand-in): unknown command {args!r}")
'''

HIPCC = b"""#!/bin/sh
echo "hipcc: an attnforge rehearsal stand-in (rocm-sdk-devel); it cannot compile HIP" >&2
exit 1
"""


def torch_version_py(torch_v: str, rocm: str) -> bytes:
    """torch/version.py of a stand-in: AMD's version, and torch.version.hip set (a parseable
    version, as flash-attention's setup.py reads it) so that build scripts take their ROCm path."""
    return (f"__version__ = '{torch_v}'\ndebug = False\ncuda = None\ngit_version = 'rehearsal'\n"
            f"hip = '{rocm}-rehearsal'\nxpu = None\n").encode()  # fmt: skip


def rocm_wheels(dest: Path, rocm: str, arches: list[str]) -> list[Path]:
    """The `rocm` meta package (which lists itself, as AMD's does: pytorch#193979) and its parts."""
    devices = [f"device-{a}" for a in arches]
    meta_requires = [f"rocm-sdk-core=={rocm}", f'rocm-sdk-libraries=={rocm} ; extra == "libraries"',
                     f'rocm-sdk-devel=={rocm} ; extra == "devel"',
                     f'rocm[libraries]=={rocm} ; extra == "devel"']  # fmt: skip
    meta_requires += [f'rocm-sdk-device-{a}=={rocm} ; extra == "device-{a}"' for a in arches]
    out = [make_wheel(dest, "rocm", rocm, {"rocm_sdk/__init__.py": ROCM_SDK_CLI.encode()},
                      requires=meta_requires, extras=["libraries", "devel", *devices],
                      scripts={"rocm-sdk": "rocm_sdk:main"})]  # fmt: skip
    out.append(make_wheel(dest, "rocm-sdk-core", rocm, {"_rocm_sdk_core/__init__.py": b"",
                                                        "_rocm_sdk_core/bin/.keep": b""}))  # fmt: skip
    out.append(make_wheel(dest, "rocm-sdk-libraries", rocm, {"_rocm_sdk_libraries/__init__.py": b""},
                          requires=[f"rocm-sdk-core=={rocm}"]))  # fmt: skip
    out.append(make_wheel(dest, "rocm-sdk-devel", rocm, {"_rocm_sdk_devel/__init__.py": b"",
                                                         "_rocm_sdk_devel/tree/bin/hipcc": HIPCC},
                          requires=[f"rocm-sdk-core=={rocm}"]))  # fmt: skip
    for a in arches:
        out.append(make_wheel(dest, f"rocm-sdk-device-{a}", rocm,
                              {f"_rocm_sdk_device_{a}/__init__.py": b""}))  # fmt: skip
    return out


def torch_wheels(dest: Path, wheelhouse: Path, pins: dict[str, str], rocm: str, arches: list[str],
                 family: dict[str, str]) -> list[Path]:  # fmt: skip
    """torch (the real CPU build relabelled), triton (real, relabelled), torchvision, torchaudio
    and the device wheels, with AMD's names, labels, extras and Requires-Dist."""
    torch_v, vision_v, audio_v = (
        pins["TORCH_VERSION"],
        pins["TORCHVISION_VERSION"],
        pins["TORCHAUDIO_VERSION"],
    )
    label = torch_v.split("+", 1)[1]
    triton_v = f"{torch_triton(torch_v)}+{label}"
    triton_src = triton_wheel(triton_v)
    version_py = torch_version_py(torch_v, rocm)
    devices = [f"device-{a}" for a in arches]
    torch_src = next(wheelhouse.glob("torch-*+cpu-*.whl"))
    out = [relabel(torch_src, dest, torch_v, extras=devices, replace={"torch/version.py": version_py},
                   add_requires=[f"rocm[libraries]=={rocm}", f"triton=={triton_v}",
                                 *(f'amd-torch-device-{a}=={torch_v} ; extra == "device-{a}"' for a in arches)]),
           relabel(triton_src, dest, triton_v, drop=NVIDIA_TOOLCHAIN)]  # fmt: skip
    out.append(make_wheel(dest, "torchvision", vision_v,
                          {"torchvision/__init__.py": f"__version__ = '{vision_v}'\n".encode()},
                          requires=[f"torch=={torch_v}", *(f'amd-torchvision-device-{a}=={vision_v} ; extra == "device-{a}"' for a in arches)],
                          extras=devices))  # fmt: skip
    out.append(make_wheel(dest, "torchaudio", audio_v,
                          {"torchaudio/__init__.py": f"__version__ = '{audio_v}'\n".encode()},
                          requires=[f"torch=={torch_v}"]))  # fmt: skip
    for a in arches:
        images = f"torch/lib/aotriton.images/amd-{family[a]}/__signature__"
        out.append(make_wheel(dest, f"amd-torch-device-{a}", torch_v,
                              {images: b"rehearsal stand-in: no device code\n",
                               f"torch/.kpack/torch_{a}.kpack": b"rehearsal stand-in\n"}))  # fmt: skip
        out.append(make_wheel(dest, f"amd-torchvision-device-{a}", vision_v,
                              {f"torchvision/.kpack/torchvision_{a}.kpack": b"rehearsal stand-in\n"}))  # fmt: skip
    return out


# What an AMD build of Triton does not ship: the NVIDIA toolchain of PyPI's wheel (ptxas, CUPTI,
# libdevice; about 360 MB installed of some 900), left out of every stand-in Triton. Its Python
# (the nvidia backend's compiler and driver modules) stays: `import triton` finds its backends.
NVIDIA_TOOLCHAIN = ("triton/backends/nvidia/bin/", "triton/backends/nvidia/lib/")


def triton_wheel(version: str) -> Path:
    """The real wheel of the Triton line ``version`` belongs to (the release itself where
    `tools/setup.sh tritons` has it, else that line's newest there), which a stand-in Triton of
    that version is relabelled from: a stack's flash-attention import then runs on the Python code
    of the Triton line its torch requires (Triton 3.9 refuses autotune keys 3.8 ignored)."""
    folder = TRITONS_DIR / "wheels"
    line = version.split("+")[0].split(".")[:2]
    found = {w.name.split("-")[1]: w for w in folder.glob("triton-*.whl")}
    exact = found.get(version.split("+")[0])
    same = sorted((v for v in found if v.split(".")[:2] == line),
                  key=lambda v: [int(x) for x in v.split(".")[:3]])  # fmt: skip
    if exact is None and not same:
        raise RuntimeError(
            f"no triton {'.'.join(line)}.x wheel in {folder} (tools/setup.sh tritons)"
        )
    return exact or found[same[-1]]


def torch_triton(torch_v: str) -> str:
    """The Triton torch ``torch_v``'s release requires (recipes/tritons.yaml): pytorch.org's
    triton-rocm of that version."""
    from attnforge.tritons import load_table

    line = ".".join(torch_v.split("+")[0].split(".")[:2])
    row = next(
        (r for r in load_table(Path(__file__).resolve().parents[1]).torch if r.torch == line), None
    )
    if row is None:
        raise RuntimeError(f"recipes/tritons.yaml has no row for torch {line}")
    return row.triton


def pytorch_org_wheels(dest: Path, wheelhouse: Path, pins: dict[str, str], arches: list[str],
                       family: dict[str, str]) -> list[Path]:  # fmt: skip
    """pytorch.org's ROCm channels: torch and torchvision (+rocm7.14, +rocm10.0) requiring
    rocm[libraries,device-all]==<line>.* and the triton-rocm its release requires, the SDK parts,
    and on 7.14 the rocm 7.14.0 meta package that requires itself (pytorch#193979) beside the
    fixed 7.14.0.post1 the layer pins."""
    torch_v, vision_v, meta = (
        pins["TORCH_VERSION"],
        pins["TORCHVISION_VERSION"],
        pins["ROCM_VERSION"],
    )
    release = meta.split(".post")[0]
    triton_v = torch_triton(torch_v)
    images = {
        f"torch/lib/aotriton.images/amd-{family[a]}/__signature__": b"rehearsal stand-in\n"
        for a in arches
    }
    images["torch/lib/libtorch_hip.so"] = device_library(dest.parent / "hip", arches)
    version_py = torch_version_py(torch_v, release)
    out = [relabel(next(wheelhouse.glob("torch-*+cpu-*.whl")), dest, torch_v,
                   replace={"torch/version.py": version_py, **images},
                   add_requires=[f"rocm[libraries,device-all]=={release.rsplit('.', 1)[0]}.*", f"triton-rocm=={triton_v}"]),
           relabel(triton_wheel(triton_v), dest, triton_v, rename="triton-rocm", drop=NVIDIA_TOOLCHAIN)]  # fmt: skip
    out.append(make_wheel(dest, "torchvision", vision_v,
                          {"torchvision/__init__.py": f"__version__ = '{vision_v}'\n".encode()},
                          requires=[f"torch=={torch_v}"]))  # fmt: skip
    parts = [f"rocm-sdk-core=={release}", f'rocm-sdk-libraries=={release} ; extra == "libraries"']
    parts += [f'rocm-sdk-device-{a}=={release} ; extra == "device-all"' for a in arches]
    extras = ["libraries", "device-all"]
    if meta != release:  # 7.14.0 lists itself (the trap), beside the .postN the layer pins
        out.append(make_wheel(dest, "rocm", release, {"rocm_sdk/__init__.py": ROCM_SDK_CLI.encode()},
                              requires=[*parts, f"rocm=={release}"], extras=extras))  # fmt: skip
    out.append(make_wheel(dest, "rocm", meta, {"rocm_sdk/__init__.py": ROCM_SDK_CLI.encode()},
                          requires=parts, extras=extras))  # fmt: skip
    out.append(make_wheel(dest, "rocm-sdk-core", release, {"_rocm_sdk_core/__init__.py": b""}))
    out.append(
        make_wheel(dest, "rocm-sdk-libraries", release, {"_rocm_sdk_libraries/__init__.py": b""})
    )
    for a in arches:
        out.append(
            make_wheel(
                dest, f"rocm-sdk-device-{a}", release, {f"_rocm_sdk_device_{a}/__init__.py": b""}
            )
        )
    return out


HIP_TOOLS_IMAGE = os.environ.get("HIP_TOOLS_IMAGE", "attnforge-local/hip-tools:sid")
STANDIN_KERNEL = """#include <hip/hip_runtime.h>
// Rehearsal stand-in for the device code of pytorch.org's libtorch_hip.so: one kernel, compiled
// by a real hipcc for each arch, so the device-code check reads real AMDGPU code objects.
extern "C" __global__ void attnforge_rehearsal(float* x) { x[threadIdx.x] *= 2.0f; }
"""


def device_library(work: Path, arches: list[str]) -> bytes:
    """A shared library whose offload bundle holds a real code object per arch, compiled by
    Debian experimental's hipcc in HIP_TOOLS_IMAGE (tools/setup.sh hip-tools)."""
    found = subprocess.run(["docker", "image", "inspect", HIP_TOOLS_IMAGE], capture_output=True)
    if found.returncode != 0:
        raise RuntimeError(f"no {HIP_TOOLS_IMAGE} image for the stand-ins' device code; run "
                           "tools/setup.sh hip-tools")  # fmt: skip
    work.mkdir(parents=True, exist_ok=True)
    (work / "k.hip").write_text(STANDIN_KERNEL)
    offload = [f"--offload-arch={a}" for a in arches]
    subprocess.run(["docker", "run", "--rm", "--network", "none", "-v", f"{work}:/work",
                    HIP_TOOLS_IMAGE, "hipcc", *offload, "-shared", "-fPIC", "-o",
                    "/work/libtorch_hip.so", "/work/k.hip"], check=True, capture_output=True)  # fmt: skip
    return (work / "libtorch_hip.so").read_bytes()


# flash-attn 2.8.3's bwd_prefill_onekernel.py tunes three kernels on keys that are not their
# arguments (IS_CAUSAL, MAX_SEQLENS_Q, ...): Triton 3.8 and older drop such names silently, Triton 3.9
# refuses them when the module is imported (triton-lang/triton@20e6ba86; ROCm/aiter#5372 fixed
# aiter's copy of this backend, 2026-09-09). The tree the flash-attention layer pins, ROCm's fork at
# 16d5154a, has no such file and imports on 3.7.1, 3.8.0 and 3.9.0 (docs/flash-attention-forks.md),
# so the stand-in keeps, of each key, the names that are arguments: what 3.8 tuned on.
ONEKERNEL = "flash_attn/flash_attn_triton_amd/bwd_prefill_onekernel.py"


def keys_that_are_arguments(text: str) -> str:
    """``text`` (a module) with each ``@triton.autotune(..., key=NAME, ...)`` of a ``@triton.jit``
    function narrowed to the names among that function's arguments."""
    import re

    def narrow(m: re.Match) -> str:
        names = re.sub(r"#[^\n]*", "", m.group("args")).split(",")
        args = [a.split(":")[0].split("=")[0].strip() for a in names]
        kept = f"[k for k in {m.group('key')} if k in {tuple(a for a in args if a)!r}]"
        return m.group(0).replace(f"key={m.group('key')},", f"key={kept},", 1)

    pattern = (r"@triton\.autotune\((?:(?!@triton).)*?key=(?P<key>\w+),.*?\)\s*@triton\.jit\s*"
               r"def \w+\((?P<args>.*?)\):")  # fmt: skip
    return re.sub(pattern, narrow, text, flags=re.S)


def flash_attention_repo(dest: Path, ca_cert: str | None) -> tuple[Path, str]:
    """A git repository of the flash-attn 2.8.3 sdist from PyPI (without csrc/, which only CK and
    CUDA builds compile), its autotune keys narrowed to arguments (above); returns it and its
    commit."""
    repo = dest / "flash-attention-keys"  # "flash-attention": made before the keys were narrowed
    if not (repo / ".git").is_dir():
        sdist = dest / "flash_attn-2.8.3.tar.gz"
        if not sdist.is_file():
            import ssl

            ctx = ssl.create_default_context(cafile=ca_cert) if ca_cert else None
            with urllib.request.urlopen(FA_SDIST, context=ctx, timeout=120) as r:
                sdist.write_bytes(r.read())
        with tarfile.open(sdist) as tf:
            members = [
                m for m in tf.getmembers() if "/csrc/" not in m.name and "/hopper/" not in m.name
            ]
            tf.extractall(dest / "sdist", members=members, filter="data")
        shutil.rmtree(repo, ignore_errors=True)
        shutil.move(dest / "sdist" / "flash_attn-2.8.3", repo)
        onekernel = repo / ONEKERNEL
        onekernel.write_text(keys_that_are_arguments(onekernel.read_text()))
        env = {
            **os.environ,
            "GIT_AUTHOR_DATE": "2025-08-14T00:00:00Z",
            "GIT_COMMITTER_DATE": "2025-08-14T00:00:00Z",
        }
        for args in (["init", "-q"], ["add", "-A"],
                     ["-c", "user.name=rehearsal", "-c", "user.email=rehearsal@attnforge",
                      "commit", "-qm", "flash-attn 2.8.3 sdist (PyPI), rehearsal stand-in (autotune keys narrowed to arguments)"]):  # fmt: skip
            subprocess.run(["git", *args], cwd=repo, check=True, env=env, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    return repo, commit


AITER_URL = "https://github.com/ROCm/aiter.git"
_GIT_ENV = {"GIT_AUTHOR_DATE": "2025-08-14T00:00:00Z", "GIT_COMMITTER_DATE": "2025-08-14T00:00:00Z",
            "GIT_AUTHOR_NAME": "rehearsal", "GIT_AUTHOR_EMAIL": "rehearsal@attnforge",
            "GIT_COMMITTER_NAME": "rehearsal", "GIT_COMMITTER_EMAIL": "rehearsal@attnforge"}  # fmt: skip


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, **_GIT_ENV})  # fmt: skip
    return proc.stdout.strip()


def dao_repos(dest: Path, ca_cert: str | None) -> tuple[Path, str, Path]:
    """(Dao-AILab's stand-in repository, its commit, the aiter stand-in repository): the flash-attn
    sdist's tree relabelled 2.8.4 with a third_party/aiter submodule (module docstring)."""
    # Named by this file's hash, as the wheel sets are: a changed recipe makes them anew.
    key = _source_key("dao")
    repo, aiter = dest / f"flash-attention-dao-{key}", dest / f"aiter-{key}"
    for old in [*dest.glob("flash-attention-dao-*"), *dest.glob("aiter-*")]:
        if old not in (repo, aiter):
            shutil.rmtree(old, ignore_errors=True)
    if not (aiter / ".git").is_dir():
        shutil.rmtree(aiter, ignore_errors=True)
        (aiter / "aiter").mkdir(parents=True)
        (aiter / "aiter" / "__init__.py").write_text(
            "# Rehearsal stand-in for ROCm/aiter: fetched as flash-attention's third_party/aiter\n"
            "# submodule from the mirror; the stand-in Dao tree (flash-attn 2.8.3's) does not use it.\n"
        )
        _git(aiter, "init", "-q")
        _git(aiter, "add", "-A")
        _git(aiter, "commit", "-qm", "aiter, rehearsal stand-in")
    aiter_commit = _git(aiter, "rev-parse", "HEAD")
    if not (repo / ".git").is_dir():
        shutil.rmtree(repo, ignore_errors=True)
        fa, _ = flash_attention_repo(dest, ca_cert)
        _git(dest, "clone", "-q", str(fa), str(repo))
        init = repo / "flash_attn" / "__init__.py"
        init.write_text(init.read_text().replace('__version__ = "2.8.3"', '__version__ = "2.8.4"'))
        _git(repo, "config", "-f", ".gitmodules", "submodule.third_party/aiter.path",
             "third_party/aiter")  # fmt: skip
        _git(repo, "config", "-f", ".gitmodules", "submodule.third_party/aiter.url", AITER_URL)
        _git(repo, "add", "flash_attn/__init__.py", ".gitmodules")
        # the gitlink, as `git submodule add` leaves it (no work tree there: not `add -A`)
        _git(repo, "update-index", "--add", "--cacheinfo",
             f"160000,{aiter_commit},third_party/aiter")  # fmt: skip
        _git(repo, "commit", "-qm",
             "Dao-AILab's tree as flash-attn 2.8.4 with its third_party/aiter submodule, stand-in")  # fmt: skip
    return repo, _git(repo, "rev-parse", "HEAD"), aiter


def _source_key(*parts: str) -> str:
    """<this file's hash>-<the inputs' hash>: stand-ins made by an older version of this file are
    recognised by the first half and removed (each set is about 360 MB: torch and Triton)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return (
        f"{hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]}-{digest.hexdigest()[:12]}"
    )


def _prune(root: Path, key: str) -> None:
    """Remove the stand-in sets an older version of this file made."""
    mine = key.split("-")[0]
    for old in root.glob("*/wheels"):
        if not old.parent.name.startswith(mine + "-"):
            shutil.rmtree(old.parent, ignore_errors=True)


def standins(wheelhouse: Path, pins: dict[str, str], arches: list[str], family: dict[str, str],
             ca_cert: str | None) -> tuple[Path, Path, str]:  # fmt: skip
    """(folder of stand-in wheels, flash-attention repository, its commit) for one channel's pins
    and these arches, built once into the cache (a folder is renamed into place when complete)."""
    sources = sorted(
        p.name for p in wheelhouse.glob("*.whl") if p.name.startswith(("torch-", "triton-"))
    ) + sorted(p.name for p in (TRITONS_DIR / "wheels").glob("triton-*.whl"))
    key = _source_key(*sources, *sorted(f"{k}={v}" for k, v in pins.items()), *arches)
    root = cache_root()
    done = root / key
    _prune(root, key)
    if not (done / "wheels").is_dir():
        work = root / f"{key}.partial-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        (work / "wheels").mkdir(parents=True)
        if "TORCHVISION_VERSION" not in pins:  # a stack with no torch wheels (the source stack)
            rocm_wheels(work / "wheels", pins["ROCM_VERSION"], arches)
        elif "TORCHAUDIO_VERSION" in pins:  # AMD's channels
            rocm_wheels(work / "wheels", pins["ROCM_VERSION"], arches)
            torch_wheels(work / "wheels", wheelhouse, pins, pins["ROCM_VERSION"], arches, family)
        else:  # pytorch.org's
            pytorch_org_wheels(work / "wheels", wheelhouse, pins, arches, family)
        shutil.rmtree(done, ignore_errors=True)
        work.rename(done)
    repo, commit = flash_attention_repo(root, ca_cert)
    return done / "wheels", repo, commit
