"""Recipe models and loading: recipes/*.yaml -> checked, cross-referenced Recipes.

Strict: unknown keys are errors, and every error names the file, the line and the field.
Pure: reads files under the repo root and nothing else.
"""

from __future__ import annotations

import fnmatch
import re
import string
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from . import yamlsrc
from .errors import RecipeError, UserError

# Names a template in args, pins or expectations may use, and what they mean.
TEMPLATE_VARS = {
    "arch": "the arch name (gfx1151)",
    "family": "the arch family (rdna3.5)",
    "vendor": "amd, nvidia or cpu",
    "wave_size": "32 or 64",
    "therock_extra": "TheRock pip extra for the arch (device-gfx1151)",
    "variant": "the layer variant chosen for the arch",
    "jobs": "build parallelism (hint args only)",
    "aotriton_experimental": "1 if the layer's AOTriton marks the arch experimental, else 0",
    "aotriton_status": "supported, experimental, tech-preview or none for the layer's AOTriton",
    "aotriton": "the AOTriton tag the layer's torch carries, as the recipe says (empty when none)",
    "harmful_code_variants": "target ids arches.yaml marks harmful for the arch, space-separated "
    "(empty when none)",
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AotritonSupport(Strict):
    since: str = Field(description="first AOTriton tag that builds kernels for this arch")
    experimental: list[str] = Field(
        default_factory=list,
        description="AOTriton tags in which torch needs TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1",
    )
    tech_preview: list[str] = Field(
        default_factory=list,
        description="AOTriton tags in which isArchTechPreview() is true for it: torch runs it "
        "without the experimental variable (pytorch#188612)",
    )


class HarmfulVariants(Strict):
    """Code-object variants for an arch that break loading where they are present."""

    variants: list[str] = Field(
        description="target ids (gfx90a:xnack+) whose code objects or kernel packs fail the "
        "device_code check where found"
    )
    why: str = Field(description="what they break, with the upstream source")


class SdpaLimits(Strict):
    """What PyTorch's SDPA refuses by design on an arch: validation records such a refusal,
    with PyTorch's reason, as the expected outcome (and judges a backend that accepts)."""

    head_dim_max: int = Field(gt=0, description="the largest head dim the fused backends take")
    backends: list[Literal["flash", "efficient", "cudnn"]] = Field(
        default_factory=lambda: ["flash", "efficient"], description="the backends that refuse"
    )
    source: str = Field(description="the upstream change or report, with its date")


class Registers(Strict):
    """An AMD arch's register file as occupancy counts it (LLVM's AMDGPU target)."""

    vgprs: int = Field(gt=0, description="VGPRs per SIMD lane (CDNA: VGPR+AGPR unified)")
    granule: int = Field(gt=0, description="the allocation granule of VGPRs")
    max_waves: int = Field(gt=0, description="the most waves a SIMD holds")


class Neighbour(Strict):
    """Arches the recipes lack, their family and what is documented about running them."""

    arches: list[str] = Field(min_length=1)
    family: str
    note: str
    source: str
    override: str | None = Field(None, description="HSA_OVERRIDE_GFX_VERSION value documented "
                                 "for these arches")  # fmt: skip
    target: str | None = Field(None, description="the arch that value makes the runtime load "
                               "code for")  # fmt: skip


class Arch(Strict):
    name: str = ""
    description: str
    vendor: Literal["amd", "nvidia", "cpu"]
    family: str
    wave_size: int | None = None
    matrix_unit: str | None = None
    lds_bytes: int | None = None
    registers: Registers | None = None
    therock_extra: str | None = None
    aotriton: AotritonSupport | None = None
    harmful_code_variants: HarmfulVariants | None = None
    sdpa_limits: SdpaLimits | None = None

    def aotriton_status(self, version: str | None) -> str:
        """supported / experimental / tech-preview / none for an AOTriton version ('none'
        without one). Only experimental needs TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1."""
        if version is None or self.aotriton is None:
            return "none"
        try:
            if aotriton_key(version) < aotriton_key(self.aotriton.since):
                return "none"
        except InvalidVersion:
            return "none"
        if version in self.aotriton.tech_preview:
            return "tech-preview"
        return "experimental" if version in self.aotriton.experimental else "supported"


def aotriton_key(tag: str) -> Version:
    """An AOTriton tag as a comparable version."""
    # AOTriton tags look like 0.11.2b or 0.13.50tp; the suffix is a channel, not a pre-release.
    return Version(re.sub(r"[a-z]+$", "", tag))


class SmokeCheck(Strict):
    """One assertion run in a freshly built image; exactly one kind per check
    (docs/build-checks.md says what each kind catches)."""

    name: str
    dist: str | None = Field(None, description="a distribution that must be installed")
    version: str | None = Field(None, description="with dist: its exact version")
    absent: str | None = Field(None, description="a distribution that must NOT be installed")
    torch_build: Literal["cpu", "hip", "cuda"] | None = Field(
        None, description="what torch must be built for"
    )
    python: str | None = Field(None, description="a Python snippet that must exit 0")
    wheel_set: str | None = Field(
        None,
        description="wheels that must all be installed and of one ROCm build, space-separated: "
        "NAME, NAME==VERSION (pinned) or a glob (rocm-sdk-*: whatever is installed must match). "
        "The first one (torch) defines the build by its local label (+rocm10.1.0); the others "
        "must carry the same label, and rocm/rocm-sdk-* the same release (10.1.0)",
    )
    extras: str | None = Field(
        None,
        description="with wheel_set: DIST[EXTRA] words (torch[device-gfx1151]); every wheel the "
        "installed DIST's own metadata requires for EXTRA joins the set",
    )
    aotriton_arch: str | None = Field(
        None,
        description="with wheel_set: an installed wheel of the set must carry torch's "
        "lib/aotriton.images folder for this arch or its family (amd-gfx115x)",
    )
    device_code: str | None = Field(
        None,
        description="paths or globs, space-separated, that must hold GPU code for `arch`: "
        "absolute (/opt/aotriton/lib/aotriton.images) or PACKAGE:RELATIVE (torch:lib/"
        "aotriton.images), found without importing the package. An aotriton.images folder "
        "needs a non-empty image folder for the arch or its family, a .kpack folder a "
        "*_<arch>.kpack, other files and folders a code object or offload bundle for the arch",
    )
    arch: str | None = Field(None, description="with device_code: the GPU arch ({arch})")
    harmful: str | None = Field(
        None,
        description="with device_code: target ids, space-separated, whose code objects or "
        "kernel packs fail the check where found ({harmful_code_variants})",
    )
    linkage: str | None = Field(
        None,
        description="native extensions, space-separated paths or globs (absolute, or "
        "PACKAGE:RELATIVE as for device_code; a folder means every .so in it): every DT_NEEDED "
        "must resolve as the loader would (RPATH, LD_LIBRARY_PATH, RUNPATH, ld.so cache, "
        "default folders, or a library `preload` loaded) and every undefined symbol must be "
        "defined by a library the extension loads or by the interpreter",
    )
    preload: str | None = Field(
        None,
        description="with linkage: modules imported before the extension loads, space-separated "
        "(torch: its libc10/libtorch are then loaded, as when a user imports torch first)",
    )
    observe: str | None = Field(
        None,
        description="KEY=VALUE words, what the recipe inferred (aotriton={aotriton} arch={arch}): "
        "compared with what the layer's last step read from the image's files into the versions "
        "manifest (attnforge/observe.py); a difference is said in one sentence",
    )
    hip_runtime: str | None = Field(
        None,
        description="a HIP runtime's library name as rocm_sdk.find_libraries takes it "
        "(amdhip64): after `import torch` the one file of it mapped into the process must be "
        "the one rocm_sdk names, no second one may lie where torch or Triton could load it, and "
        "with a GPU one Triton kernel must run (Triton 3.9 refuses to mix ROCm installations)",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> SmokeCheck:
        kinds = [k for k in _SMOKE_KINDS if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError(f"a smoke check needs exactly one of {', '.join(_SMOKE_KINDS)}")
        for field, kind in (("version", "dist"), ("extras", "wheel_set"),
                            ("aotriton_arch", "wheel_set"), ("arch", "device_code"),
                            ("harmful", "device_code"), ("preload", "linkage")):  # fmt: skip
            if getattr(self, field) and kinds[0] != kind:
                raise ValueError(f"{field} goes with {kind}")
        if self.device_code and not self.arch:
            raise ValueError('device_code needs arch (usually "{arch}")')
        if self.wheel_set is not None:
            words = self.wheel_set.split()
            bad = [w for w in words if not _WHEEL_WORD.fullmatch(w)]
            if bad:
                raise ValueError(f"wheel_set entry {bad[0]!r} is not NAME, NAME==VERSION or a glob")
            if not words or "*" in words[0]:
                raise ValueError("wheel_set must start with the wheel that defines the build")
        for word in (self.extras or "").split():
            if not _EXTRA_WORD.fullmatch(word):
                raise ValueError(f"extras entry {word!r} is not DIST[EXTRA]")
        for kind in ("device_code", "linkage"):
            for word in (getattr(self, kind) or "").split():
                if not _CODE_PATH.fullmatch(word):
                    raise ValueError(
                        f"{kind} entry {word!r} is not an absolute path or PACKAGE:RELATIVE"
                    )
        for word in (self.preload or "").split():
            if not _MODULE.fullmatch(word):
                raise ValueError(f"preload entry {word!r} is not a module name")
        return self


_SMOKE_KINDS = (
    "dist", "absent", "torch_build", "python", "wheel_set", "device_code", "linkage", "hip_runtime",
    "observe",
)  # fmt: skip
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
# Templates ({arch}, {TORCH_VERSION}) are filled later, so braces are allowed in these words.
_WHEEL_WORD = re.compile(r"[A-Za-z0-9{][A-Za-z0-9._*{}-]*(==[A-Za-z0-9._+!{}-]+)?")
_EXTRA_WORD = re.compile(r"[A-Za-z0-9{][A-Za-z0-9._{}-]*\[[A-Za-z0-9._{}-]+\]")
_CODE_PATH = re.compile(r"(/|[A-Za-z_][A-Za-z0-9_]*:)[A-Za-z0-9._/*?{}\[\]-]*")


class SourcePin(Strict):
    repo: str = Field(description="where the source is fetched from (an https/git/ssh/file URL)")
    ref: str = Field(description="the commit built: 40 lowercase hex digits")
    tag: str | None = Field(
        None, description="the release tag ref is, if any; `invoke pins.check` confirms it"
    )


CxxStd = Literal["c++17", "c++20"]
# Ordered: code built as a later standard compiles against headers that ask for an earlier one.
CXX_STD_ORDER = ("c++17", "c++20")


class TorchCxx(Strict):
    """How a layer compiles C++ that includes torch's headers; the planner refuses a layer whose
    standard is older than the one its torch requires (recipes/torch.yaml), at --dry-run."""

    std: Literal["c++17", "c++20", "torch", "none"] = Field(
        description="the -std= of its C++ that includes torch's headers: c++17 or c++20 when its "
        "build hard-codes one; torch when it takes torch.utils.cpp_extension's default (which "
        "follows torch); none when it compiles no C++ against torch"
    )
    source: str = Field(description="where that was read: repository@commit:path:lines")


class TorchCxxRule(Strict):
    """The C++ standard code compiled against torch's headers must use, for a range of torch."""

    torch: str = Field(description="PEP 440 specifier on torch's release, e.g. '>=2.14'")
    std: CxxStd
    cite: str = Field(description="a short citation the planner's refusal shows (pytorch#178150)")
    source: str = Field(description="where this is documented or was observed, with dates")


class TorchFile(Strict):
    cxx_standard: list[TorchCxxRule]


class TorchTritonRow(Strict):
    """recipes/tritons.yaml `torch:`: the Triton a torch release line's wheels require."""

    torch: str = Field(description="a torch release line, e.g. '2.14'")
    triton: str = Field(description="the Triton release its wheels require, e.g. '3.8.0'")
    source: str = Field(description="where this was read, with the date")


class NewestTriton(Strict):
    triton: str = Field(description="the newest Triton release (nightly stacks are checked at it)")
    source: str


class KnownTritonProblem(Strict):
    """What one Triton line does to one kernel that the tiles do not fix."""

    triton: str = Field(description="a Triton line, e.g. '3.9'")
    arch: str
    head_dim: int
    kernel: str
    happens: str
    reason: str
    fallback: str


class TritonsFile(Strict):
    """recipes/tritons.yaml: which Triton the bundled kernels meet in each stack."""

    torch: list[TorchTritonRow]
    newest: NewestTriton
    known: list[KnownTritonProblem] = Field(default_factory=list)

    def row_for(self, line: str) -> TorchTritonRow | None:
        """The row of a torch release line ('2.14'), or None."""
        return next((r for r in self.torch if r.torch == line), None)


class Variant(Strict):
    arches: list[str] | None = None
    gated_because: str | None = None
    args: dict[str, str] = Field(default_factory=dict)
    hint_args: dict[str, str] = Field(
        default_factory=dict, description="build args that do not change the output"
    )
    pins: dict[str, str] = Field(default_factory=dict)
    aotriton: str | None = Field(
        None, description="the AOTriton tag this variant's torch carries (overrides the layer's)"
    )
    from_set: list[str] = Field(
        default_factory=list,
        description="pins that have no fixed value (a nightly's version): each must be given "
        "with --set LAYER.KEY=VALUE, else the layer is not built",
    )
    expect: dict[str, Any] = Field(default_factory=dict)
    torch_cxx: TorchCxx | None = Field(None, description="overrides the layer's torch_cxx")


class Layer(Strict):
    name: str
    description: str
    dockerfile: str
    follows: str = Field(description="the upstream file(s) this layer's steps follow")
    provides: list[str] = Field(default_factory=list)
    needs: list[str] = Field(default_factory=list)
    arches: list[str] = Field(default_factory=lambda: ["all"])
    gated_because: str | None = Field(None, description="why arches excludes the rest")
    args: dict[str, str] = Field(default_factory=dict)
    hint_args: dict[str, str] = Field(
        default_factory=dict, description="build args that do not change the output"
    )
    pins: dict[str, str] = Field(default_factory=dict)
    source: SourcePin | None = None
    patches: list[str] = Field(default_factory=list)
    context: list[str] = Field(default_factory=list)
    wheelhouse: bool = False
    aotriton: str | None = Field(None, description="the AOTriton tag this layer's torch carries")
    smoke: list[SmokeCheck] = Field(default_factory=list)
    expect: dict[str, Any] = Field(default_factory=dict)
    variants: dict[str, Variant] = Field(default_factory=dict)
    torch_cxx: TorchCxx | None = Field(
        None, description="how it compiles C++ against torch's headers (layers that need torch)"
    )
    torch_version_pin: str | None = Field(
        None, description="the pin that holds the version of the torch it provides (TORCH_VERSION)"
    )

    def torch_cxx_for(self, variant: str | None) -> TorchCxx | None:
        """How this layer (as built with `variant`) compiles C++ against torch's headers."""
        chosen = self.variants.get(variant) if variant else None
        return (chosen.torch_cxx if chosen else None) or self.torch_cxx

    def aotriton_for(self, variant: str | None) -> str | None:
        """The AOTriton tag the torch of this layer (as built with `variant`) carries."""
        chosen = self.variants.get(variant) if variant else None
        return (chosen.aotriton if chosen else None) or self.aotriton


class StackEntry(Strict):
    layer: str
    variant: str | list[str] | None = None
    optional: bool = False


class BenchGate(Strict):
    """Results of `python -m validate bench` that must keep their speed against the baseline."""

    backend: str = Field(description="a bench backend (kernels, sdpa.flash, ...) or a glob")
    shape: str = Field("*", description="a bench shape name or glob (sweep-*, sweep-*-d128-*)")
    mode: Literal["fwd", "bwd", "fwd_bwd", "all"] = Field("all", description="which pass")
    min_ratio: float | None = Field(
        None, gt=0, description="least speed against the baseline (baseline ms / now ms; "
        "default: bench_gates.min_ratio)",
    )  # fmt: skip


class BenchGates(Strict):
    """A stack's benchmark gates (docs/validation.md, "Baselines"): `invoke validate --bench`
    fails when a gated result's median speed falls below min_ratio of the baseline's."""

    min_ratio: float = Field(0.9, gt=0, description="threshold of the gates that set none")
    gates: list[BenchGate] = Field(
        description="read in order: the first gate that matches a result decides"
    )


class Stack(Strict):
    name: str = ""
    description: str
    arches: list[str]
    base_image: str
    local_base_image: str | None = Field(
        None,
        description="an image `tools/setup.sh base-image` makes without a registry (debootstrap + "
        "docker import); builds use it when base_image is not in the engine",
    )
    layers: list[str | StackEntry]
    expect: dict[str, Any] = Field(default_factory=dict)
    fused: dict[str, list[str]] = Field(
        default_factory=dict,
        description="workloads (contract/workloads.py) whose every shape must run a fused SDPA "
        "backend, not math, each with the arch selectors it is promised for; becomes the "
        "expectation sdpa.workload.<name>.fused: true on those arches",
    )
    bench_gates: BenchGates | None = None

    def entries(self) -> list[StackEntry]:
        out = []
        for item in self.layers:
            if isinstance(item, str):
                layer, _, variant = item.partition(":")
                out.append(StackEntry(layer=layer, variant=variant or None))
            else:
                out.append(item)
        return out


class ArchesFile(Strict):
    arches: dict[str, Arch]
    neighbours: list[Neighbour] = Field(default_factory=list)


class HostRule(Strict):
    """A host known to break ROCm work, whatever the stack: validation warns with the fix, and a
    crash on such a host is marked host-suspect. Every condition given must hold."""

    id: str
    warning: str = Field(description="what goes wrong on such a host, as a sentence")
    fix: str = Field(description="what to change on the host")
    fix_on_host: str | None = Field(
        None,
        description="the fix when the suite runs on the host itself (invoke validate "
        "--local), where `fix` speaks of the container",
    )
    source: str = Field(description="where this is documented: repository, path or issue, date")
    arches: list[str] | None = Field(None, description="only hosts with one of these GPUs")
    kernel_below: str | None = Field(None, description="Linux releases older than this")
    hsa_override: Literal["empty", "crosses_major"] | None = Field(
        None, description="HSA_OVERRIDE_GFX_VERSION set but empty, or to another GPU generation"
    )
    device_access: Literal["missing"] | None = Field(
        None, description="the suite cannot open /dev/kfd"
    )

    @model_validator(mode="after")
    def _has_a_condition(self) -> HostRule:
        if not (self.arches or self.kernel_below or self.hsa_override or self.device_access):
            raise ValueError("a host rule needs a condition: arches, kernel_below, hsa_override "
                             "or device_access")  # fmt: skip
        return self


class HostsFile(Strict):
    known_bad: list[HostRule] = Field(default_factory=list)


class StacksFile(Strict):
    stacks: dict[str, Stack]


@dataclass(frozen=True)
class Recipes:
    """Everything under recipes/, loaded and cross-checked."""

    root: Path
    arches: dict[str, Arch]
    layers: dict[str, Layer]
    stacks: dict[str, Stack]
    layer_files: dict[str, str]
    host_rules: tuple[HostRule, ...] = ()
    torch_cxx: tuple[TorchCxxRule, ...] = ()  # recipes/torch.yaml
    neighbours: tuple[Neighbour, ...] = ()  # arches.yaml: arches the recipes lack
    tritons: TritonsFile | None = None  # recipes/tritons.yaml


# ---------------------------------------------------------------------------- pin formats
#
# A value in args, hint_args or pins becomes a `docker build --build-arg`, is expanded by the
# shell of a RUN line and is filled into smoke-check snippets, so it must never be able to carry
# syntax. Its *kind* is read from its key, so recipes stay as they are and `--set` overrides of the
# same key get the same check (check_pin):
#
#   SOURCE_REF, *_COMMIT   commit   40 lowercase hex digits. Never abbreviated: builds run
#                                   `git fetch <repo> <commit>`, and servers only accept full ids
#   *_TAG (source.tag)     tag      a git tag name (git check-ref-format rules)
#   *_VERSION              version  a PEP 440 version (packaging.version), e.g. 2.11.0+rocm7.13.0
#   *_SHA256               sha256   64 lowercase hex digits
#   *_DIGEST               digest   sha256:<64 lowercase hex digits>
#   SOURCE_REPO, *_URL     url      https/http/git/ssh/file URL (a *_URL may be empty: "none")
#   anything else          string   letters, digits, space and . _ + , : / = @ % - only

PIN_KINDS = {
    "commit": "SOURCE_REF, *_COMMIT",
    "tag": "*_TAG",
    "version": "*_VERSION",
    "sha256": "*_SHA256",
    "digest": "*_DIGEST",
    "url": "SOURCE_REPO, *_URL",
    "string": "any other key",
}
# Nothing here is special to sh/bash, Python string literals or Dockerfile parsing; space stays
# for word lists such as APT_PACKAGES, and '-' may not start a word (it would read as an option).
SAFE_CHARS = "letters, digits, space and . _ + , : / = @ % -"
_SAFE = re.compile(r"[A-Za-z0-9 ._+,:/=@%-]*")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_URL = re.compile(r"(https|http|git|ssh|file)://[A-Za-z0-9._:/@%+=,-]+")
# Names that end up in a template (arch, family, TheRock extra, variant) or a path list.
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_IMAGE_REF = re.compile(r"[a-z0-9][A-Za-z0-9._/:@-]*")
_PATH = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._/-]*")


def pin_kind(key: str) -> str:
    """The kind of value a key holds: commit, tag, version, sha256, digest, url or string."""
    if key == "SOURCE_REF" or key.endswith("_COMMIT"):
        return "commit"
    if key == "SOURCE_REPO" or key.endswith("_URL"):
        return "url"
    for suffix, kind in (("_TAG", "tag"), ("_VERSION", "version"), ("_SHA256", "sha256")):
        if key.endswith(suffix):
            return kind
    if key.endswith("_DIGEST"):
        return "digest"
    return "string"


def _tag_problem(tag: str) -> str | None:
    """Why a name is not a valid git tag (git-check-ref-format(1) rules), or None."""
    if not re.fullmatch(r"[A-Za-z0-9._+/-]+", tag):
        return "may hold only letters, digits and . _ + / -"
    if tag.startswith(("-", "/")) or tag.endswith(("/", ".", ".lock")):
        return "may not start with '-' or '/' nor end with '/', '.' or '.lock'"
    parts = tag.split("/")
    if "" in parts or any(p.startswith(".") or p.endswith(".lock") for p in parts):
        return "has an empty component or one starting with '.' or ending with '.lock'"
    if ".." in tag:
        return "may not contain '..'"
    return None


def check_pin(key: str, value: str) -> str | None:
    """None if `value` is a well-formed, shell-safe value for `key`, else the reason (a clause
    that names the key, the value and the valid format). For recipe values and `--set KEY=VALUE`."""
    return _check_value(key, value, templated=False)


def _check_value(key: str, value: str, *, templated: bool) -> str | None:
    shown = value
    if templated:
        # {arch} & co. are checked where they are defined (arches.yaml, variant names), so a
        # template stands in for a harmless token here; unknown names were rejected before.
        value = re.sub(r"\{(\w+)\}", "0", value)
    if not _KEY.fullmatch(key):
        return f"key {key!r} must be a name of letters, digits and _ (it becomes a build ARG)"
    kind = pin_kind(key)
    if kind == "commit" and not _COMMIT.fullmatch(value):
        return (
            f"{key} pins a git commit, which must be 40 lowercase hex digits "
            f"(`git fetch` needs the full id), not {shown!r}"
        )
    if kind == "sha256" and not _SHA256.fullmatch(value):
        return f"{key} pins a sha256, which must be 64 lowercase hex digits, not {shown!r}"
    if kind == "digest" and not (
        value.startswith("sha256:") and _SHA256.fullmatch(value.removeprefix("sha256:"))
    ):
        return f"{key} pins a digest, which must be sha256:<64 lowercase hex digits>, not {shown!r}"
    if kind == "tag" and (why := _tag_problem(value)):
        return f"{key} pins a git tag, and {shown!r} is not one: a tag {why}"
    if kind == "version":
        try:
            if value != value.strip() or not value:
                raise InvalidVersion(value)
            Version(value)
        except InvalidVersion:
            return (
                f"{key} pins a version, which must be a PEP 440 version such as 2.11.0 or "
                f"2.11.0+rocm7.13.0, not {shown!r}"
            )
    if kind == "url" and not (_URL.fullmatch(value) or (value == "" and key != "SOURCE_REPO")):
        return (
            f"{key} holds a URL, which must be https://, http://, git://, ssh:// or file:// "
            f"followed by letters, digits and . _ : / @ % + = , - only, not {shown!r}"
        )
    bad = sorted({c for c in value if not _SAFE.fullmatch(c)})
    if bad:
        return (
            f"{key} is {shown!r}, and {', '.join(map(repr, bad))} could be read as shell or "
            f"Dockerfile syntax (allowed: {SAFE_CHARS})"
        )
    if any(word.startswith("-") for word in value.split(" ")):
        return f"{key} is {shown!r}, in which a word starting with '-' would read as an option"
    return None


def _check_values(
    values: dict[str, Any], file: str, src: yamlsrc.Source, loc: tuple, *, templated: bool
) -> None:
    for key, value in values.items():
        why = _check_value(str(key), str(value), templated=templated)
        if why:
            raise RecipeError(
                file,
                why,
                line=src.line_of((*loc, key)),
                field=".".join(map(str, (*loc, key))),
            )


def _check_format(
    value: str, pattern: re.Pattern[str], what: str, file: str, src: yamlsrc.Source, loc: tuple
) -> None:
    if not pattern.fullmatch(value):
        raise RecipeError(
            file,
            f"{value!r} is not {what}",
            line=src.line_of(loc),
            field=".".join(map(str, loc)),
        )


def _validate(model: type[BaseModel], src: yamlsrc.Source) -> Any:
    try:
        return model.model_validate(src.data if src.data is not None else {})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or None
        choices = None
        if err["type"] == "extra_forbidden":
            message = "unknown key"
            parent = _model_at(model, loc[:-1])
            if parent is not None:
                choices = list(parent.model_fields)
        elif err["type"] == "literal_error":
            message = f"{err['msg'].lower()}"
        else:
            message = err["msg"].removeprefix("Value error, ")
        raise RecipeError(
            src.file, message, line=src.line_of(loc), field=field, choices=choices
        ) from None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The nested model class at a pydantic error location (to list its valid keys)."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            info = current.model_fields.get(str(part))
            if info is None:
                return None
            current = info.annotation
            if typing.get_origin(current) in (typing.Union, types.UnionType):
                current = _unwrap(current)  # an optional model (bench_gates) takes no index
        else:
            current = _unwrap(current)
            if current is None:
                return None
    current = (
        _unwrap(current)
        if not (isinstance(current, type) and issubclass(current, BaseModel))
        else current
    )
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    args = getattr(annotation, "__args__", ())
    for arg in reversed(args):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return args[-1] if args else None


def selector_matches(selector: str, arch: Arch) -> bool:
    """An arch selector: 'all', an arch name, 'family:<f>' or 'vendor:<v>'."""
    if selector == "all":
        return True
    kind, _, value = selector.partition(":")
    if not value:
        return selector == arch.name
    return (kind == "family" and value == arch.family) or (
        kind == "vendor" and value == arch.vendor
    )


def selectors_match(selectors: list[str], arch: Arch) -> bool:
    """Whether a list of selectors admits an arch; an arch set (attnforge/multiarch.py) is
    admitted where every member is."""
    members = getattr(arch, "members", None) or (arch,)
    return all(any(selector_matches(s, m) for s in selectors) for m in members)


def _check_selectors(
    selectors: list[str], arches: dict[str, Arch], file: str, src: yamlsrc.Source, loc: tuple
) -> None:
    families = {a.family for a in arches.values()}
    vendors = {a.vendor for a in arches.values()}
    for i, sel in enumerate(selectors):
        kind, _, value = sel.partition(":")
        ok = (
            sel == "all"
            or (not value and sel in arches)
            or (kind == "family" and value in families)
            or (kind == "vendor" and value in vendors)
        )
        if not ok:
            valid = [
                "all",
                *arches,
                *(f"family:{f}" for f in families),
                *(f"vendor:{v}" for v in vendors),
            ]
            raise RecipeError(
                file,
                f"unknown arch selector {sel!r}",
                line=src.line_of((*loc, i)),
                field=".".join(map(str, loc)),
                choices=valid,
            )


def _check_templates(values: dict[str, Any], file: str, src: yamlsrc.Source, loc: tuple) -> None:
    for key, value in values.items():
        if not isinstance(value, str):
            continue
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(value) if f is not None}
        except ValueError as exc:
            raise RecipeError(
                file,
                f"bad template: {exc}",
                line=src.line_of((*loc, key)),
                field=f"{'.'.join(map(str, loc))}.{key}",
            ) from None
        for name in names:
            if name not in TEMPLATE_VARS:
                raise RecipeError(
                    file,
                    f"unknown template variable {{{name}}}",
                    line=src.line_of((*loc, key)),
                    field=f"{'.'.join(map(str, loc))}.{key}",
                    choices=TEMPLATE_VARS,
                )


def known_bench_backends() -> tuple[str, ...] | None:
    """The benchmark's backends (contract/names.py)."""
    from contract.names import BACKEND_NAMES

    return BACKEND_NAMES


def _check_bench_gates(gates: BenchGates | None, file: str, src: yamlsrc.Source, loc: tuple) -> None:  # fmt: skip
    backends = known_bench_backends()
    if gates is None or backends is None:
        return
    for i, gate in enumerate(gates.gates):
        if any(c in gate.backend for c in "*?["):
            if not any(fnmatch.fnmatchcase(b, gate.backend) for b in backends):
                raise RecipeError(file, f"backend glob {gate.backend!r} matches no bench backend",
                                  line=src.line_of((*loc, "gates", i, "backend")),
                                  field=".".join(map(str, (*loc, "gates", i, "backend"))),
                                  choices=backends)  # fmt: skip
        elif gate.backend not in backends:
            raise RecipeError(file, f"unknown bench backend {gate.backend!r}",
                              line=src.line_of((*loc, "gates", i, "backend")),
                              field=".".join(map(str, (*loc, "gates", i, "backend"))),
                              choices=backends)  # fmt: skip


def known_expect_keys() -> dict[str, str] | None:
    """The validation suite's expectation vocabulary, when the validate package is importable."""
    try:
        from validate.expect import KNOWN_KEYS  # stdlib-only module of the in-image suite
    except Exception:  # noqa: BLE001 - absent or broken: skip this check, validation will catch it
        return None
    return dict(KNOWN_KEYS)


def _check_expect(expect: dict[str, Any], file: str, src: yamlsrc.Source, loc: tuple) -> None:
    keys = known_expect_keys()
    if keys is None:
        return
    for key in expect:
        if key not in keys:
            raise RecipeError(
                file,
                "unknown expectation key",
                line=src.line_of((*loc, key)),
                field=f"{'.'.join(map(str, loc))}.{key}",
                choices=keys,
            )


def load_recipes(root: Path) -> Recipes:
    """Load and cross-check recipes/arches.yaml, recipes/stacks.yaml and recipes/layers/*.yaml."""
    root = Path(root)
    rdir = root / "recipes"
    if not rdir.is_dir():
        raise UserError(f"no recipes/ folder under {root}; run attnforge from the repository root")

    arches_src = yamlsrc.load(rdir / "arches.yaml", "recipes/arches.yaml")
    arches_file: ArchesFile = _validate(ArchesFile, arches_src)
    arches = {n: a.model_copy(update={"name": n}) for n, a in arches_file.arches.items()}
    _check_arches(arches, arches_src)
    for i, n in enumerate(arches_file.neighbours):
        known = sorted(set(n.arches) & set(arches))
        if known:
            raise RecipeError("recipes/arches.yaml", f"neighbours lists {', '.join(known)}, which "
                              "arches: describes; a neighbour is an arch the recipes lack",
                              line=arches_src.line_of(("neighbours", i, "arches")),
                              field=f"neighbours.{i}.arches")  # fmt: skip

    layers: dict[str, Layer] = {}
    layer_files: dict[str, str] = {}
    for path in sorted((rdir / "layers").glob("*.yaml")):
        rel = f"recipes/layers/{path.name}"
        src = yamlsrc.load(path, rel)
        layer: Layer = _validate(Layer, src)
        if layer.name != path.stem:
            raise RecipeError(
                rel,
                f"name {layer.name!r} must match the file name {path.stem!r}",
                line=src.line_of(("name",)),
                field="name",
            )
        _check_layer(layer, root, arches, rel, src)
        layers[layer.name] = layer
        layer_files[layer.name] = rel

    stacks_src = yamlsrc.load(rdir / "stacks.yaml", "recipes/stacks.yaml")
    stacks_file: StacksFile = _validate(StacksFile, stacks_src)
    stacks = {n: s.model_copy(update={"name": n}) for n, s in stacks_file.stacks.items()}
    for stack in stacks.values():
        _check_stack(stack, layers, arches, stacks_src)
    hosts: tuple[HostRule, ...] = ()
    if (rdir / "hosts.yaml").is_file():
        hosts_src = yamlsrc.load(rdir / "hosts.yaml", "recipes/hosts.yaml")
        hosts = tuple(_validate(HostsFile, hosts_src).known_bad)
        for i, rule in enumerate(hosts):
            unknown_arches = set(rule.arches or ()) - set(arches)
            if unknown_arches:
                raise RecipeError("recipes/hosts.yaml", "unknown arch", field="arches",
                                  line=hosts_src.line_of(("known_bad", i, "arches")),
                                  choices=arches)  # fmt: skip
    torch_rules: tuple[TorchCxxRule, ...] = ()
    if (rdir / "torch.yaml").is_file():
        torch_src = yamlsrc.load(rdir / "torch.yaml", "recipes/torch.yaml")
        torch_rules = tuple(_validate(TorchFile, torch_src).cxx_standard)
        for i, rule in enumerate(torch_rules):
            try:
                SpecifierSet(rule.torch)
            except InvalidSpecifier:
                raise RecipeError("recipes/torch.yaml", f"{rule.torch!r} is not a version "
                                  "specifier such as '>=2.14'", field="cxx_standard.torch",
                                  line=torch_src.line_of(("cxx_standard", i, "torch"))) from None  # fmt: skip
    return Recipes(root, arches, layers, stacks, layer_files, hosts, torch_rules,
                   tuple(arches_file.neighbours), load_tritons(root))  # fmt: skip


TRITONS = "recipes/tritons.yaml"


def load_tritons(root: Path) -> TritonsFile | None:
    """recipes/tritons.yaml loaded strictly (unknown keys, malformed YAML and versions are errors
    with the line and field); None where a tree has no such file."""
    path = Path(root) / TRITONS
    if not path.is_file():
        return None
    src = yamlsrc.load(path, TRITONS)
    table: TritonsFile = _validate(TritonsFile, src)
    fields = [(("torch", i, "torch"), r.torch + ".0") for i, r in enumerate(table.torch)]
    fields += [(("torch", i, "triton"), r.triton) for i, r in enumerate(table.torch)]
    fields += [(("newest", "triton"), table.newest.triton)]
    fields += [(("known", i, "triton"), k.triton + ".0") for i, k in enumerate(table.known)]
    for loc, value in fields:
        try:
            Version(value)
        except InvalidVersion:
            raise RecipeError(TRITONS, f"{value.removesuffix('.0')!r} is not a version",
                              line=src.line_of(loc), field=".".join(map(str, loc))) from None  # fmt: skip
    lines = [r.torch for r in table.torch]
    for i, line in enumerate(lines):
        if line in lines[:i]:
            raise RecipeError(TRITONS, f"torch {line} has a row already", field=f"torch.{i}.torch",
                              line=src.line_of(("torch", i, "torch")))  # fmt: skip
    return table


def _check_layer(
    layer: Layer, root: Path, arches: dict[str, Arch], file: str, src: yamlsrc.Source
) -> None:
    if not (root / layer.dockerfile).is_file():
        raise RecipeError(
            file,
            f"{layer.dockerfile} does not exist",
            line=src.line_of(("dockerfile",)),
            field="dockerfile",
        )
    for i, rel in enumerate(layer.context):
        if not (root / rel).exists():
            raise RecipeError(
                file, f"{rel} does not exist", line=src.line_of(("context", i)), field="context"
            )
    for i, rel in enumerate(layer.patches):
        if not (root / rel).is_dir():
            raise RecipeError(
                file,
                f"patch series {rel} is not a folder",
                line=src.line_of(("patches", i)),
                field="patches",
            )
    _check_selectors(layer.arches, arches, file, src, ("arches",))
    for section in ("args", "hint_args", "pins"):
        _check_templates(getattr(layer, section), file, src, (section,))
        _check_values(getattr(layer, section), file, src, (section,), templated=True)
    if layer.source is not None:
        _check_source(layer.source, file, src)
    _check_aotriton_tag(layer.aotriton, file, src, ("aotriton",))
    for i, rel in enumerate(layer.patches):
        # The planner joins the series into one space-separated PATCH_SERIES build arg.
        _check_format(rel, _PATH, "a plain relative path (letters, digits, . _ / -)", file, src,
                      ("patches", i))  # fmt: skip
    _check_expect(layer.expect, file, src, ("expect",))
    overlap = (
        set(layer.args) & set(layer.hint_args)
        | set(layer.args) & set(layer.pins)
        | set(layer.pins) & set(layer.hint_args)
    )
    if overlap:
        raise RecipeError(
            file, f"{sorted(overlap)} declared twice among args, hint_args and pins", field="args"
        )
    if layer.torch_version_pin is not None:
        holders = [layer.pins] if layer.torch_version_pin in layer.pins else [
            {**v.pins, **dict.fromkeys(v.from_set, "")} for v in layer.variants.values()
        ]  # fmt: skip
        if not holders or any(layer.torch_version_pin not in h for h in holders):
            raise RecipeError(
                file, f"torch_version_pin {layer.torch_version_pin!r} is not a pin of the layer "
                "(or of every variant)", line=src.line_of(("torch_version_pin",)),
                field="torch_version_pin",
            )  # fmt: skip
    for vname, variant in layer.variants.items():
        loc = ("variants", vname)
        # A variant's name is a template value ({variant}) and part of image tags.
        _check_format(vname, _TOKEN, "a variant name (letters, digits, . _ -)", file, src, loc)
        if variant.arches is not None:
            _check_selectors(variant.arches, arches, file, src, (*loc, "arches"))
        for section in ("args", "hint_args", "pins"):
            _check_templates(getattr(variant, section), file, src, (*loc, section))
            _check_values(getattr(variant, section), file, src, (*loc, section), templated=True)
        _check_aotriton_tag(variant.aotriton, file, src, (*loc, "aotriton"))
        _check_expect(variant.expect, file, src, (*loc, "expect"))


def _check_aotriton_tag(tag: str | None, file: str, src: yamlsrc.Source, loc: tuple) -> None:
    if tag is not None and (why := _tag_problem(tag)):
        raise RecipeError(
            file, f"{tag!r} is not an AOTriton release tag: a tag {why}",
            line=src.line_of(loc), field=".".join(map(str, loc)),
        )  # fmt: skip


def _check_source(source: SourcePin, file: str, src: yamlsrc.Source) -> None:
    for field, key in (("repo", "SOURCE_REPO"), ("ref", "SOURCE_REF"), ("tag", "SOURCE_TAG")):
        value = getattr(source, field)
        if value is not None and (why := _check_value(key, value, templated=False)):
            raise RecipeError(
                file, why, line=src.line_of(("source", field)), field=f"source.{field}"
            )


def _check_arches(arches: dict[str, Arch], src: yamlsrc.Source) -> None:
    """Arch names, families and TheRock extras are filled into build args ({arch}, {family},
    {therock_extra}), so they are held to plain tokens."""
    file = "recipes/arches.yaml"
    for name, arch in arches.items():
        loc = ("arches", name)
        _check_format(name, _TOKEN, "an arch name (letters, digits, . _ -)", file, src, loc)
        for field in ("family", "therock_extra"):
            value = getattr(arch, field)
            if value is not None:
                _check_format(value, _TOKEN, f"a valid {field} (letters, digits, . _ -)", file,
                              src, (*loc, field))  # fmt: skip


def _check_stack(
    stack: Stack, layers: dict[str, Layer], arches: dict[str, Arch], src: yamlsrc.Source
) -> None:
    file = "recipes/stacks.yaml"
    base = ("stacks", stack.name)
    _check_selectors(stack.arches, arches, file, src, (*base, "arches"))
    # The base image reaches FROM through the BASE_IMAGE build arg.
    _check_format(stack.base_image, _IMAGE_REF, "an image reference (name[:tag][@sha256:digest])",
                  file, src, (*base, "base_image"))  # fmt: skip
    _check_expect(stack.expect, file, src, (*base, "expect"))
    keys = known_expect_keys()
    for workload, selectors in stack.fused.items():
        loc = (*base, "fused", workload)
        names = sorted(k.split(".")[2] for k in keys or {} if k.endswith(".fused"))
        if keys is not None and f"sdpa.workload.{workload}.fused" not in keys:
            raise RecipeError(file, f"unknown workload {workload!r}", line=src.line_of(loc),
                              field=".".join(loc), choices=names)  # fmt: skip
        _check_selectors(selectors, arches, file, src, loc)
    _check_bench_gates(stack.bench_gates, file, src, (*base, "bench_gates"))
    for i, entry in enumerate(stack.entries()):
        loc = (*base, "layers", i)
        if entry.layer not in layers:
            raise RecipeError(
                file,
                f"unknown layer {entry.layer!r}",
                line=src.line_of(loc),
                field=f"stacks.{stack.name}.layers",
                choices=layers,
            )
        variants = [entry.variant] if isinstance(entry.variant, str) else (entry.variant or [])
        for v in variants:
            if v not in layers[entry.layer].variants:
                raise RecipeError(
                    file,
                    f"layer {entry.layer!r} has no variant {v!r}",
                    line=src.line_of(loc),
                    field=f"stacks.{stack.name}.layers",
                    choices=layers[entry.layer].variants,
                )


def json_schema() -> dict[str, Any]:
    """JSON Schema of the recipe formats, for editors (one definition per file kind)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "attnforge recipes",
        "oneOf": [
            {"$ref": "#/$defs/Layer"},
            {"$ref": "#/$defs/StacksFile"},
            {"$ref": "#/$defs/ArchesFile"},
        ],
        "$defs": {
            "Layer": Layer.model_json_schema(ref_template="#/$defs/Layer/$defs/{model}"),
            "StacksFile": StacksFile.model_json_schema(
                ref_template="#/$defs/StacksFile/$defs/{model}"
            ),
            "ArchesFile": ArchesFile.model_json_schema(
                ref_template="#/$defs/ArchesFile/$defs/{model}"
            ),
        },
    }
