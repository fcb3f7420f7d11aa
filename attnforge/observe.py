"""What a torch image is, read from its files: the facts the recipes can only infer.

    python3 observe.py /opt/attnforge/versions.json

run as the last step of each torch layer (pytorch-wheels, pytorch-org, pytorch-source), adds
``"observed"`` to the image's versions manifest: the AOTriton inside torch (the version of its
``torch/lib/libaotriton_v2.so.X.Y.Z``), the gfx targets of the offload bundles in
``torch/lib/libtorch_hip.so``, the Triton distribution installed beside torch and the HIP version
torch was built with (``torch/version.py``). Nothing is imported (no GPU, no ROCm runtime
needed). The `observe` smoke check compares them with what the recipe inferred
(docs/build-checks.md), and `invoke pins.update --observed` proposes the corrected recipe.

Copied into the image's build context, so stdlib only, self-contained, Python 3.8 safe.
"""

import glob
import json
import os
import re
import sys
from importlib import metadata

_SONAME = re.compile(r"^libaotriton_v2\.so\.(\d+\.\d+\.\d+)$")
_HIP = re.compile(r"""^hip\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", re.M)
# An offload bundle entry id: <kind>-amdgcn-amd-amdhsa--<target id> (clang-offload-bundler).
_TARGET = re.compile(rb"amdgcn-amd-amdhsa--(gfx[0-9a-f]+)")
TRITONS = ("triton", "triton-rocm", "pytorch-triton-rocm")


def aotriton_in(lib_dir):
    """(version, file) of the AOTriton runtime torch carries, or (None, None)."""
    found = []
    for path in glob.glob(os.path.join(lib_dir, "libaotriton_v2.so*")):
        m = _SONAME.match(os.path.basename(path))
        if m:
            found.append((tuple(int(x) for x in m.group(1).split(".")), m.group(1), path))
    if not found:
        return None, None
    _, version, path = max(found)
    return version, path


def aotriton_tag(version):
    """The release tag of an AOTriton runtime version: 0.13.0 -> 0.13b, 0.14.2 -> 0.14.2b."""
    major, minor, patch = version.split(".")
    return f"{major}.{minor}{'.' + patch if patch != '0' else ''}b"


def hip_of(torch_dir):
    """The HIP version torch/version.py records (`hip = '7.14.60850'`), or None."""
    try:
        with open(os.path.join(torch_dir, "version.py"), encoding="utf-8") as f:
            m = _HIP.search(f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def gfx_targets(path, chunk=1 << 24):
    """The gfx targets named by the offload bundle entries of a library, read in chunks; an
    empty list where there are none or the bundles are compressed (their ids are then inside the
    compressed payload: the device_code smoke check reads those)."""
    found, tail = set(), b""
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(chunk), b""):
                data = tail + block
                found.update(m.decode() for m in _TARGET.findall(data))
                tail = data[-64:]
    except OSError:
        return []
    return sorted(found)


def triton_installed():
    for name in TRITONS:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return None


def read_facts(torch_dir):
    lib = os.path.join(torch_dir, "lib")
    version, path = aotriton_in(lib)
    return {
        "aotriton": {"version": version, "tag": aotriton_tag(version) if version else None,
                     "file": path},
        "torch_gfx_targets": gfx_targets(os.path.join(lib, "libtorch_hip.so")),
        "triton": triton_installed(),
        "hip": hip_of(torch_dir),
    }  # fmt: skip


def _torch_dir():
    for path in sys.path:
        candidate = os.path.join(path, "torch")
        if os.path.isfile(os.path.join(candidate, "version.py")):
            return candidate
    return None


def main(argv):
    manifest = argv[1]
    torch_dir = _torch_dir()
    if torch_dir is None:
        print("observe: no torch installed", file=sys.stderr)
        return 1
    with open(manifest, encoding="utf-8") as f:
        data = json.load(f)
    data["observed"] = read_facts(torch_dir)
    with open(manifest + ".new", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(manifest + ".new", manifest)
    print(json.dumps(data["observed"], sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
