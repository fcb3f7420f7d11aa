"""`invoke doctor`: can this machine build and validate attnforge stacks, and if not, why not.

A pure core turns facts (the host fingerprint of validate/host.py, what the engine said, free
disk, the registry config) into rows of check, status, what was found and the fix; `gather` is
the thin I/O that collects those facts on a real machine. Tests feed the core fake sysfs trees.

Every ROCm fact a row states is sourced in docs/doctor.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import UserError
from .recipes import Neighbour, Recipes

Status = Literal["ok", "warn", "fail", "info"]
GIB = 1024**3
# Free space below which a build is expected to fail outright, and below which the source stack
# (PyTorch, AOTriton and CK compiled in BuildKit) is expected to run out. Estimates, not
# measurements (docs/doctor.md): change them when a measured build says otherwise.
DISK_FAIL_GIB = 20
DISK_SOURCE_GIB = 100
DOCKER_DEFAULT_ROOT = "/var/lib/docker"


@dataclass(frozen=True)
class Row:
    check: str
    status: Status
    found: str
    fix: str = ""


# ---------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class ArchInfo:
    family: str
    vendor: str
    description: str
    stacks: tuple[str, ...]  # stacks that build for it as the recipes stand
    blocked: tuple[str, ...] = ()  # stacks made for it that need --set or lack a layer for it


@dataclass(frozen=True)
class RecipeFacts:
    """What the recipes say that the doctor needs: known arches, their stacks, host rules."""

    arches: dict[str, ArchInfo]
    host_rules: list[dict[str, Any]]
    neighbours: tuple[Neighbour, ...] = ()  # arches the recipes lack (arches.yaml)

    @classmethod
    def of(cls, recipes: Recipes) -> RecipeFacts:
        from .plan import stack_options

        arches = {}
        for name, a in recipes.arches.items():
            # Stacks for other hardware altogether are left out, as `invoke build` does.
            options = [o for o in stack_options(recipes, name) if o.builds or not
                       o.reason.startswith("for ")]  # fmt: skip
            arches[name] = ArchInfo(
                a.family, a.vendor, a.description,
                tuple(o.stack for o in options if o.builds),
                tuple(o.stack for o in options if not o.builds),
            )  # fmt: skip
        rules = [r.model_dump(exclude_none=True) for r in recipes.host_rules]
        return cls(arches, rules, recipes.neighbours)


@dataclass(frozen=True)
class EngineFacts:
    name: str  # docker | podman
    reachable: bool
    description: str  # describe(), or the sentence of why it is not reachable
    hint: str = ""
    cli: str | None = None  # the docker CLI pick_docker_cli chose
    mode: str | None = None  # buildx | classic
    cli_error: str | None = None  # why no docker CLI can drive BuildKit
    cli_hint: str = ""
    remote: str | None = None  # the engine's address when it is not on this machine
    data_root: str | None = None  # DockerRootDir / podman's GraphRoot, as the engine said


@dataclass(frozen=True)
class Disk:
    path: str
    free_bytes: int | None  # None: could not be read
    device: int | None = None  # st_dev, to tell when two paths share a filesystem


@dataclass(frozen=True)
class RegistryAuth:
    host: str
    how: str  # credHelper | auth | credsStore | none | unreadable
    detail: str = ""  # helper name, config file, or why it could not be read: never a secret


@dataclass(frozen=True)
class VenvTorch:
    python: str  # the venv's interpreter
    version: str  # torch's version, as its dist-info names it


@dataclass
class Facts:
    fingerprint: dict[str, Any]
    engine: EngineFacts
    podman: str | None = None  # `podman --version`, or None when not installed
    buildkit_host: str | None = None
    tool_arches: list[str] = field(default_factory=list)  # from rocminfo/amd-smi
    tool: str | None = None  # which tool said so
    engine_disk: Disk | None = None
    build_disk: Disk | None = None
    registry: RegistryAuth | None = None
    venv_torch: VenvTorch | None = None  # a torch in the active venv (VIRTUAL_ENV)


# ---------------------------------------------------------------------------- arches & overrides

# Arches the recipes lack, and what is documented about running them: recipes/arches.yaml's
# `neighbours:`. Where none documents an override, AMD's own wheels are the way (_NATIVE_EXTRA).
_NATIVE_EXTRA = (
    "AMD publishes device-{arch} wheels (recipes/arches.yaml header), so the fix is adding {arch} "
    "to recipes/arches.yaml with its facts, not an override"
)


def gfx_of_override(value: str) -> str | None:
    """'11.0.0' -> 'gfx1100', '9.0.10' -> 'gfx90a': the arch an override value claims."""
    m = re.fullmatch(r"\s*(\d+)\.(\d+)\.(\d+)\s*", value)
    if not m:
        return None
    major, minor, step = (int(x) for x in m.groups())
    return f"gfx{major}{minor}{step:x}"


def neighbour_of(arch: str, recipes: RecipeFacts) -> Neighbour | None:
    return next((n for n in recipes.neighbours if arch in n.arches), None)


def needed_override(arch: str, recipes: RecipeFacts) -> str | None:
    """The override value an unknown arch needs to run a stack the recipes build, if documented."""
    if arch in recipes.arches:
        return None
    n = neighbour_of(arch, recipes)
    if n and n.override and n.target in recipes.arches and recipes.arches[n.target].stacks:
        return n.override
    return None


def arch_row(arch: str, recipes: RecipeFacts, *, label: str) -> Row:
    """Whether the recipes build for an arch; for one they do not, the documented way out."""
    check = f"arch {arch}"
    known = recipes.arches.get(arch)
    if known is not None:
        stacks = ", ".join(known.stacks) or "none"
        # NVIDIA arches exist for kernel and validation runs: no stack is expected to fit them.
        status: Status = "ok" if known.stacks else "info" if known.vendor == "nvidia" else "fail"
        found = f"{label}: {known.family}, {known.description}; stacks: {stacks}"
        if known.blocked:
            found += f" (not as they stand: {', '.join(known.blocked)}; --dry-run says why)"
        fix = "" if status != "fail" else "no stack of the recipes fits it"
        return Row(check, status, found, fix)
    n = neighbour_of(arch, recipes)
    if n is None:
        return Row(
            check, "fail",
            f"{label}: unknown to recipes/arches.yaml and no documented override to a supported "
            "arch exists: unsupported",
            f"build for a supported arch ({', '.join(_amd(recipes)) or 'none'}) elsewhere, or "
            f"add {arch} to recipes/arches.yaml with sourced facts",
        )  # fmt: skip
    if n.override and n.target in recipes.arches and recipes.arches[n.target].stacks:
        return Row(
            check, "warn",
            f"{label}: not in the recipes; {n.note} ({n.source}), and the recipes build "
            f"{n.target}",
            f"build --arch {n.target} and run its images with HSA_OVERRIDE_GFX_VERSION="
            f"{n.override} (docker run -e; `invoke validate` does not pass it): AMD does not "
            "support this, so validate before trusting results",
        )  # fmt: skip
    if n.override:
        why = f"{n.note}, but the recipes build no stack for {n.target} either"
    else:
        why = f"{n.note}; {_NATIVE_EXTRA.format(arch=arch)}"
    return Row(
        check, "fail", f"{label}: unsupported: {why} ({n.source})",
        f"add {arch} to recipes/arches.yaml with sourced facts" if not n.override
        else f"add {n.target} (or {arch}) to recipes/arches.yaml with sourced facts",
    )  # fmt: skip


def _amd(recipes: RecipeFacts) -> list[str]:
    return [a for a, i in recipes.arches.items() if i.vendor == "amd"]


# ---------------------------------------------------------------------------- the rows


def engine_rows(facts: Facts) -> list[Row]:
    eng = facts.engine
    rows = []
    if eng.reachable:
        rows.append(Row("engine", "ok", f"{eng.name} reachable: {eng.description}"))
    else:
        rows.append(Row("engine", "fail", f"{eng.name} not reachable: {eng.description}", eng.hint))
    if eng.name == "docker":
        if eng.cli_error:
            rows.append(Row("buildkit", "fail", eng.cli_error, eng.cli_hint))
        elif eng.cli:
            how = (
                "buildx plugin present (docker buildx build --load)"
                if eng.mode == "buildx"
                else "no buildx plugin; this CLI is older than 23 and runs BuildKit itself "
                "(DOCKER_BUILDKIT=1)"
            )
            rows.append(Row("buildkit", "ok", f"docker CLI {eng.cli}, {eng.mode} mode: {how}"))
    else:
        rows.append(Row("buildkit", "info", "podman builds with Buildah; BuildKit is not used"))
    if facts.buildkit_host:
        rows.append(Row(
            "BUILDKIT_HOST", "info",
            f"set to {facts.buildkit_host}: attnforge builds there only when asked "
            "(invoke build --builder \"$BUILDKIT_HOST\", through buildctl, which must be on "
            "PATH); without --builder it builds on the engine",
        ))  # fmt: skip
    if eng.name == "docker":
        found = f"installed: {facts.podman}" if facts.podman else "not installed"
        rows.append(Row("podman", "info", f"{found} (used only with --engine podman)"))
    return rows


def gpu_arches(facts: Facts) -> list[str]:
    """The host's AMD GPU arches: KFD topology first, else what rocminfo/amd-smi said."""
    from_kfd = [g["arch"] for g in facts.fingerprint.get("gpus", [])]
    return list(dict.fromkeys(from_kfd or facts.tool_arches))


def gpu_rows(facts: Facts, recipes: RecipeFacts, arch: str | None) -> list[Row]:
    gpus = facts.fingerprint.get("gpus", [])
    arches = gpu_arches(facts)
    rows = []
    if gpus:
        found = ", ".join(
            f"{g['arch']} (KFD node {g['node']}, firmware {g.get('fw_version') or '?'})"
            for g in gpus
        )
        rows.append(Row("gpu", "ok", f"AMD GPU from /sys/class/kfd: {found}"))
    elif arches:
        rows.append(Row(
            "gpu", "warn",
            f"{facts.tool} reports {', '.join(arches)}, but /sys/class/kfd has no GPU nodes",
            "check that the amdgpu driver is loaded (lsmod | grep amdgpu) and /sys is visible",
        ))  # fmt: skip
    elif arch in recipes.arches and recipes.arches[arch].vendor == "cpu":
        rows.append(Row("gpu", "info", f"no AMD GPU: /sys/class/kfd has no GPU nodes ({arch} "
                                       "needs none)"))  # fmt: skip
    else:
        tools = f"; {facts.tool} found none either" if facts.tool else ""
        rows.append(Row(
            "gpu", "warn", f"no AMD GPU: /sys/class/kfd has no GPU nodes{tools}",
            "validate ROCm stacks on the machine with the GPU (or point DOCKER_HOST at it)",
        ))  # fmt: skip
    for a in arches:
        rows.append(arch_row(a, recipes, label="this host's GPU"))
    if arch is not None and arch not in arches:
        rows.append(arch_row(arch, recipes, label="--arch"))
        info = recipes.arches.get(arch)
        if arches and info is not None and info.vendor == "amd":
            rows.append(Row(
                "--arch", "warn",
                f"{arch} is not this host's GPU ({', '.join(arches)}): its images build here, "
                f"but validating them needs a {arch} host",
            ))  # fmt: skip
    return rows


def _rules_by_kind(
    fp: Mapping[str, Any], recipes: RecipeFacts, arches: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """The known-bad host rules this host matches, grouped by the row that reports them."""
    from validate.host import host_warnings

    matched: dict[str, list[dict[str, Any]]] = {"hsa": [], "device": [], "kernel": [], "other": []}
    by_id = {r["id"]: r for r in recipes.host_rules}
    # Arch rules describe a GPU at work: only the arches of GPUs actually here count.
    for arch in arches or [None]:
        for w in host_warnings(fp, recipes.host_rules, arch):
            rule = by_id[w["id"]]
            kind = (
                "hsa" if "hsa_override" in rule
                else "device" if "device_access" in rule
                else "kernel" if "kernel_below" in rule
                else "other"
            )  # fmt: skip
            if w not in matched[kind]:
                matched[kind].append(w)
    return matched


def host_rows(facts: Facts, recipes: RecipeFacts, arch: str | None) -> list[Row]:
    fp = facts.fingerprint
    arches = gpu_arches(facts)
    has_gpu = bool(arches)
    rules = _rules_by_kind(fp, recipes, arches)
    rows = device_rows(fp, has_gpu, rules["device"])
    rows.append(hsa_row(fp, recipes, arches, rules["hsa"]))
    kernel = str(fp.get("kernel") or "?")
    if rules["kernel"]:
        for w in rules["kernel"]:
            rows.append(Row("kernel", "warn", f"Linux {kernel}: {w['warning']} ({w['id']})",
                            f"{w['fix']} (source: {w['source']})"))  # fmt: skip
    else:
        n = sum(1 for r in recipes.host_rules if "kernel_below" in r)
        rows.append(Row("kernel", "ok", f"Linux {kernel}: no known-bad kernel rule of "
                                        f"recipes/hosts.yaml matches ({n} checked)"))  # fmt: skip
    for w in rules["other"]:
        rows.append(Row(f"host rule {w['id']}", "warn", w["warning"],
                        f"{w['fix']} (source: {w['source']})"))  # fmt: skip
    return rows


def device_rows(fp: Mapping[str, Any], has_gpu: bool, rules: list[dict[str, Any]]) -> list[Row]:
    devices = list(fp.get("devices", []))
    if not any("/dri/renderD" in d["path"] for d in devices):
        devices.append({"path": "/dev/dri/renderD*", "exists": False})
    groups = set(fp.get("groups", []))
    root = fp.get("uid") == 0
    rows = []
    for d in devices:
        name = d["path"]
        for prefix in ("/dev/kfd", "/dev/dri/"):  # fake trees in tests live under a tmp root
            if prefix in name:
                name = name[name.index(prefix) :]
        if not d.get("exists"):
            if not has_gpu:
                rows.append(Row(name, "info", "absent: no AMD GPU driver here (needed only to "
                                              "validate ROCm stacks)"))  # fmt: skip
                continue
            fix = (
                rules[0]["fix"]
                if rules
                else (
                    "on a host, load the amdgpu driver (modprobe amdgpu); in a container, pass "
                    "--device=/dev/kfd --device=/dev/dri"
                )
            )
            rows.append(Row(name, "fail", "absent, though the driver reports a GPU", fix))
            continue
        desc = f"{d.get('mode', '?')} group {d.get('group', '?')}"
        if d.get("readable"):
            rows.append(Row(name, "ok", f"{desc}, read/write for you"))
        else:
            rows.append(Row(
                name, "warn" if has_gpu else "info",
                f"{desc}, not read/write for you (uid {fp.get('uid')})",
                f"sudo usermod -aG {d.get('group', 'render')} $USER, then log in again; a rootful "
                "engine hands containers the device through --device/--group-add either way, "
                "`invoke validate --local` and rootless engines do not",
            ))  # fmt: skip
    owners = sorted({d["group"] for d in devices if d.get("exists") and d.get("group")})
    wanted = sorted(set(owners) | ({"video", "render"} if has_gpu and not owners else set()))
    member = ", ".join(
        f"{g}: {'yes' if g in groups else 'no'}" for g in wanted or ["video", "render"]
    )
    missing = [g for g in wanted if g not in groups]
    if not has_gpu:
        rows.append(Row("groups", "info", f"{member} (no GPU here)"))
    elif not missing or root:
        rows.append(Row("groups", "ok", f"device nodes belong to {', '.join(wanted)}; {member}"
                                        + (" (root)" if root and missing else "")))  # fmt: skip
    else:
        rows.append(Row(
            "groups", "warn", f"device nodes belong to {', '.join(wanted)}; {member}",
            f"sudo usermod -aG {','.join(missing)} $USER, then log in again",
        ))  # fmt: skip
    return rows


def hsa_row(
    fp: Mapping[str, Any], recipes: RecipeFacts, arches: Sequence[str],
    rules: list[dict[str, Any]],
) -> Row:  # fmt: skip
    check = "HSA_OVERRIDE_GFX_VERSION"
    hsa = fp.get("hsa_override_gfx_version") or {"state": "unset"}
    needs = {a: needed_override(a, recipes) for a in arches}
    needs = {a: v for a, v in needs.items() if v}
    rule = rules[0] if rules else None
    ruled = (
        (f"{rule['warning']} ({rule['id']})", f"{rule['fix']} (source: {rule['source']})")
        if rule else None
    )  # fmt: skip
    if hsa["state"] == "unset":
        if needs:
            a, v = next(iter(needs.items()))
            return Row(
                check,
                "warn",
                f"unset; {a} runs the recipes' images only with {v}",
                f"export HSA_OVERRIDE_GFX_VERSION={v} where the images run (see arch {a})",
            )
        return Row(check, "ok", "unset (not needed" + (" by " + ", ".join(arches) if arches
                                                      else "") + ")")  # fmt: skip
    if hsa["state"] == "empty":
        found, fix = ruled or (
            "set but empty, which breaks GPU detection in the ROCm runtime",
            "unset HSA_OVERRIDE_GFX_VERSION (source: ROCm/rocm-systems#5686)",
        )
        if not arches:
            return Row(check, "warn", found + "; no GPU here, so nothing breaks yet", fix)
        return Row(check, "fail", found, fix)
    value = hsa.get("value", "")
    claims = gfx_of_override(value)
    if not arches:
        return Row(check, "info", f"set to {value}; no GPU here, so it has no effect")
    if ruled:  # crosses a major version: the rule's own words
        return Row(check, "fail", f"set to {value}: {ruled[0]}", ruled[1])
    if claims is None:
        return Row(check, "fail", f"set to {value!r}, which is not the x.y.z form the runtime reads",
                   "unset it, or set it to x.y.z (e.g. 10.3.0)")  # fmt: skip
    if set(arches) == {claims}:
        return Row(
            check,
            "warn",
            f"set to {value}, the GPU's own version: not needed",
            "unset it: an override left behind misleads once the GPU changes",
        )
    if needs and set(needs.values()) == {value.strip()}:
        return Row(check, "ok", f"set to {value}: {', '.join(needs)} runs {claims} code, as "
                                "documented for it (unsupported by AMD)")  # fmt: skip
    native = [a for a in arches if a in recipes.arches]
    return Row(
        check, "warn",
        f"set to {value}: the runtime loads {claims} code on {', '.join(arches)}"
        + (f", though {', '.join(native)} is supported natively" if native else ""),
        "unset it: with a wrong override kernels fault, hang or give wrong results rather than "
        "fall back (ROCm/rocm-systems#3461)",
    )  # fmt: skip


def disk_rows(facts: Facts, recipes: RecipeFacts, arch: str | None) -> list[Row]:
    # The source stack is worth the higher bar only where it could be built: any AMD arch.
    target = recipes.arches.get(arch) if arch else None
    source = target is None or "source" in target.stacks
    rows = []
    eng = facts.engine
    if eng.remote:
        rows.append(
            Row(
                "disk: engine",
                "info",
                f"the engine at {eng.remote} is on another machine: check its disk there",
            )
        )
    elif facts.engine_disk is not None:
        row = _disk_row("disk: engine", facts.engine_disk, source, "the engine's data root")
        if eng.data_root is None:  # measured where Docker keeps data by default: say so
            row = dataclasses.replace(row, found=row.found + " (the default data root; the "
                                      "engine did not say where its own is)")  # fmt: skip
        rows.append(row)
    if facts.build_disk is not None:
        disk = facts.build_disk
        same = (
            facts.engine_disk is not None and not eng.remote and disk.device is not None
            and disk.device == facts.engine_disk.device
        )  # fmt: skip
        if same and disk.free_bytes is not None:  # one pool of space: judged once, above
            rows.append(
                Row(
                    "disk: build dir",
                    "info",
                    f"{disk.path}: {disk.free_bytes / GIB:.0f} "
                    "GiB free, on the same filesystem as the engine's data root",
                )
            )
        else:
            rows.append(_disk_row("disk: build dir", disk, source, "the build dir"))
    return rows


def _disk_row(check: str, disk: Disk, source: bool, what: str) -> Row:
    if disk.free_bytes is None:
        return Row(
            check,
            "warn",
            f"{disk.path}: free space could not be read",
            f"check it with df -h {disk.path}",
        )
    free = disk.free_bytes / GIB
    found = f"{disk.path}: {free:.0f} GiB free"
    if free < DISK_FAIL_GIB:
        return Row(
            check,
            "fail",
            found + f", under {DISK_FAIL_GIB} GiB",
            f"free space at {what} (docker system prune, or move it to a larger disk)",
        )
    if free < DISK_SOURCE_GIB and source:
        return Row(check, "warn",
                   found + f": enough for the wheel stacks, not the {DISK_SOURCE_GIB} GiB the "
                   "source stack (PyTorch, AOTriton, CK from source) wants",
                   f"free space at {what} before building --stack source")  # fmt: skip
    return Row(check, "ok", found)


def registry_row(auth: RegistryAuth) -> Row:
    check = f"registry {auth.host}"
    if auth.how == "credHelper":
        return Row(check, "ok", f"configured via credHelper {auth.detail}")
    if auth.how == "credsStore":
        return Row(check, "ok", f"configured via credsStore {auth.detail}")
    if auth.how == "auth":
        return Row(check, "ok", f"auth entry present in {auth.detail}")
    if auth.how == "unreadable":
        return Row(
            check,
            "warn",
            f"login unknown: {auth.detail}",
            "fix or remove the engine's config file, then log in again",
        )
    return Row(
        check,
        "warn",
        f"none ({auth.detail or 'no config file'})",
        f"docker login {auth.host} (podman login {auth.host}) before --push or publish",
    )


def diagnose(facts: Facts, recipes: RecipeFacts, arch: str | None = None) -> list[Row]:
    """Every row, in the order a person fixes things: engine, GPU, host, disk, registry."""
    rows = engine_rows(facts) + gpu_rows(facts, recipes, arch) + host_rows(facts, recipes, arch)
    rows += disk_rows(facts, recipes, arch)
    if facts.registry is not None:
        rows.append(registry_row(facts.registry))
    if facts.venv_torch is not None:
        rows.append(venv_torch_row(facts.venv_torch))
    return rows


def venv_torch_row(found: VenvTorch) -> Row:
    """A torch outside the images: the environment verify-env compares with a validated stack."""
    return Row(
        "venv torch", "info", f"torch {found.version} in the venv of {found.python}",
        f"invoke verify-env --python {found.python} --against EXPORT|REPORT|IMAGE (an `invoke "
        "export` folder, a report.json or an image) names each way it differs from a validated stack",
    )  # fmt: skip


def venv_torch(env: Mapping[str, str]) -> VenvTorch | None:
    """torch's version in the venv VIRTUAL_ENV names, from its dist-info (nothing is imported)."""
    venv = env.get("VIRTUAL_ENV")
    if not venv:
        return None
    for info in sorted(Path(venv).glob("lib/python3*/site-packages/torch-*.dist-info")):
        version = info.name.removesuffix(".dist-info").split("-", 1)[1]
        return VenvTorch(str(Path(venv) / "bin" / "python"), version)
    return None


def verdict(facts: Facts, rows: Sequence[Row], recipes: RecipeFacts) -> tuple[str, int]:
    """(one sentence, exit status): 1 when anything blocks building or validating."""
    fails = [r for r in rows if r.status == "fail"]
    code = 1 if fails else 0

    def blocks_build(r: Row) -> bool:
        return r.check in {"engine", "buildkit"} or r.check.startswith("disk")

    arches = gpu_arches(facts)
    building = [r for r in fails if blocks_build(r)]
    others = [r for r in fails if not blocks_build(r)]
    but = "; ".join(f"{r.check}: {r.found}" for r in others)
    if building:
        why = "; ".join(f"{r.check}: {r.found}" for r in building)
        tail = "" if arches else "; no AMD GPU either (/sys/class/kfd has no GPU nodes)"
        return f"nothing can be built here: {why}{tail}", code
    if not arches:
        cpu = "build and validate the cpu stack, and " if "cpu" in recipes.arches else ""
        text = (
            f"no AMD GPU: /sys/class/kfd has no GPU nodes; you can {cpu}build (not validate) "
            "ROCm stacks"
        )
        return text + (f"; but {but}" if but else ""), code
    if others:
        return (
            f"you can build here, but not validate on this GPU ({', '.join(arches)}): {but}",
            code,
        )
    needs = {a: v for a in arches if (v := needed_override(a, recipes))}
    if needs:
        a, v = next(iter(needs.items()))
        return (
            f"you can build here; this {a} runs {gfx_of_override(v)} images only with "
            f"HSA_OVERRIDE_GFX_VERSION={v}, which AMD does not support", code,
        )  # fmt: skip
    stacks = list(dict.fromkeys(s for a in arches for s in recipes.arches[a].stacks))
    listed = f" ({', '.join(stacks)})" if stacks else ""
    return f"ready: you can build and validate stacks for {', '.join(arches)}{listed}", code


def to_json(facts: Facts, rows: Sequence[Row], text: str, code: int) -> dict[str, Any]:
    return {
        "verdict": text,
        "exit_code": code,
        "rows": [asdict(r) for r in rows],
        "facts": asdict(facts),
    }


# ---------------------------------------------------------------------------- gathering (I/O)


def free_disk(path: Path) -> Disk:
    """Free bytes for an unprivileged writer at path, or at its nearest existing parent."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
        return Disk(str(path), st.f_bavail * st.f_frsize, os.stat(probe).st_dev)
    except OSError:
        return Disk(str(path), None)


_GFX = re.compile(r"\bgfx\d+[0-9a-f]{2}\b")


def arches_from_tools(env: Mapping[str, str]) -> tuple[list[str], str | None]:
    """GPU arches from rocminfo, else amd-smi, when either is on PATH: the fallback for hosts
    whose /sys does not show the KFD topology."""
    path = env.get("PATH", os.defpath)
    for tool, argv in (("rocminfo", ["rocminfo"]), ("amd-smi", ["amd-smi", "static", "--asic"])):
        exe = shutil.which(tool, path=path)
        if not exe:
            continue
        try:
            proc = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return [], tool
        return list(dict.fromkeys(_GFX.findall(proc.stdout))), tool
    return [], None


def gather_engine(name: str, env: Mapping[str, str]) -> EngineFacts:
    """Connect to the engine as build and validate do; a UserError becomes a fact, not an exit."""
    from . import engine

    cli = mode = cli_error = None
    cli_hint = ""
    if name == "docker":
        try:
            cli, mode = engine.pick_docker_cli()
        except UserError as exc:
            cli_error, cli_hint = exc.message, exc.hint or ""
    docker_host = env.get("DOCKER_HOST")
    try:
        eng = engine.connect(name)
    except UserError as exc:
        return EngineFacts(name, False, exc.message, exc.hint or "", cli, mode, cli_error, cli_hint)
    except Exception as exc:  # noqa: BLE001 - an engine that answers oddly is still a row, not a crash
        return EngineFacts(name, False, f"{type(exc).__name__} while connecting", "", cli, mode,
                           cli_error, cli_hint)  # fmt: skip
    try:
        description = eng.describe()
    except Exception as exc:  # noqa: BLE001
        description = f"reachable, but describing it failed ({type(exc).__name__})"
    remote = None
    if name == "docker":
        where = eng.env.get("DOCKER_HOST") or docker_host
        if where and not where.startswith("unix://"):
            remote = where
        cli, mode = eng.cli, eng.mode
    data_root = eng.data_root()
    return EngineFacts(name, True, description, "", cli, mode, cli_error, cli_hint, remote,
                       data_root)  # fmt: skip


def podman_version(env: Mapping[str, str]) -> str | None:
    """Whether podman is installed (its --version), asked through engine.py."""
    from . import engine

    return engine.podman_version(env.get("PATH", os.defpath))


def _registry_key(name: str) -> str:
    """A config key or a user's --registry as a bare host; Docker Hub's aliases as one."""
    host = re.sub(r"^[a-z]+://", "", name.strip().lower()).split("/", 1)[0]
    return "index.docker.io" if host in {"docker.io", "registry-1.docker.io"} else host


def auth_files(engine: str, env: Mapping[str, str]) -> list[Path]:
    """Where the engine's client reads logins, in its own order (docker's config.json; podman's
    auth.json, then docker's, as containers-auth.json(5) says)."""
    home = Path(env.get("HOME") or Path.home())
    docker = (
        Path(env["DOCKER_CONFIG"]) / "config.json"
        if env.get("DOCKER_CONFIG")
        else (home / ".docker/config.json")
    )
    if engine != "podman":
        return [docker]
    found = []
    if env.get("REGISTRY_AUTH_FILE"):
        found.append(Path(env["REGISTRY_AUTH_FILE"]))
    if env.get("XDG_RUNTIME_DIR"):
        found.append(Path(env["XDG_RUNTIME_DIR"]) / "containers/auth.json")
    return [*found, home / ".config/containers/auth.json", docker]


def registry_auth(host: str, files: Sequence[Path]) -> RegistryAuth:
    """How a login for host is configured. Reads only key names and helper names: a credential
    never leaves this function, and none is returned."""
    want = _registry_key(host)
    for path in files:
        if not path.is_file():
            continue
        try:
            config = json.loads(path.read_text())
            if not isinstance(config, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            return RegistryAuth(host, "unreadable", f"{path}: {type(exc).__name__}")
        helpers = {_registry_key(k): v for k, v in (config.get("credHelpers") or {}).items()}
        if want in helpers:
            return RegistryAuth(host, "credHelper", str(helpers[want]))
        auths = {_registry_key(k): v for k, v in (config.get("auths") or {}).items()}
        entry = auths.get(want)
        if isinstance(entry, dict) and (entry.get("auth") or entry.get("identitytoken")):
            return RegistryAuth(host, "auth", str(path))
        if entry is not None and config.get("credsStore"):
            return RegistryAuth(host, "credsStore", str(config["credsStore"]))
    read = [str(p) for p in files if p.is_file()]
    return RegistryAuth(host, "none", f"no entry in {', '.join(read)}" if read else "")


def gather(
    engine_name: str, build_dir: Path, registry: str | None = None, root: Path = Path("/"),
    env: Mapping[str, str] | None = None,
) -> Facts:  # fmt: skip
    """Every fact the doctor judges, read from this machine (root: a fake tree in tests)."""
    from validate.host import fingerprint

    env = os.environ if env is None else env
    fp = fingerprint(root, env)
    tool_arches, tool = ([], None) if fp["gpus"] else arches_from_tools(env)
    eng = gather_engine(engine_name, env)
    data_root = eng.data_root or (DOCKER_DEFAULT_ROOT if engine_name == "docker" else None)
    return Facts(
        fingerprint=fp,
        engine=eng,
        podman=podman_version(env) if engine_name == "docker" else None,
        buildkit_host=env.get("BUILDKIT_HOST") or None,
        tool_arches=tool_arches,
        tool=tool,
        engine_disk=free_disk(Path(data_root)) if data_root and not eng.remote else None,
        build_disk=free_disk(build_dir),
        registry=registry_auth(registry, auth_files(engine_name, env)) if registry else None,
        venv_torch=venv_torch(env),
    )
