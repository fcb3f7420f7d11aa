"""Runs a layer's smoke checks inside its freshly built image.

Sent to the container on stdin (`python3 - <checks-json>`), so it must stay stdlib-only,
self-contained and Python 3.8 safe. Prints one JSON line per check and exits 1 if any failed.

Check kinds (attnforge/recipes.py SmokeCheck; docs/build-checks.md says what each one catches):
dist, absent, torch_build, python, wheel_set (the coupled ROCm wheels are one build),
device_code (the arch's GPU code objects are present, read without a GPU or ROCm tools; their
target-id variants are reported, and ones the arch table marks harmful fail) and linkage (a
native extension's libraries resolve and its undefined symbols are defined, read with the
image's binutils) and hip_runtime (one HIP runtime in the process: the libamdhip64 torch maps is
the one rocm_sdk names, and no second one lies where torch or Triton could load it).
"""

import fnmatch
import glob
import importlib.util
import io
import json
import os
import re
import struct
import subprocess
import sys
import zlib
from importlib import metadata


def _canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed():
    return {
        _canon(d.metadata["Name"]): d.version
        for d in metadata.distributions()
        if d.metadata["Name"]
    }


# ---------------------------------------------------------------------------- wheel_set
#
# AMD's torch, torchvision, torchaudio, their amd-*-device-* wheels and the rocm-sdk-* wheels are
# built together: torch-side wheels carry the ROCm build as a local label (+rocm10.1.0), the
# rocm-sdk-* wheels as their release (10.1.0; stable torch accepts a later patch of it, rocm
# ~=10.1.0: TheRock#7347, pytorch#194102). Any wheel of another build breaks at run time, and
# late: a missing family device wheel as a deferred hipErrorInvalidValue in fused SDPA
# (pytorch#194498), a missing [device-<arch>] as hipErrorInvalidImage (TheRock#7839), a mixed
# torch/torchvision as "operator torchvision::nms does not exist" (TheRock#5374), and
# `pip install --upgrade` may move torch from +rocm10.x to +rocm7.x (TheRock#7183).

_REQ = re.compile(
    r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?\s*(?:===?\s*([^\s;,)]+))?"
)
_EXTRA_MARK = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")
_PLATFORM_MARK = re.compile(r"""sys_platform\s*==\s*['"]([^'"]+)['"]""")


def _sdk_side(name):
    """rocm and rocm-sdk-* carry the ROCm release as their version; the rest a +rocm label."""
    return name == "rocm" or name.startswith("rocm-sdk-")


def _label(version):
    return version.partition("+")[2]


_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)$")
# pytorch.org's ROCm wheels carry the ROCm minor only (+rocm7.14) and require
# rocm[libraries,device-all]==7.14.* (pytorch#190276, RFC pytorch#191688).
_MINOR = re.compile(r"(\d+)\.(\d+)$")
_POST = re.compile(r"\.post\d+$")


def _sdk_release(version):
    """An SDK-side version as the release it belongs to: a .postN republishes a release's
    metadata (rocm 7.14.0.post1 drops 7.14.0's self-dependency, TheRock#7461, over the
    rocm-sdk-* 7.14.0 wheels: TheRock#7362), so it counts as that release."""
    return _POST.sub("", version)


def _sdk_fits(version, release):
    """Whether an SDK-side version may sit under a torch built against `release`.

    Stable torch requires `rocm ~=X.Y.Z` since TheRock#7347 (merged 2026-08-13; PyTorch's CI
    followed in pytorch#194102), and TheRock's _rocm_init.py checks X.Y.*: a later patch of the
    same minor release (10.1.1 under +rocm10.1.0) is valid, another minor (10.2.0) or an
    earlier patch is not. pytorch.org's torch (+rocm7.14) takes any release of its minor
    (==7.14.*). Pre-releases and nightlies (10.2.0a20261006) stay coupled exactly."""
    version = _sdk_release(version)
    if version == release:
        return True
    have = _RELEASE.match(version)
    minor = _MINOR.match(release)
    if have and minor:
        return [int(x) for x in have.groups()[:2]] == [int(x) for x in minor.groups()]
    want = _RELEASE.match(release)
    if not have or not want:
        return False
    h, w = [int(x) for x in have.groups()], [int(x) for x in want.groups()]
    return h[:2] == w[:2] and h[2] >= w[2]


def _sdk_rule(release):
    """What torch built against `release` requires of the SDK, in words."""
    if _MINOR.match(release):
        return f"torch requires rocm=={release}.* (RFC pytorch#191688)"
    if _RELEASE.match(release):
        return (
            f"torch requires rocm ~={release}, so {release[: release.rfind('.')]}.x "
            f"from {release} on (TheRock#7347)"
        )
    return f"expected {release}"


def _extra_requires(dist_name, extra):
    """(name, pinned version or None) of each Requires-Dist that `dist_name[extra]` adds, read
    from the installed wheel's own METADATA; None if the wheel offers no such extra."""
    meta = metadata.distribution(dist_name).metadata
    provided = {_canon(e) for e in (meta.get_all("Provides-Extra") or [])}
    if _canon(extra) not in provided:
        return None
    out = []
    for req in meta.get_all("Requires-Dist") or []:
        spec, _, marker = req.partition(";")
        extras = {_canon(e) for e in _EXTRA_MARK.findall(marker)}
        if _canon(extra) not in extras:
            continue
        # Enough of PEP 508 for AMD's markers: device wheels may be limited to one platform.
        platforms = _PLATFORM_MARK.findall(marker)
        if platforms and sys.platform not in platforms:
            continue
        m = _REQ.match(spec)
        if m:
            out.append((_canon(m.group(1)), m.group(2)))
    return out


def _family_word(name, arch):
    if arch and re.match(r"amd-[a-z]+-device-", name) and not name.endswith("-" + arch):
        return "the family device wheel "
    return ""


def check_wheel_set(spec, installed):
    entries, error = _set_entries(spec)
    if error:
        return False, error
    anchor, arch = entries[0][0], spec.get("aotriton_arch") or ""
    problems = []
    error = _add_extras(spec.get("extras") or "", installed, entries, problems)
    if error:
        return False, error
    have = installed.get(anchor)
    if have is None:
        return False, f"{anchor} is not installed"
    label = _label(have)
    if not label.startswith("rocm"):
        return False, f"{anchor} is {have}, which is no ROCm build (no +rocm local label)"
    build = _Build(f"{anchor} {have}", label, label[len("rocm") :])
    members = _set_members(entries, installed, build, arch, problems)
    if arch:
        _aotriton_owners(arch, members, installed, build, problems)
    # rocm pins its rocm-sdk-* parts exactly, so the SDK side is one release among itself even
    # where it may be a later patch than torch's label.
    fits = {n: v for n, v in members.items() if _sdk_side(n) and _sdk_fits(v, build.release)}
    sdk = sorted({_sdk_release(v) for v in fits.values()})
    if len(sdk) > 1:
        parts = ", ".join(f"{n} {v}" for n, v in sorted(fits.items()))
        problems.append(f"the ROCm SDK wheels are not one release ({parts})")
    if problems:
        return False, "; ".join(problems)
    return True, (
        f"{len(members)} wheels of ROCm build +{label} ({', '.join(sorted(members))})"
        f"{_sdk_note(sdk, build.release)}"
    )


class _Build:
    """The ROCm build a wheel set is held to: torch's, by its local label."""

    def __init__(self, ref, label, release):
        self.ref, self.label, self.release = ref, label, release

    def problem(self, name, version):
        """Why `name` `version` is not of this build, or None."""
        if _sdk_side(name) and not _sdk_fits(version, self.release):
            rule = _sdk_rule(self.release)
            return f"{name} is {version}, from another ROCm build than {self.ref} ({rule})"
        if not _sdk_side(name) and _label(version) != self.label:
            return (
                f"{name} is {version}, from another ROCm build than {self.ref} "
                f"(expected +{self.label})"
            )
        return None


def _set_entries(spec):
    """(canonical name or glob, pinned version or None, why it is in the set) per word."""
    entries = []
    for word in spec["wheel_set"].split():
        name, _, pin = word.partition("==")
        entries.append((_canon(name) if "*" not in name else name.lower(), pin or None, None))
    if not entries or "*" in entries[0][0]:
        return [], "wheel_set must start with the wheel that defines the build (torch)"
    return entries, None


def _add_extras(words, installed, entries, problems):
    """Every wheel an installed DIST's [EXTRA] requires joins the set; an error or None."""
    for word in words.split():
        m = re.match(r"([A-Za-z0-9._-]+)\[([A-Za-z0-9._-]+)\]$", word)
        if not m:
            return f"extras entry {word!r} is not dist[extra]"
        dist, extra = _canon(m.group(1)), m.group(2)
        if dist not in installed:
            continue  # reported as a missing wheel of the set
        reqs = _extra_requires(dist, extra)
        if reqs is None:
            problems.append(
                f"{dist} {installed[dist]} offers no [{extra}] extra: not a multi-arch ROCm "
                f"wheel (another channel, or a CPU/CUDA build)"
            )
            continue
        entries += [(n, v, f"{dist}[{extra}]") for n, v in reqs]
    return None


def _set_members(entries, installed, build, arch, problems):
    """name -> installed version of each wheel of the set; what is wrong goes to problems."""
    members, seen = {}, set()
    for name, pin, why in entries:
        names = (
            [n for n in sorted(installed) if fnmatch.fnmatchcase(n, name)]
            if "*" in name
            else [name]
        )
        for n in names:
            if n in seen and not pin:
                continue
            seen.add(n)
            version = installed.get(n)
            if version is None:
                family = _family_word(n, arch)
                need = f", but {why} requires it" if why else ""
                hint = " (without it fused SDPA fails, pytorch#194498)" if family else ""
                problems.append(f"{family}{n} is not installed{need}{hint}")
                continue
            members[n] = version
            # The build first: a wheel of another build is named as such even where it is
            # pinned, since that is what breaks at run time.
            wrong = build.problem(n, version)
            if wrong:
                problems.append(wrong)
            elif pin and version != pin:
                problems.append(
                    f"{n} is {version}, expected {pin} ({why + ' pins it' if why else 'pinned'})"
                )
    return members


def _aotriton_owners(arch, members, installed, build, problems):
    """An installed wheel of the build must carry AOTriton's images for the arch."""
    owners = _aotriton_image_owners(arch)
    if not owners:
        want = " or ".join(_image_dirs(arch))
        problems.append(
            f"no installed wheel carries AOTriton kernel images for {arch} "
            f"({_IMAGES_IN_TORCH}/{want}): the family device wheel that ships them is missing "
            f"(fused SDPA then fails, pytorch#194498)"
        )
    for owner in owners:
        if owner not in members:
            version = installed.get(owner, "?")
            members[owner] = version
            if _label(version) != build.label:
                problems.append(
                    f"{owner} is {version}, from another ROCm build than {build.ref} "
                    f"(expected +{build.label}); it carries the AOTriton images for {arch}"
                )


def _sdk_note(sdk, release):
    if sdk and _MINOR.match(release):
        return f"; ROCm SDK {sdk[0]}, which torch's rocm=={release}.* takes"
    if sdk and sdk[0] != release:
        return f"; ROCm SDK {sdk[0]}, a later patch that torch's rocm ~={release} allows (TheRock#7347)"
    return ""


_IMAGES_IN_TORCH = "torch/lib/aotriton.images"


def _aotriton_image_owners(arch):
    """Installed distributions whose RECORD lists files in torch's aotriton.images folder for
    the arch (the arch's own or its family's), by name."""
    owners = set()
    prefix = _IMAGES_IN_TORCH + "/"
    for d in metadata.distributions():
        for f in d.files or ():
            path = str(f).replace("\\", "/")
            if path.startswith(prefix):
                folder = path[len(prefix) :].split("/", 1)[0]
                if _image_dir_serves(folder, arch) and d.metadata["Name"]:
                    owners.add(_canon(d.metadata["Name"]))
                    break
    return sorted(owners)


# ---------------------------------------------------------------------------- arch names

_ARCH = re.compile(r"gfx(\d+)([0-9a-f])([0-9a-f])$")
# Generic targets and the processors they run on (LLVM docs/AMDGPUUsage.rst, "Generic Processor
# Versioning"/"Processors" tables): a generic code object loads on each of them.
# fmt: off
_GENERIC = {
    "gfx9-generic": ("gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"),
    "gfx9-4-generic": ("gfx940", "gfx941", "gfx942", "gfx950"),
    "gfx10-1-generic": ("gfx1010", "gfx1011", "gfx1012", "gfx1013"),
    "gfx10-3-generic": ("gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035",
                        "gfx1036"),
    "gfx11-generic": ("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151",
                      "gfx1152", "gfx1153"),
    "gfx12-generic": ("gfx1200", "gfx1201"),
}
# EF_AMDGPU_MACH (e_flags & 0xff) of AMDGPU code objects (LLVM docs/AMDGPUUsage.rst, "AMDGPU
# ELF Header" table; llvm/include/llvm/BinaryFormat/ELF.h).
_MACH = {
    0x02F: "gfx906", 0x030: "gfx908", 0x036: "gfx1030", 0x03F: "gfx90a", 0x040: "gfx940",
    0x041: "gfx1100", 0x043: "gfx1150", 0x044: "gfx1103", 0x046: "gfx1101", 0x047: "gfx1102",
    0x048: "gfx1200", 0x049: "gfx1250", 0x04A: "gfx1151", 0x04B: "gfx941", 0x04C: "gfx942",
    0x04E: "gfx1201", 0x04F: "gfx950", 0x051: "gfx9-generic", 0x052: "gfx10-1-generic",
    0x053: "gfx10-3-generic", 0x054: "gfx11-generic", 0x055: "gfx1152", 0x058: "gfx1153",
    0x059: "gfx12-generic", 0x05A: "gfx1251", 0x05F: "gfx9-4-generic",
}
# fmt: on
EM_AMDGPU = 224


def _runs_on(target, arch):
    """Whether code for `target` (gfx1151, gfx90a:xnack-, gfx11-generic) loads on `arch`."""
    base = target.split(":")[0]
    return base == arch or arch in _GENERIC.get(base, ())


def _image_dir_serves(folder, arch):
    """AOTriton image folders are amd-<arch> or amd-<family pattern> (amd-gfx115x, amd-gfx11xx):
    each 'x' after 'gfx' stands for any digit, the rule PyTorch's cmake/External/aotriton.cmake
    applies to pick __AOTRITON_IMAGE_LIST entries for PYTORCH_ROCM_ARCH."""
    if not folder.startswith("amd-gfx"):
        return False
    pattern = "gfx" + re.escape(folder[len("amd-gfx") :]).replace("x", "[0-9a-z]")
    return re.fullmatch(pattern, arch) is not None


def _image_dirs(arch):
    """The image folder names that may serve the arch, for messages."""
    m = _ARCH.match(arch)
    if not m or len(m.group(1)) < 2:
        return ["amd-" + arch]
    major, minor = m.group(1), m.group(2)
    return [f"amd-gfx{major}{minor}x", f"amd-gfx{major}xx"]


def _kpack_keys(arch):
    """Names a .kpack file for the arch may end in: the arch, or a kpack family bundle key
    (gfx11_5, gfx115x, gfx11: TheRock#5858's list of known bundles, rocm-systems#7505)."""
    m = _ARCH.match(arch)
    keys = {arch}
    if m:
        major, minor = m.group(1), m.group(2)
        keys |= {f"gfx{major}_{minor}", f"gfx{major}{minor}x", f"gfx{major}"}
    keys |= {g for g, archs in _GENERIC.items() if arch in archs}
    return keys


# ---------------------------------------------------------------------------- code objects

_BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
_CCOB_MAGIC = b"CCOB"


def _elf_amdgpu_target(data):
    """The processor of an AMDGPU ELF code object, or None if `data` is not one."""
    if len(data) < 52 or data[:4] != b"\x7fELF":
        return None
    little = data[5] == 1
    e_machine = struct.unpack_from("<H" if little else ">H", data, 18)[0]
    if e_machine != EM_AMDGPU:
        return None
    flags_at = 48 if data[4] == 2 else 36  # ELF64 / ELF32
    e_flags = struct.unpack_from("<I" if little else ">I", data, flags_at)[0]
    mach = e_flags & 0xFF
    name = _MACH.get(mach, f"unknown EF_AMDGPU_MACH 0x{mach:03x}")
    return name + _elf_features(data[8], e_flags)


def _elf_features(abi_version, e_flags):
    """The target-id features (':sramecc+:xnack-') an AMDGPU code object was built for, from
    e_flags (LLVM AMDGPUUsage.rst, "AMDGPU ELF Header"): code object V4 and later
    (EI_ABIVERSION >= 2) say on/off/any per feature, 'any' being no suffix; V3 (1) sets a bit
    for 'on' only."""
    out = []
    if abi_version >= 2:
        for name, shift in (("sramecc", 10), ("xnack", 8)):
            setting = (e_flags >> shift) & 0x3
            if setting in (2, 3):
                out.append(f":{name}{'+' if setting == 3 else '-'}")
    elif abi_version == 1:
        for name, bit in (("sramecc", 0x200), ("xnack", 0x100)):
            if e_flags & bit:
                out.append(f":{name}+")
    return "".join(out)


_FEATURES = re.compile(r"((?::(?:xnack|sramecc)[+-])+)$")


def _split_features(target):
    """'gfx90a:sramecc+:xnack-' -> ('gfx90a', frozenset of its features)."""
    m = _FEATURES.search(target)
    if not m:
        return target, frozenset()
    return target[: m.start()], frozenset(f for f in m.group(1).split(":") if f)


def _same_target(a, b):
    """Target ids are equal whatever the order of their features."""
    return _split_features(a) == _split_features(b)


def _ccob_payload(f, at):
    """The decompressed payload of a compressed offload bundle at `at` (clang's
    CompressedOffloadBundle: 'CCOB', u16 version, u16 method 0=zlib 1=zstd, then sizes, a hash
    and the data), None if the bytes there are no such header, or the reason it is unreadable."""
    f.seek(at)
    head = f.read(32)
    if len(head) < 20:
        return None
    version, method = struct.unpack_from("<HH", head, 4)
    if version == 1:
        total, start = None, 20
    elif version == 2:
        total, start = struct.unpack_from("<I", head, 8)[0], 24
    elif version == 3:
        total, start = struct.unpack_from("<Q", head, 8)[0], 32
    else:
        return None  # 'CCOB' by chance inside other data
    if method not in (0, 1) or (total is not None and not start < total < 1 << 34):
        return None
    f.seek(at + start)
    body = f.read(total - start) if total else f.read()
    if method == 0:
        return zlib.decompress(body)
    try:
        from compression import zstd  # Python 3.14+

        return zstd.decompress(body)
    except ImportError:
        pass
    try:
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress(body)
    except ImportError:
        return "a zstd-compressed offload bundle (this Python has no zstd reader)"


def _bundle_targets(f, at):
    """Targets of the uncompressed clang offload bundle at `at`: the magic, a u64 entry count,
    then per entry u64 offset (from the bundle start), u64 size, u64 id length and the id
    ('hipv4-amdgcn-amd-amdhsa--gfx1151'); each device entry's ELF header is read too."""
    f.seek(at + 24)
    (count,) = struct.unpack("<Q", f.read(8))
    if not 0 < count < 4096:
        raise ValueError("not a bundle")
    entries = []
    for _ in range(count):
        offset, size, id_len = struct.unpack("<QQQ", f.read(24))
        if id_len > 1024:
            raise ValueError("not a bundle")
        entries.append((offset, size, f.read(id_len).decode("ascii", "replace")))
    found = []
    for offset, size, ident in entries:
        if "amdgcn" not in ident:
            continue  # the host entry
        named = ident.rsplit("--", 1)[-1]
        f.seek(at + offset)
        inner = _elf_amdgpu_target(f.read(min(size, 64)))
        # The entry's name and its ELF header must agree; a mislabelled entry does not load.
        if inner and inner.split(":")[0] != named.split(":")[0]:
            named = f"{named} (but its ELF says {inner})"
        found.append(named)
    return found


_CHUNK = 16 << 20


def _scan_file(f):
    """(targets, notes) of every offload bundle in an open file: shared libraries (their
    .hip_fatbin), static archives and object files alike, read in chunks so a 1 GiB
    libtorch_hip.so is never held whole."""
    targets, notes, hits, pos, tail = [], [], [], 0, b""
    while True:
        f.seek(pos)
        chunk = f.read(_CHUNK)
        if not chunk:
            break
        data, base = tail + chunk, pos - len(tail)
        for magic in (_BUNDLE_MAGIC, _CCOB_MAGIC):
            i = data.find(magic)
            while i >= 0:
                hits.append((base + i, magic))
                i = data.find(magic, i + 1)
        tail = data[-(len(_BUNDLE_MAGIC) - 1) :]
        pos += len(chunk)
    for at, magic in sorted(set(hits)):
        try:
            if magic == _BUNDLE_MAGIC:
                targets += _bundle_targets(f, at)
                continue
            payload = _ccob_payload(f, at)
            if isinstance(payload, str):
                notes.append(payload)
            elif payload is not None:
                inner, more = _scan_blob(io.BytesIO(payload))
                targets += inner
                notes += more
        except (struct.error, zlib.error, ValueError, OverflowError, MemoryError):
            continue  # magic-looking bytes that are no bundle
    return targets, notes


def _scan_blob(f):
    head = f.read(64)
    f.seek(0)
    target = _elf_amdgpu_target(head)
    return ([target], []) if target else _scan_file(f)


def _file_targets(path):
    """(targets, notes) of one file: a code object, a bundle, or a file holding bundles."""
    with open(path, "rb") as f:
        return _scan_blob(f)


_CODE_SUFFIXES = (".so", ".hsaco", ".co", ".hipfb", ".o", ".a")


def _is_code_file(path):
    base = os.path.basename(path)
    return base.endswith(_CODE_SUFFIXES) or ".so." in base


# ---------------------------------------------------------------------------- device_code


def _resolve(target):
    """'/abs/glob' or 'package:relative/glob' (from the package's folder, found without
    importing it) -> (shown pattern, glob pattern) or (shown, None) if the package is absent.
    find_spec imports a dotted name's parents, so targets name top-level packages."""
    if target.startswith("/"):
        return target, target
    pkg, _, rel = target.partition(":")
    spec = importlib.util.find_spec(pkg)
    if spec is None:
        return target, None
    if spec.submodule_search_locations:
        return target, os.path.join(list(spec.submodule_search_locations)[0], rel)
    # A single-file module (an extension such as flash_attn_2_cuda.*.so): 'module:' is the
    # file itself, 'module:rel' is relative to the folder it lies in.
    if not spec.origin or not os.path.isfile(spec.origin):
        return target, None
    return target, os.path.join(os.path.dirname(spec.origin), rel) if rel else spec.origin


def _non_empty_files(folder):
    n = 0
    for root, _dirs, files in os.walk(folder):
        n += sum(1 for f in files if os.path.getsize(os.path.join(root, f)) > 0)
    return n


def _check_images(path, arch):
    folders = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    serving = [d for d in folders if _image_dir_serves(d, arch)]
    if not serving:
        others = ", ".join(folders) or "nothing"
        want = " or ".join(_image_dirs(arch))
        return False, f"{path} has no AOTriton kernel images for {arch} ({want}); it has {others}"
    counts = {d: _non_empty_files(os.path.join(path, d)) for d in serving}
    if not any(counts.values()):
        return False, f"{path}/{serving[0]} has no kernel images for {arch} (the folder is empty)"
    return True, ", ".join(f"{d}: {n} images" for d, n in counts.items() if n)


def _kpack_variant(name, keys):
    """The target a kernel pack is for ('torch_gfx90a:xnack+.kpack' -> 'gfx90a:xnack+'), or
    None when it is for none of `keys` (the arch and its kpack family keys)."""
    stem = name[: -len(".kpack")]
    m = _FEATURES.search(stem)
    base, features = (stem[: m.start()], m.group(1)) if m else (stem, "")
    for k in sorted(keys, key=len, reverse=True):
        if base.endswith(("_" + k, "-" + k)):
            return k + features
    return None


def _check_kpack(path, arch, harmful=()):
    keys = _kpack_keys(arch)
    packs = [f for f in sorted(os.listdir(path)) if f.endswith(".kpack")]
    mine = {}
    for f in packs:
        variant = _kpack_variant(f, keys)
        if variant and os.path.getsize(os.path.join(path, f)) > 0:
            mine[f] = variant
    if not mine:
        others = ", ".join(packs[:6]) or "no .kpack files"
        return False, f"{path} holds no kernel pack for {arch} (*_{arch}.kpack); it has {others}"
    bad = _harmful_in(mine, harmful)
    if bad:
        return False, f"{path}: {bad}"
    return True, f"{len(mine)} kernel packs for {arch} ({_variants_text(mine.values())})"


def _variants_text(targets):
    return "variants " + ", ".join(sorted(set(targets)))


def _harmful_in(found, harmful):
    """A sentence naming each file whose target the arch table marks harmful, or ''."""
    hits = [
        f"{name} is a {target} variant"
        for name, target in sorted(found.items())
        if any(_same_target(target, h) for h in harmful)
    ]
    if not hits:
        return ""
    return (
        "; ".join(hits) + ", which recipes/arches.yaml marks harmful for this arch "
        "(harmful_code_variants): remove it from the image"
    )


def _check_path(path, arch, harmful=()):
    if os.path.isdir(path):
        if os.path.basename(path.rstrip("/")) == "aotriton.images":
            return _check_images(path, arch)
        if os.path.basename(path.rstrip("/")) == ".kpack":
            return _check_kpack(path, arch, harmful)
        found, notes, mine = [], [], {}
        for root, _dirs, names in os.walk(path):
            for name in names:
                full = os.path.join(root, name)
                if _is_code_file(full) and os.path.isfile(full):
                    t, n = _file_targets(full)
                    found += t
                    notes += n
                    for x in t:
                        if _runs_on(x, arch):
                            mine.setdefault(f"{os.path.relpath(full, path)} [{x}]", x)
                    # Without harmful variants to look for, the first file with the arch's
                    # code proves the claim.
                    if mine and not harmful:
                        first = next(iter(mine)).split(" [")[0]
                        return True, f"{first} holds {arch} code ({_variants_text(mine.values())})"
        if mine:
            bad = _harmful_in(mine, harmful)
            if bad:
                return False, f"{path}: {bad}"
            return True, f"{path} holds {arch} code ({_variants_text(mine.values())})"
        return False, _missing_isa(path, arch, found, notes)
    if os.path.getsize(path) == 0:
        return False, f"{path} is empty"
    found, notes = _file_targets(path)
    mine = {f"{os.path.basename(path)} [{x}]": x for x in found if _runs_on(x, arch)}
    if mine:
        bad = _harmful_in(mine, harmful)
        if bad:
            return False, f"{path}: {bad}"
        return True, f"{os.path.basename(path)}: {', '.join(sorted(set(found)))}"
    return False, _missing_isa(path, arch, found, notes)


def _missing_isa(path, arch, found, notes):
    if found:
        return f"{path} holds device code for {', '.join(sorted(set(found)))}, not {arch}"
    if notes:
        return f"{path}: {arch} not proven: {sorted(set(notes))[0]}"
    return f"{path} holds no AMDGPU device code (no code object or offload bundle) for {arch}"


def check_device_code(spec):
    arch = spec["arch"]
    harmful = tuple((spec.get("harmful") or "").split())
    ok_parts, problems = [], []
    for target in spec["device_code"].split():
        shown, pattern = _resolve(target)
        if pattern is None:
            problems.append(f"{shown}: package {shown.partition(':')[0]} is not installed")
            continue
        matches = sorted(glob.glob(pattern))
        if not matches:
            rel = target.partition(":")[2] if not target.startswith("/") else target
            hidden = any(
                part.startswith(".") and part not in (".", "..") for part in rel.split("/")
            )
            why = " (a hidden folder, which a copy step may have dropped)" if hidden else ""
            problems.append(f"{pattern} is missing{why}")
            continue
        for path in matches:
            ok, detail = _check_path(path, arch, harmful)
            (ok_parts if ok else problems).append(detail)
    if problems:
        return False, "; ".join(problems)
    return True, "; ".join(ok_parts)


# ---------------------------------------------------------------------------- linkage
#
# A native extension built against another torch, or shipped without a library it needs, fails
# only at import on the user's machine: lemonade-sdk/vllm-rocm's qualification found 7 undefined
# c10 symbols in an extension built against another torch (README @2a49d832, read 2026-11-24).
# This check models the dynamic loader (ld.so(8)) for each extension after `preload` (the modules
# the extension expects imported first, usually torch) and reports every DT_NEEDED that does not
# resolve and every undefined symbol that no loaded library defines.
#
# ELF is read with the image's binutils (readelf -W, c++filt): this runner is piped into images
# that hold only their own packages, so it cannot import pyelftools or lief, and installing one
# would change the image under test; every layer that builds a native extension has a compiler
# and so binutils (base:devel's build-essential, the cpu stack's g++).

_DYN_ENTRY = re.compile(r"\((NEEDED|RPATH|RUNPATH|SONAME)\)\s+[^\[]*\[(.*)\]\s*$")
_SYM_LINE = re.compile(
    r"^\s*\d+:\s+[0-9a-fA-F]+\s+\S+\s+\S+\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)(?:\s+\(\d+\))?\s*$"
)
_SO_NAME = re.compile(r"\.so(\.\d+)*$")
_LINKAGE_SHOWN = 6  # symbols / libraries named in one message


class _NoBinutils(Exception):
    pass


def _readelf(args, path):
    try:
        out = subprocess.run(
            ["readelf", "-W", *args, path], capture_output=True, text=True, errors="replace"
        )
    except FileNotFoundError:
        raise _NoBinutils("readelf is not in the image (install binutils)") from None
    if out.returncode != 0:
        raise ValueError(f"readelf cannot read {path}: {out.stderr.strip()[:200]}")
    return out.stdout


def _elf_kind(path):
    """(ELF class, e_machine) of a file, or None when it is no ELF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return head[4], struct.unpack_from("<H" if head[5] == 1 else ">H", head, 18)[0]


def _dynamic(path):
    """DT_NEEDED, DT_RPATH, DT_RUNPATH (lists) and DT_SONAME (or None) of a shared object."""
    dyn = {"NEEDED": [], "RPATH": [], "RUNPATH": [], "SONAME": None}
    for line in _readelf(["-d"], path).splitlines():
        m = _DYN_ENTRY.search(line)
        if not m:
            continue
        tag, value = m.groups()
        if tag == "NEEDED":
            dyn["NEEDED"].append(value)
        elif tag == "SONAME":
            dyn["SONAME"] = value
        else:
            dyn[tag] += [p for p in value.split(":") if p]
    return dyn


def _symbols(path):
    """(undefined, defined) dynamic symbols: undefined as (name, version or None) pairs,
    leaving out weak references (the loader lets them stay unresolved); defined as
    name -> set of versions (None for an unversioned definition)."""
    undefined, defined = set(), {}
    for line in _readelf(["--dyn-syms"], path).splitlines():
        m = _SYM_LINE.match(line)
        if not m:
            continue
        bind, _vis, ndx, full = m.groups()
        name, _, version = full.partition("@")
        version = version.lstrip("@") or None
        if not name:
            continue
        if ndx == "UND":
            if bind != "WEAK":
                undefined.add((name, version))
        elif bind in ("GLOBAL", "WEAK", "UNIQUE"):
            defined.setdefault(name, set()).add(version)
    return undefined, defined


def _ld_cache():
    """soname -> paths from the loader's cache (ldconfig -p); empty where ldconfig is absent."""
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, errors="replace")
        except (FileNotFoundError, PermissionError):
            continue
        cache = {}
        for line in out.stdout.splitlines():
            name, sep, path = line.strip().partition(" => ")
            if sep:
                cache.setdefault(name.split(" (")[0], []).append(path.strip())
        return cache
    return {}


def _default_dirs():
    import sysconfig

    multiarch = sysconfig.get_config_var("MULTIARCH")
    dirs = []
    for top in ("/lib", "/usr/lib"):
        if multiarch:
            dirs.append(f"{top}/{multiarch}")
        dirs += [top + "64", top]
    return dirs


_LOADED_BY = {}


def _loaded_by(preload):
    """The shared objects mapped into a Python process that imported `preload` (the modules an
    extension expects imported first), read from /proc/self/maps; and that process's error.
    Read once per preload list in a run: every linkage check after `import torch` shares one."""
    key = tuple(preload)
    if key not in _LOADED_BY:
        _LOADED_BY[key] = _read_loaded_by(preload)
    return _LOADED_BY[key]


def _read_loaded_by(preload):
    code = (
        "import importlib, sys\n"
        "for m in sys.argv[1:]: importlib.import_module(m)\n"
        "print(open('/proc/self/maps').read())\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *preload], capture_output=True, text=True)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return [], lines[-1] if lines else f"exit {out.returncode}"
    paths = []
    for line in out.stdout.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and _SO_NAME.search(parts[5]):
            if parts[5] not in paths:
                paths.append(parts[5])
    return paths, None


class _Loader:
    """Finds shared objects the way ld.so(8) does: a name with a slash as is; an object already
    loaded under that name or soname; DT_RPATH (when there is no DT_RUNPATH); LD_LIBRARY_PATH;
    DT_RUNPATH; the ld.so cache; the default directories. $ORIGIN is the folder of the object
    that asks. Candidates of another ELF class or machine are passed over, as the loader does."""

    def __init__(self, kind, loaded):
        self.kind = kind
        self.loaded = {}
        for path in loaded:
            self.loaded.setdefault(os.path.basename(path), path)
        self.cache = _ld_cache()
        self.env = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
        self.defaults = _default_dirs()
        self.dyn = {}

    def dynamic(self, path):
        if path not in self.dyn:
            self.dyn[path] = _dynamic(path)
        return self.dyn[path]

    def note_soname(self, path):
        soname = self.dynamic(path)["SONAME"]
        if soname:
            self.loaded.setdefault(soname, path)

    def _fits(self, path):
        return os.path.isfile(path) and _elf_kind(path) == self.kind

    def find(self, name, asker):
        """(path or None, where it was found or the places searched)."""
        if "/" in name:
            return (name, "by path") if self._fits(name) else (None, name)
        if name in self.loaded:
            return self.loaded[name], "already loaded"
        dyn = self.dynamic(asker)
        origin = os.path.dirname(asker)

        def expand(dirs):
            return [d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for d in dirs]

        order = []
        if dyn["RPATH"] and not dyn["RUNPATH"]:
            order.append(("RPATH", expand(dyn["RPATH"])))
        order.append(("LD_LIBRARY_PATH", self.env))
        if dyn["RUNPATH"]:
            order.append(("RUNPATH", expand(dyn["RUNPATH"])))
        for where, dirs in order:
            for d in dirs:
                path = os.path.join(d, name)
                if self._fits(path):
                    return path, f"{where} {d}"
        for path in self.cache.get(name, []):
            if self._fits(path):
                return path, "ld.so cache"
        for d in self.defaults:
            path = os.path.join(d, name)
            if self._fits(path):
                return path, d
        searched = [f"{w} {':'.join(dirs)}" for w, dirs in order if dirs]
        searched += ["the ld.so cache", ":".join(self.defaults)]
        return None, ", ".join(searched)

    def closure(self, root):
        """(every object `root` loads, breadth first, root included; [(needed, asker, searched)]
        for each DT_NEEDED that resolves nowhere)."""
        seen, missing, queue = [root], [], [root]
        while queue:
            obj = queue.pop(0)
            for name in self.dynamic(obj)["NEEDED"]:
                path, where = self.find(name, obj)
                if path is None:
                    missing.append((name, obj, where))
                    continue
                real = os.path.realpath(path)
                if real not in (os.path.realpath(p) for p in seen):
                    seen.append(path)
                    queue.append(path)
        return seen, missing


def _demangle(names):
    """C++ names as c++filt spells them (the mangled name where c++filt is absent)."""
    try:
        out = subprocess.run(
            ["c++filt"], input="\n".join(names), capture_output=True, text=True, errors="replace"
        )
    except FileNotFoundError:
        return list(names)
    shown = out.stdout.splitlines()
    return shown if out.returncode == 0 and len(shown) == len(names) else list(names)


def _linkage_files(target):
    """The ELF shared objects a linkage target names: (shown, files or None if its package is
    not installed, problem or None)."""
    shown, pattern = _resolve(target)
    if pattern is None:
        return shown, None, f"{shown}: package {shown.partition(':')[0]} is not installed"
    files = []
    for path in sorted(glob.glob(pattern)):
        if os.path.isdir(path):
            for root, _dirs, names in os.walk(path):
                files += [os.path.join(root, n) for n in sorted(names) if _SO_NAME.search(n)]
        else:
            files.append(path)
    files = [f for f in files if _elf_kind(f) is not None]
    if not files:
        return shown, [], f"{pattern} holds no ELF shared object"
    return shown, files, None


def check_linkage(spec):
    preload = (spec.get("preload") or "").split()
    loaded, error = _loaded_by(preload)
    if error:
        return False, f"importing {' '.join(preload)} failed first: {error}"
    ok_parts, problems = [], []
    exe = os.path.realpath(sys.executable)
    for target in spec["linkage"].split():
        shown, files, problem = _linkage_files(target)
        if problem:
            problems.append(problem)
            continue
        for ext in files:
            name = os.path.basename(ext)
            loader = _Loader(_elf_kind(ext), loaded)
            for path in loaded:
                if _elf_kind(path) == loader.kind:
                    loader.note_soname(path)
            objs, missing = loader.closure(ext)
            for lib, asker, searched in missing:
                via = "" if asker == ext else f" (needed by {os.path.basename(asker)})"
                problems.append(
                    f"{name}: library {lib}{via} is not found: not loaded after "
                    f"`import {' '.join(preload) or '(nothing)'}` and not in {searched}"
                )
            # Symbols resolve in the global scope (the interpreter and what it loads) and in
            # the extension's own dependencies.
            scope = objs[1:] + [p for p in loader.closure(exe)[0] if p not in objs]
            undefined, _ = _symbols(ext)
            wanted = {n for n, _v in undefined}
            defined = {}
            for obj in scope:
                for sym, versions in _symbols(obj)[1].items():
                    if sym in wanted:
                        defined.setdefault(sym, set()).update(versions)
            unresolved = sorted(
                (n, v)
                for n, v in undefined
                if n not in defined or not (v is None or {v, None} & defined[n])
            )
            libs = [os.path.basename(o) for o in objs[1:]]
            if unresolved:
                shown = unresolved[:_LINKAGE_SHOWN]
                demangled = _demangle([n for n, _v in shown])
                named = []
                for i, (mangled, version) in enumerate(shown):
                    full = mangled + ("@" + version if version else "")
                    named.append(full if demangled[i] == mangled else f"{demangled[i]} [{full}]")
                more = len(unresolved) - len(named)
                problems.append(
                    f"{name}: {len(unresolved)} undefined symbol(s) defined by none of the "
                    f"{len(scope)} libraries it loads ({', '.join(libs[:_LINKAGE_SHOWN])}"
                    f"{', …' if len(libs) > _LINKAGE_SHOWN else ''}, and the interpreter): "
                    + "; ".join(named)
                    + (f"; and {more} more" if more > 0 else "")
                )
            elif not missing:
                ok_parts.append(
                    f"{name}: {len(libs)} libraries resolve ({', '.join(libs[:_LINKAGE_SHOWN])}"
                    f"{', …' if len(libs) > _LINKAGE_SHOWN else ''}), {len(undefined)} undefined "
                    f"symbols all defined"
                )
    if problems:
        return False, "; ".join(problems)
    return True, "; ".join(ok_parts)


# ---------------------------------------------------------------------------- dispatch


# ---------------------------------------------------------------------------- hip_runtime
#
# One HIP runtime per process. Triton 3.9's AMD driver (triton/backends/amd/driver.py in the
# triton 3.9.0 wheel, PyPI 2026-10-27) prefers TheRock's rocm_sdk.find_libraries("amdhip64") and
# raises RuntimeError ("refusing to mix ROCm installations") when another libamdhip64 is already
# loaded: torch loaded one through its RPATH, Triton wants the SDK's. Two SDKs in one image
# (/opt/rocm beside the wheels) is the usual cause. Read without a GPU: the files where torch or
# Triton could load one, and what `import torch` maps; with a GPU, one Triton kernel is launched.

_HIP_NAME = re.compile(r"^lib(?P<stem>[A-Za-z0-9_]+)\.so(\.\d+)*$")


def _is_runtime(name, stem):
    m = _HIP_NAME.match(os.path.basename(name))
    return bool(m) and m.group("stem") == stem


def mapped_libraries(maps_text, stem):
    """The paths of lib<stem>.so* mapped into a process, from its /proc/<pid>/maps text."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if path.startswith("/") and _is_runtime(path, stem) and path not in out:
            out.append(path)
    return out


def runtime_dirs(site_dirs, env):
    """Folders torch or Triton could load the HIP runtime from: the wheels' lib folders (torch/
    lib, TheRock's _rocm_sdk_*/lib), ROCM_PATH/HIP_PATH, /opt/rocm*, LD_LIBRARY_PATH, the
    system's library folders and TRITON_LIBHIP_PATH's folder (Triton's override)."""
    dirs = []
    for site in site_dirs:
        dirs += glob.glob(os.path.join(site, "*", "lib")) + glob.glob(
            os.path.join(site, "*", "*", "lib")
        )
    for key in ("ROCM_PATH", "HIP_PATH", "ROCM_HOME"):
        if env.get(key):
            dirs += [os.path.join(env[key], "lib"), os.path.join(env[key], "lib64")]
    dirs += glob.glob("/opt/rocm*/lib") + glob.glob("/opt/rocm*/*/lib")
    dirs += [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    if env.get("TRITON_LIBHIP_PATH"):
        dirs.append(os.path.dirname(env["TRITON_LIBHIP_PATH"]))
    return list(dict.fromkeys(dirs))


def runtimes_on_disk(dirs, stem):
    """{real path: [paths that lead to it]} of every lib<stem>.so* file in `dirs` (symlinks to
    one file count once)."""
    found = {}
    for folder in dirs:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            if _is_runtime(name, stem) and os.path.isfile(real):
                found.setdefault(real, [])
                if path not in found[real]:
                    found[real].append(path)
    return found


def merge_identical(on_disk, digest):
    """on_disk with real paths of identical content (digest(path)) merged into the first: a
    byte-for-byte copy is the same runtime, only another path to it."""
    merged, seen = {}, {}
    for real in sorted(on_disk):
        key = digest(real)
        if key in seen:
            merged[seen[key]] += [p for p in on_disk[real] if p not in merged[seen[key]]]
        else:
            seen[key] = real
            merged[real] = list(on_disk[real])
    return merged


def file_digest(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def judge_hip_runtime(stem, on_disk, mapped, sdk, launch):
    """(ok, detail) of the one-runtime rule. on_disk: real path -> paths; mapped: real paths
    mapped after `import torch`; sdk: the real path rocm_sdk names (None without rocm_sdk);
    files of identical content count as one (merge_identical);
    launch: None (no GPU), "ok", or why launching a Triton kernel failed."""
    lib = f"lib{stem}"
    problems = []
    if len(on_disk) > 1:
        names = " and ".join(paths[0] + (f" (-> {real})" if paths[0] != real else "")
                             for real, paths in sorted(on_disk.items()))  # fmt: skip
        problems.append(
            f"two different {lib} where torch and Triton could each load one: {names} "
            "(Triton 3.9 refuses to mix ROCm installations; remove one, or make one a link to the other)"
        )
    if not mapped:
        problems.append(f"import torch mapped no {lib}: not a ROCm torch, or it failed to load")
    elif len(mapped) > 1:
        problems.append(f"{len(mapped)} {lib} mapped into one process: {' and '.join(mapped)}")
    elif sdk is not None and mapped[0] != sdk:
        problems.append(
            f"torch loaded {mapped[0]} but rocm_sdk.find_libraries({stem!r}) names {sdk}: "
            "Triton 3.9 then refuses to mix ROCm installations"
        )
    if launch not in (None, "ok"):
        problems.append(f"a Triton kernel after import torch failed: {launch}")
    if problems:
        return False, "; ".join(problems)
    where = mapped[0] + (" (the file rocm_sdk names)" if sdk else " (no rocm_sdk installed)")
    ran = "one Triton kernel ran" if launch == "ok" else "no GPU here, no Triton kernel launched"
    return True, f"one {lib}: {where}; {ran}"


_HIP_PROBE = """
import json, os, sys
stem = sys.argv[1]
import torch
out = {"sdk": None, "launch": None, "maps": open("/proc/self/maps").read()}
try:
    import rocm_sdk
except ImportError:
    rocm_sdk = None
if rocm_sdk is not None:
    libs = rocm_sdk.find_libraries(stem)
    out["sdk"] = os.path.realpath(str(libs[0])) if libs else None
if torch.cuda.is_available():
    try:
        import triton, triton.language as tl

        @triton.jit
        def _plus_one(x, n, BLOCK: tl.constexpr):
            i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(x + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)

        x = torch.zeros(100, device="cuda")
        _plus_one[(1,)](x, 100, BLOCK=128)
        torch.cuda.synchronize()
        out["launch"] = "ok" if bool((x == 1).all()) else "the kernel computed a wrong result"
        out["maps"] = open("/proc/self/maps").read()
    except Exception as exc:
        out["launch"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def check_hip_runtime(spec):
    stem = spec["hip_runtime"]
    proc = subprocess.run([sys.executable, "-c", _HIP_PROBE, stem], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return False, "import torch failed: " + (lines[-1] if lines else f"exit {proc.returncode}")
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    mapped = sorted({os.path.realpath(p) for p in mapped_libraries(probe["maps"], stem)})
    site = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    on_disk = merge_identical(runtimes_on_disk(runtime_dirs(site, os.environ), stem), file_digest)
    return judge_hip_runtime(stem, on_disk, mapped, probe["sdk"], probe["launch"])


# ---------------------------------------------------------------------------- observe
#
# What the recipe inferred (AOTriton's version inside torch, the arch among libtorch_hip's
# targets) against what the image's torch layer read from its own files and recorded in the
# versions manifest (attnforge/observe.py, the layer's last step). A difference is said in
# one sentence, not failed: the inference was the recipe's best reading, and the image is the
# better one (`invoke pins.update --observed` proposes the corrected recipe).

IMAGE_MANIFEST = "/opt/attnforge/versions.json"


def _tag_key(tag):
    return tuple(int(x) for x in re.findall(r"\d+", tag)[:3]) + (0,) * 3


def compare_observed(observed, inferred):
    """One sentence per fact the image contradicts: inferred maps aotriton (a tag) and arch."""
    out = []
    aot = inferred.get("aotriton")
    seen = (observed.get("aotriton") or {}).get("tag")
    where = os.path.basename((observed.get("aotriton") or {}).get("file") or "")
    if aot and not seen:
        out.append(f"the recipe infers AOTriton {aot} in torch, but torch/lib holds no "
                   "libaotriton_v2.so.*")  # fmt: skip
    elif aot and _tag_key(seen)[:3] != _tag_key(aot)[:3]:
        out.append(
            f"the image contradicts the recipe: AOTriton in torch is {seen} ({where}), the recipe "
            f"inferred {aot}; `invoke pins.update --observed` proposes the correction"
        )
    arch, targets = inferred.get("arch"), observed.get("torch_gfx_targets") or []
    if arch and targets and arch not in targets:
        out.append(f"libtorch_hip.so's offload bundles name {', '.join(targets)}, not {arch}")
    return out


def check_observe(spec, manifest=IMAGE_MANIFEST):
    try:
        with open(manifest, encoding="utf-8") as f:
            observed = json.load(f).get("observed")
    except (OSError, ValueError) as exc:
        return False, f"cannot read {manifest}: {exc}"
    if not observed:
        return False, f"{manifest} records no observed facts (attnforge/observe.py)"
    inferred = dict(w.partition("=")[::2] for w in spec["observe"].split() if "=" in w)
    aot = observed.get("aotriton") or {}
    read = (
        f"read: AOTriton {aot.get('tag') or 'none'}, libtorch_hip targets "
        f"{', '.join(observed.get('torch_gfx_targets') or []) or 'unread (compressed)'}, "
        f"{observed.get('triton') or 'no triton'}, HIP {observed.get('hip') or '?'}"
    )
    differs = compare_observed(observed, {k: v for k, v in inferred.items() if v})
    return True, "; ".join([*differs, read])


def check(spec, installed):
    if "dist" in spec:
        have = installed.get(_canon(spec["dist"]))
        if have is None:
            return False, f"{spec['dist']} is not installed"
        want = spec.get("version")
        if want and have != want:
            return False, f"{spec['dist']} is {have}, expected {want}"
        return True, f"{spec['dist']} {have}"
    if "absent" in spec:
        have = installed.get(_canon(spec["absent"]))
        if have is not None:
            return False, f"{spec['absent']} {have} is installed but must not be"
        return True, f"{spec['absent']} absent"
    if "wheel_set" in spec:
        return check_wheel_set(spec, installed)
    if "device_code" in spec:
        return check_device_code(spec)
    if "linkage" in spec:
        return check_linkage(spec)
    if "hip_runtime" in spec:
        return check_hip_runtime(spec)
    if "observe" in spec:
        return check_observe(spec)
    if "torch_build" in spec:
        code = (
            "import torch, json; print(json.dumps({'hip': torch.version.hip, 'cuda': torch.version.cuda,"
            " 'version': torch.__version__}))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if out.returncode != 0:
            return False, "torch does not import: " + out.stderr.strip().splitlines()[-1:][
                0
            ] if out.stderr.strip() else "torch does not import"
        info = json.loads(out.stdout.strip().splitlines()[-1])
        built = "hip" if info["hip"] else "cuda" if info["cuda"] else "cpu"
        if built != spec["torch_build"]:
            return (
                False,
                f"torch {info['version']} is a {built} build, expected {spec['torch_build']}",
            )
        return True, f"torch {info['version']} ({built})"
    if "python" in spec:
        out = subprocess.run([sys.executable, "-c", spec["python"]], capture_output=True, text=True)
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).strip().splitlines()
            return False, lines[-1] if lines else f"exit {out.returncode}"
        return True, (out.stdout.strip().splitlines() or ["ok"])[-1]
    return False, "unknown check kind"


def main(argv):
    checks = json.loads(argv[1])
    installed = _installed()
    failed = 0
    for spec in checks:
        try:
            ok, detail = check(spec, installed)
        except _NoBinutils as exc:
            ok, detail = False, str(exc)
        except Exception as exc:  # a broken check is a failed check, with its reason
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        failed += not ok
        print(json.dumps({"name": spec["name"], "ok": ok, "detail": detail}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
