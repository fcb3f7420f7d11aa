"""The planner: recipes + arch + stack + overrides -> an ordered Plan of Steps.

Pure: it reads files under the repo root (Dockerfiles, context files, patches) to hash
them, and nothing else. What exists in an engine comes in as data (`mark_cached`), and so does
what the last build of each layer was made from (`explain`).

Each step's cache key is a value, `BuildInput`, whose canonical JSON is hashed: a user whose
layer rebuilds can be told which of its inputs changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from . import patches as patch_series
from .errors import RecipeError, UserError, unknown
from .multiarch import ArchSet, common_expect, member_smoke
from .recipes import (
    CXX_STD_ORDER,
    TRITONS,
    Arch,
    Layer,
    Recipes,
    Stack,
    StackEntry,
    check_pin,
    selectors_match,
)
from .templates import Gated, render, template_vars

# Bumping this rebuilds everything: for changes to how images are made that the hashed
# inputs cannot see (a new label, a changed staging layout).
EPOCH = 1
PATCH_TOOL = "attnforge/patches.py"  # copied into contexts that apply patch series
IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache"}


@dataclass(frozen=True)
class ContextFile:
    path: str  # repo-relative, POSIX
    sha256: str


@dataclass(frozen=True)
class BuildInput:
    """Everything a layer's image is made from. Its canonical JSON *is* the cache key: change any
    field and the layer (and every layer above it) rebuilds; leave them all alone and it does not.
    Hint args (MAX_JOBS, index URLs) and the offered wheels are left out: they do not change what
    is installed, because every version is pinned."""

    epoch: int
    layer: str
    variant: str | None
    arch: str
    dockerfile: str  # sha256 of the Dockerfile's bytes
    args: dict[str, str]  # resolved build args, pins included
    context: dict[str, str]  # repo path -> sha256 of every file sent as build context
    wheelhouse: bool  # whether local wheels are offered to pip
    parent: str | dict[str, Any]  # the parent's key, or {image, digest} for the first layer

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "layer": self.layer,
            "variant": self.variant,
            "arch": self.arch,
            "dockerfile": self.dockerfile,
            "args": dict(self.args),
            "context": dict(self.context),
            "wheelhouse": self.wheelhouse,
            "parent": self.parent,
        }

    @property
    def key(self) -> str:
        return content_hash(self.to_json())


@dataclass(frozen=True)
class Step:
    """One layer of one image chain: everything needed to build it, and why (not)."""

    layer: str
    variant: str | None
    arch: str
    dockerfile: str
    parent: str | None  # layer name of the parent step; None for the root
    base_ref: str  # what FROM ${BASE_IMAGE} resolves to
    args: dict[str, str]  # hashed build args (pins included)
    hint_args: dict[str, str]  # passed to the build, left out of the hash
    context: tuple[ContextFile, ...]
    patches: tuple[str, ...]
    wheelhouse: bool
    manifest: dict[str, Any]  # cumulative versions manifest written into the image
    smoke: tuple[dict[str, Any], ...]
    floating: tuple[str, ...]  # pins that make the hash lie
    hash: str
    hash_tag: str
    moving_tags: tuple[str, ...]
    status: str  # build | cached | pull | unsupported | skipped | blocked
    reason: str = ""
    lineage: tuple[tuple[str, str], ...] = ()  # (layer, hash) from the root to this step
    pins: dict[str, str] = field(default_factory=dict)  # the pinned inputs (a subset of args)
    input: BuildInput | None = None  # what `hash` is the key of (None for a step that is not built)
    pull_ref: str = ""  # status pull: where the registry cache holds this very image
    changes: tuple[str, ...] = ()  # why it rebuilds: what changed since its last build

    @property
    def short_hash(self) -> str:
        return self.hash[:12]

    @property
    def runs(self) -> bool:
        return self.status in ("build", "cached", "pull")


@dataclass(frozen=True)
class Plan:
    arch: str
    stack: str
    steps: tuple[Step, ...]
    expect: dict[str, Any]
    final_tag: str | None

    @property
    def chain(self) -> list[Step]:
        """The steps that make images, in build order."""
        return [s for s in self.steps if s.runs]

    @property
    def blocked_by(self) -> list[Step]:
        return [s for s in self.steps if s.status == "unsupported"]

    def step(self, layer: str) -> Step:
        for s in self.steps:
            if s.layer == layer:
                return s
        raise unknown(f"layer of stack {self.stack}", layer, [s.layer for s in self.steps])

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "stack": self.stack,
            "final_tag": self.final_tag,
            "expect": self.expect,
            "steps": [
                {
                    "layer": s.layer,
                    "variant": s.variant,
                    "status": s.status,
                    "reason": s.reason,
                    "hash": s.hash,
                    "tag": s.hash_tag,
                    "pull_ref": s.pull_ref or None,
                    "moving_tags": list(s.moving_tags),
                    "parent": s.parent,
                    "base_ref": s.base_ref,
                    "dockerfile": s.dockerfile,
                    "args": s.args,
                    "hint_args": s.hint_args,
                    "context": [c.path for c in s.context],
                    "patches": list(s.patches),
                    "floating": list(s.floating),
                    "input": s.input.to_json() if s.input else None,
                    "changes": list(s.changes),
                }
                for s in self.steps
            ],
        }


@dataclass(frozen=True)
class Options:
    """Planning inputs that do not come from the recipes."""

    base_image: str | None = None  # overrides the stack's base image
    base_digest: str | None = None  # the engine's id of the base image, when known
    jobs: int = 2
    namespace: str = "attnforge"
    only: str | None = None
    overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    rehearsal: str | None = None  # a rehearsal mirror's mark: hashed into every layer's args


# ---------------------------------------------------------------------------- overrides


def parse_overrides(items: Iterable[str], recipes: Recipes) -> dict[str, dict[str, str]]:
    """`--set layer.KEY=value` -> {layer: {KEY: value}}; KEY is an arg, hint arg, pin or 'variant'."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        target, eq, value = item.partition("=")
        layer, dot, key = target.partition(".")
        if not eq or not dot or not layer or not key:
            raise UserError(
                f"bad --set {item!r}: expected LAYER.KEY=VALUE, e.g. pytorch-wheels.TORCH_VERSION=2.13.0"
            )
        if layer not in recipes.layers:
            raise unknown("layer", layer, recipes.layers)
        spec = recipes.layers[layer]
        keys = {"variant", *spec.args, *spec.hint_args, *spec.pins}
        if spec.source:  # a source layer's commit (and repository) can be --set too: invoke bisect
            keys |= {"SOURCE_REPO", "SOURCE_REF"}
        for v in spec.variants.values():
            keys |= set(v.args) | set(v.pins) | set(v.hint_args) | set(v.from_set)
        if key not in keys:
            raise UserError(
                f"bad --set {item!r}: layer {layer!r} has no setting {key!r}; "
                f"valid: {', '.join(sorted(keys))}"
            )
        if key == "variant" and value not in spec.variants:
            raise unknown(f"variant of {layer}", value, spec.variants)
        # an empty value too: `TRITON_VERSION=` is a malformed pin, not a floating one
        why = check_pin(key, value) if key != "variant" else None
        if why:
            raise UserError(f"bad --set {item!r}: {why}")
        out.setdefault(layer, {})[key] = value
    return out


# ---------------------------------------------------------------------------- ordering


def order_layers(stack: Stack, layers: Mapping[str, Layer]) -> list[StackEntry]:
    """Topologically order a stack's entries by needs/provides, stable in stack order."""
    entries = stack.entries()
    index = {e.layer: i for i, e in enumerate(entries)}
    providers: dict[str, list[str]] = {}
    for e in entries:
        for cap in (e.layer, *layers[e.layer].provides):
            providers.setdefault(cap, []).append(e.layer)
    deps: dict[str, list[str]] = {}
    for e in entries:
        need_layers: list[str] = []
        for need in layers[e.layer].needs:
            if need not in providers:
                raise UserError(
                    f"layer {e.layer!r} needs {need!r}, which no layer of stack {stack.name!r} provides"
                )
            need_layers += [p for p in providers[need] if p != e.layer]
        deps[e.layer] = sorted(set(need_layers), key=index.__getitem__)
    return [
        next(e for e in entries if e.layer == name)
        for name in topo_sort(deps, key=index.__getitem__)
    ]


def topo_sort(deps: Mapping[str, list[str]], key=None) -> list[str]:
    """Dependencies before dependants; among nodes that are ready, the lowest `key` goes first
    (Kahn's algorithm, so the listing order of a stack decides ties). A cycle is named."""
    key = key or (lambda n: n)
    nodes = sorted(set(deps) | {d for ds in deps.values() for d in ds}, key=key)
    waiting = {n: set(deps.get(n, [])) for n in nodes}
    order: list[str] = []
    while waiting:
        ready = [n for n in nodes if n in waiting and not waiting[n]]
        if not ready:
            raise UserError(f"dependency cycle: {' -> '.join(_find_cycle(waiting, key))}")
        node = ready[0]
        order.append(node)
        del waiting[node]
        for rest in waiting.values():
            rest.discard(node)
    return order


def _find_cycle(waiting: Mapping[str, set[str]], key) -> list[str]:
    node = min(waiting, key=key)
    path: list[str] = []
    while node not in path:
        path.append(node)
        node = min(waiting[node], key=key)
    return [*path[path.index(node) :], node]


# ---------------------------------------------------------------------------- pins


_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^(sha256:)?[0-9a-f]{64}$")


def classify_pin(value: str) -> str | None:
    """None when value pins its input exactly, else why it floats."""
    if _HEX40.match(value) or _HEX64.match(value) or "@sha256:" in value:
        return None
    if not value:
        return "empty"
    if value in {"latest", "main", "master", "nightly", "develop", "HEAD"}:
        return f"{value!r} moves"
    try:
        Version(value)
    except InvalidVersion:
        return f"{value!r} is neither a commit, a sha256 nor an exact version"
    return None


# ---------------------------------------------------------------------------- stacks and arches


def stack_fits(stack: Stack, arch: Arch) -> bool:
    """Whether a stack is made for an arch (its `arches:` selectors)."""
    return selectors_match(stack.arches, arch)


def stacks_for(recipes: Recipes, arch: str) -> list[str]:
    """The stacks that build for an arch, in recipes order."""
    spec = recipes.arches.get(arch)
    return [n for n, s in recipes.stacks.items() if spec is not None and stack_fits(s, spec)]


def default_stack(recipes: Recipes, arch: str) -> str:
    """'default' where it fits the arch, else the arch's first stack."""
    fits = stacks_for(recipes, arch)
    return "default" if "default" in fits or not fits else fits[0]


# ---------------------------------------------------------------------------- resolve, in steps


def choose_variant(
    layer: Layer, entry: StackEntry, arch: Arch, chosen: str | None,
    refuse: Callable[[str | None], str | None] | None = None,
    passed_over: list[str] | None = None,
) -> str | None:  # fmt: skip
    """Step 1: the variant to use (--set wins, then the stack's preference list, then the layer's
    order), or raise Gated with the reason from the data. `refuse(variant)` may turn a variant
    down for what lies below it (a torch whose C++ standard it cannot build against); the
    variants passed over before the chosen one are appended to `passed_over` with why."""
    if not selectors_match(layer.arches, arch):
        raise Gated(layer.gated_because or f"{layer.name} supports {', '.join(layer.arches)}")
    if not layer.variants:
        if refuse and (why := refuse(None)):
            raise Gated(why)
        return None
    if chosen:
        candidates = [chosen]
    elif isinstance(entry.variant, str):
        candidates = [entry.variant]
    else:
        candidates = entry.variant or list(layer.variants)
    reasons = []
    for name in candidates:
        v = layer.variants[name]
        if v.arches is None or selectors_match(v.arches, arch):
            if refuse and (why := refuse(name)):
                reasons.append(f"{name}: {why}")
                continue
            if passed_over is not None:
                passed_over.extend(reasons)
            return name
        reasons.append(f"{name}: {v.gated_because or 'supports ' + ', '.join(v.arches)}")
    raise Gated("; ".join(reasons))


# ---------------------------------------------------------------------------- C++ standard


@dataclass(frozen=True)
class TorchCxxNeed:
    """What the torch of a plan asks of C++ compiled against its headers."""

    torch: str  # the torch version (a pin)
    std: str | None  # c++17 / c++20; None when no rule of recipes/torch.yaml covers it
    source: str  # its short citation


def torch_cxx_need(recipes: Recipes, layer: Layer, pins: Mapping[str, Any]) -> TorchCxxNeed | None:
    """The C++ standard that the torch a layer provides demands (recipes/torch.yaml), or None
    when the layer provides no torch."""
    if "torch" not in layer.provides or not layer.torch_version_pin:
        return None
    version = str(pins.get(layer.torch_version_pin, ""))
    try:
        release = Version(Version(version).base_version)  # 2.15.0a0+rocm10.2.0 -> 2.15.0
    except InvalidVersion:
        return TorchCxxNeed(version, None, f"{version!r} is not a version")
    for rule in recipes.torch_cxx:
        if release in SpecifierSet(rule.torch):
            return TorchCxxNeed(version, rule.std, f"{rule.cite}; recipes/torch.yaml")
    return TorchCxxNeed(version, None, "no rule of recipes/torch.yaml covers it")


def triton_row_missing(recipes: Recipes, layer: Layer, pins: Mapping[str, Any]) -> str | None:
    """Why a layer's torch cannot be planned: it brings the Triton its release line requires, and
    that line has no row in recipes/tritons.yaml, so which Triton the bundled kernels meet there is
    unknown. None where it has one, where the layer provides no torch or not its Triton (a stack
    that pins Triton itself: cpu), or where the torch comes from --set (a nightly: the newest)."""
    provides = set(layer.provides)
    if recipes.tritons is None or not {"torch", "triton"} <= provides:
        return None
    if not layer.torch_version_pin:
        return None
    version = str(pins.get(layer.torch_version_pin) or "")
    try:
        line = ".".join(map(str, Version(version).release[:2]))
    except InvalidVersion:
        return None  # no pin (a nightly from --set) or one check_pin refuses
    if recipes.tritons.row_for(line) is not None:
        return None
    rows = ", ".join(r.torch for r in recipes.tritons.torch)
    return (
        f"torch {version} is of the {line} line, which has no row in {TRITONS} (torch: {rows}): "
        f"add the Triton torch {line} requires there"
    )


def cxx_conflict(layer: Layer, variant: str | None, need: TorchCxxNeed | None) -> str | None:
    """Why a layer cannot compile against the torch below it (its C++ standard is older than the
    one torch's headers require), or None."""
    decl = layer.torch_cxx_for(variant)
    if decl is None or need is None or decl.std in ("torch", "none"):
        return None
    name = f"{layer.name}:{variant}" if variant else layer.name
    if need.std is None:
        return (f"{name} compiles against torch's headers as {decl.std}, and the C++ standard "
                f"torch {need.torch} requires is unknown: {need.source}")  # fmt: skip
    if CXX_STD_ORDER.index(decl.std) >= CXX_STD_ORDER.index(need.std):
        return None
    return (
        f"{name} compiles against torch's headers as {decl.std} ({decl.source}), but torch "
        f"{need.torch} requires {need.std} ({need.source}), so its build would stop at torch's "
        f"#error; use a torch older than that rule or a patch series that builds it as {need.std}"
    )


@dataclass(frozen=True)
class _Values:
    """A layer's recipe values rendered for one arch and variant, with --set applied."""

    args: dict[str, Any]
    pins: dict[str, Any]
    hints: dict[str, Any]
    expect: dict[str, Any]
    tvars: dict[str, Any]


def render_values(
    layer: Layer, variant: str | None, arch: Arch, where: str, jobs: int, sets: Mapping[str, str]
) -> _Values:
    """Step 2: fill the templates of args, pins, hint args and expectations; apply --set."""
    tvars = template_vars(arch, variant, layer, jobs)
    vspec = layer.variants.get(variant) if variant else None
    args = render({**layer.args, **(vspec.args if vspec else {})}, tvars, f"{where}: args")
    pins = render({**layer.pins, **(vspec.pins if vspec else {})}, tvars, f"{where}: pins")
    hints = render(
        {**layer.hint_args, **(vspec.hint_args if vspec else {})}, tvars, f"{where}: hint_args"
    )
    expect = render({**layer.expect, **(vspec.expect if vspec else {})}, tvars, f"{where}: expect")
    missing = [k for k in (vspec.from_set if vspec else []) if k not in sets]
    if missing:
        given = " ".join(f"--set {layer.name}.{k}=..." for k in missing)
        raise Gated(f"variant {variant} takes {', '.join(missing)} from the command line: {given}")
    from_set = set(vspec.from_set) if vspec else set()
    if layer.source:
        pins = {"SOURCE_REPO": layer.source.repo, "SOURCE_REF": layer.source.ref, **pins}
    for key, value in sets.items():  # --set wins over recipes
        target = hints if key in hints else pins if key in pins or key in from_set else args
        target[key] = value
    return _Values(args, pins, hints, expect, tvars)


def check_pins(pins: Mapping[str, Any]) -> list[str]:
    """Step 3: the pins that make the hash lie (a branch, a moving tag), each with why."""
    floating = []
    for key, value in pins.items():
        if key == "SOURCE_REPO":
            continue
        why = classify_pin(str(value))
        if key == "SOURCE_REF" and not _HEX40.match(str(value)):
            why = why or f"{value!r} is not a commit"
        if why:
            floating.append(f"{key}: {why}")
    return floating


def hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def context_files(root: Path, rels: Iterable[str]) -> tuple[ContextFile, ...]:
    """Every file under the given repo paths, sorted, with its sha256."""
    files: dict[str, ContextFile] = {}
    for rel in rels:
        path = root / rel
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for p in found:
            rp = p.relative_to(root)
            if IGNORED_PARTS & set(rp.parts) or p.suffix == ".pyc":
                continue
            files[rp.as_posix()] = ContextFile(rp.as_posix(), hash_file(p))
    return tuple(files[k] for k in sorted(files))


def check_patch_series(root: Path, layer: Layer, where: str) -> None:
    """Every series the layer applies must load (series.json, patch names, diffs) here, in the
    plan, rather than fail inside the image build."""
    components = set()
    for rel in layer.patches:
        try:
            components.add(patch_series.load_series(root / rel).component)
        except patch_series.PatchError as exc:
            raise RecipeError(where, f"patch series {rel}: {exc}", field="patches") from None
    if len(components) > 1:  # the Dockerfile applies them all to one source tree
        raise RecipeError(
            where, f"the patch series are for different components: {sorted(components)}",
            field="patches",
        )  # fmt: skip


def layer_context(root: Path, layer: Layer, where: str) -> tuple[ContextFile, ...]:
    """Step 4: the files sent to the build as context (and hashed): the layer's own context, its
    patch series (checked first) and the tool that applies them."""
    check_patch_series(root, layer, where)
    files = [*layer.context, *layer.patches] + ([PATCH_TOOL] if layer.patches else [])
    return context_files(root, files)


def content_hash(inputs: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of a step's inputs."""
    blob = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _target(recipes: Recipes, arch_name: str, stack_name: str) -> tuple[Arch, Stack]:
    if arch_name not in recipes.arches:
        raise unknown("arch", arch_name, recipes.arches)
    if stack_name not in recipes.stacks:
        raise unknown("stack", stack_name, recipes.stacks)
    arch, stack = recipes.arches[arch_name], recipes.stacks[stack_name]
    if not stack_fits(stack, arch):
        raise UserError(
            f"stack {stack_name!r} is not for arch {arch_name!r} (it is for {', '.join(stack.arches)}); "
            f"stacks for {arch_name}: {', '.join(stacks_for(recipes, arch_name)) or 'none'}"
        )
    return arch, stack


def resolve(
    recipes: Recipes, arch_name: str, stack_name: str, options: Options = Options()
) -> Plan:
    """Resolve a stack for an arch into a Plan. Raises UserError for bad input."""
    arch, stack = _target(recipes, arch_name, stack_name)
    entries = order_layers(stack, recipes.layers)
    names = [e.layer for e in entries]
    if options.only is not None and options.only not in names:
        raise unknown(f"layer of stack {stack_name}", options.only, names)

    arch_vars = {"arch": arch.name, "family": arch.family, "vendor": arch.vendor}
    expect = render(stack.expect, arch_vars, "recipes/stacks.yaml: expect", strict=False)
    for workload, selectors in stack.fused.items():
        if selectors_match(selectors, arch):
            expect[f"sdpa.workload.{workload}.fused"] = True
    base_ref = options.base_image or stack.base_image
    steps: list[Step] = []
    parent: Step | None = None
    blocked_by: str | None = None
    torch_need: TorchCxxNeed | None = None
    for entry in entries:
        layer = recipes.layers[entry.layer]
        where = recipes.layer_files[layer.name]
        sets = dict(options.overrides.get(layer.name, {}))
        variant = None
        passed_over: list[str] = []
        try:
            variant = choose_variant(
                layer, entry, arch, sets.pop("variant", None),
                refuse=lambda v, layer=layer, need=torch_need: cxx_conflict(layer, v, need),
                passed_over=passed_over,
            )  # fmt: skip
            values = render_values(layer, variant, arch, where, options.jobs, sets)
            if why := triton_row_missing(recipes, layer, values.pins):
                raise Gated(why)
        except Gated as gated:
            status = "skipped" if entry.optional else "unsupported"
            blocked_by = blocked_by or (layer.name if status == "unsupported" else None)
            steps.append(_placeholder(layer, variant, arch.name, status, str(gated)))
            continue
        if blocked_by:
            reason = f"needs {blocked_by}, which is unsupported on {arch.name}"
            steps.append(_placeholder(layer, variant, arch.name, "blocked", reason))
            continue
        step = _make_step(
            recipes.root, layer, variant, arch.name, values, parent, base_ref, options, where
        )
        if isinstance(arch, ArchSet):  # arch-naming smoke checks run once per member
            smoke = member_smoke(layer, variant, arch, step.args, options.jobs, where)
            step = replace(step, smoke=smoke)
        if passed_over:  # a fallback variant: say why the preferred one was not built
            step = replace(step, reason="not " + "; not ".join(passed_over))
        torch_need = torch_cxx_need(recipes, layer, step.pins) or torch_need
        steps.append(step)
        expect.update(values.expect)
        parent = step
        if options.only == layer.name:
            break

    chain = [s for s in steps if s.runs]
    final_tag = None
    if chain and not blocked_by and options.only is None:
        last = chain[-1]
        final_tag = f"{options.namespace}/{stack_name}:{arch.name}"
        steps[steps.index(last)] = replace(last, moving_tags=(*last.moving_tags, final_tag))
    plan = Plan(arch.name, stack_name, tuple(steps), expect, final_tag)
    if isinstance(arch, ArchSet):  # each member has its own; the plan shows what they share
        plan = replace(plan, expect=common_expect(recipes, plan, options.jobs))
    return plan


def _make_step(
    root: Path,
    layer: Layer,
    variant: str | None,
    arch: str,
    values: _Values,
    parent: Step | None,
    base_ref: str,
    options: Options,
    where: str,
) -> Step:
    """Step 5: the cache key and everything the executor needs for one layer."""
    args, pins = dict(values.args), values.pins
    floating = check_pins(pins)
    if layer.patches:
        args["PATCH_SERIES"] = " ".join(layer.patches)
    if options.rehearsal:  # stand-in wheels: never the cache key of a real build
        args["ATTNFORGE_REHEARSAL"] = options.rehearsal
    ctx = layer_context(root, layer, where)
    if parent is None:
        parent_key: str | dict[str, Any] = {"image": base_ref, "digest": options.base_digest}
        if not options.base_digest and "@sha256:" not in base_ref:
            floating.append(f"BASE_IMAGE: {base_ref!r} is a moving tag and its digest is unknown")
        manifest: dict[str, Any] = {"base_image": {"ref": base_ref, "digest": options.base_digest}}
        from_ref = base_ref
    else:
        parent_key, manifest, from_ref = parent.hash, dict(parent.manifest), parent.hash_tag
    manifest[layer.name] = {"variant": variant, **pins} if variant else dict(pins)
    inputs = BuildInput(
        epoch=EPOCH, layer=layer.name, variant=variant, arch=arch,
        dockerfile=hash_file(root / layer.dockerfile), args={**args, **pins},
        context={c.path: c.sha256 for c in ctx}, wheelhouse=layer.wheelhouse, parent=parent_key,
    )  # fmt: skip
    key = inputs.key
    tag_base = f"{options.namespace}/{layer.name}"
    smoke_vars = {**values.tvars, **args, **pins}
    return Step(
        layer=layer.name, variant=variant, arch=arch, dockerfile=layer.dockerfile,
        parent=parent.layer if parent else None, base_ref=from_ref, args={**args, **pins},
        hint_args=values.hints, context=ctx, patches=tuple(layer.patches),
        wheelhouse=layer.wheelhouse, manifest=manifest,
        smoke=tuple(
            render(c.model_dump(exclude_none=True), smoke_vars, where, strict=False)
            for c in layer.smoke
        ),
        floating=tuple(floating), hash=key, hash_tag=f"{tag_base}:{arch}-{key[:12]}",
        moving_tags=(f"{tag_base}:{arch}",), status="build",
        lineage=(*(parent.lineage if parent else ()), (layer.name, key)),
        pins={k: str(v) for k, v in pins.items()}, input=inputs,
    )  # fmt: skip


def _placeholder(layer: Layer, variant: str | None, arch: str, status: str, reason: str) -> Step:
    return Step(
        layer=layer.name, variant=variant, arch=arch, dockerfile=layer.dockerfile, parent=None,
        base_ref="", args={}, hint_args={}, context=(), patches=(), wheelhouse=False, manifest={},
        smoke=(), floating=(), hash="", hash_tag="", moving_tags=(), status=status, reason=reason,
    )  # fmt: skip


def mark_cached(plan: Plan, existing: Iterable[str]) -> Plan:
    """Steps whose hash tag already exists in the engine become 'cached'."""
    have = set(existing)
    steps = tuple(
        replace(s, status="cached", reason="image with this hash exists")
        if s.status == "build" and s.hash_tag in have
        else s
        for s in plan.steps
    )
    return replace(plan, steps=steps)


def cache_ref(step: Step, cache_ns: str) -> str:
    """The step's content tag under a registry namespace: the same key names the same image."""
    return f"{cache_ns.rstrip('/')}/{step.layer}:{step.arch}-{step.short_hash}"


def mark_pullable(plan: Plan, cache_ns: str, in_registry: Iterable[str]) -> Plan:
    """Steps that would build but whose content tag the registry cache holds become 'pull'."""
    have = set(in_registry)
    steps = tuple(
        replace(
            s,
            status="pull",
            pull_ref=cache_ref(s, cache_ns),
            reason=f"{cache_ref(s, cache_ns)} is in the registry cache",
        )  # fmt: skip
        if s.status == "build" and cache_ref(s, cache_ns) in have
        else s
        for s in plan.steps
    )
    return replace(plan, steps=steps)


# ---------------------------------------------------------------------------- why it rebuilds

UNCHANGED = "inputs unchanged since its last build; its image is not in the engine"


def input_changes(
    old: Mapping[str, Any] | None, new: BuildInput, dockerfile: str, parent_layer: str | None
) -> list[str]:
    """What changed between the inputs of a layer's last build and now, one sentence each; empty
    when no earlier build of the layer is recorded."""
    if old is None:
        return []
    now = new.to_json()
    if dict(old) == now:
        return [UNCHANGED]
    changes: list[str] = []
    if old.get("epoch") != now["epoch"]:
        changes.append(f"attnforge's build epoch {old.get('epoch')} -> {now['epoch']}")
    if old.get("variant") != now["variant"]:
        changes.append(f"variant {old.get('variant')} -> {now['variant']}")
    if old.get("dockerfile") != now["dockerfile"]:
        changes.append(f"{dockerfile} changed")
    before, after = old.get("args", {}), now["args"]
    for key in sorted(set(before) | set(after)):
        if key not in after:
            changes.append(f"arg {key} removed (was {before[key]})")
        elif key not in before:
            changes.append(f"arg {key} added: {after[key]}")
        elif before[key] != after[key]:
            changes.append(f"arg {key} {before[key]} -> {after[key]}")
    files_before, files_after = old.get("context", {}), now["context"]
    for path in sorted(set(files_before) | set(files_after)):
        if path not in files_after:
            changes.append(f"{path} removed from the context")
        elif path not in files_before:
            changes.append(f"{path} added to the context")
        elif files_before[path] != files_after[path]:
            changes.append(f"{path} changed")
    if old.get("wheelhouse") != now["wheelhouse"]:
        changes.append("local wheels " + ("offered" if now["wheelhouse"] else "no longer offered"))
    if old.get("parent") != now["parent"]:
        if isinstance(now["parent"], dict):
            was = old.get("parent") if isinstance(old.get("parent"), dict) else {}
            changes.append(
                f"base image {_image(was)} -> {_image(now['parent'])}"
                if was
                else f"base image is now {_image(now['parent'])}"
            )
        else:
            changes.append(f"parent {parent_layer} rebuilt")
    return changes or [f"key {content_hash(dict(old))[:12]} -> {new.key[:12]}"]


def _image(ref: Mapping[str, Any]) -> str:
    digest = ref.get("digest") or "digest unknown"
    return f"{ref.get('image')} ({digest[:19]})"


def explain(plan: Plan, last_inputs: Mapping[str, Mapping[str, Any]]) -> Plan:
    """Attach to each step that will build what changed since the last build of its layer
    (`last_inputs`: layer -> the BuildInput JSON it was last built from)."""
    steps = tuple(
        replace(
            s,
            changes=tuple(input_changes(last_inputs.get(s.layer), s.input, s.dockerfile, s.parent)),
        )
        if s.status == "build" and s.input is not None
        else s
        for s in plan.steps
    )
    return replace(plan, steps=steps)


# ---------------------------------------------------------------------------- other stacks


@dataclass(frozen=True)
class StackOption:
    """One stack as seen from an arch: whether it builds there, its attention layers, why not."""

    stack: str
    builds: bool
    attention: tuple[str, ...]  # layer[:variant] of each step that provides flash_attn & co.
    reason: str = ""


ATTENTION_CAPS = {"flash_attn", "rocwmma_fattn"}


def _with_alternatives(
    layer: Layer, chosen: str | None, arch: Arch, builds: Callable[[str], bool] = lambda v: True
) -> str:
    """'layer:variant', plus the other variants the arch could have (--set LAYER.variant=...)
    that `builds` in the plan (a C++17 variant over a C++20 torch does not)."""
    if chosen is None:
        return layer.name
    others = [
        n for n, v in layer.variants.items()
        if n != chosen and (v.arches is None or selectors_match(v.arches, arch))
        and builds(n)
    ]  # fmt: skip
    return f"{layer.name}:{chosen}" + (f" (or {', '.join(others)})" if others else "")


def stack_options(recipes: Recipes, arch: str) -> list[StackOption]:
    """Every stack of the recipes for an arch: which build there and, for those that do not, the
    first reason (from the data), so a user sees every attention line the arch can have."""
    found = []
    for name, stack in recipes.stacks.items():
        if arch in recipes.arches and not stack_fits(stack, recipes.arches[arch]):
            found.append(StackOption(name, False, (), f"for {', '.join(stack.arches)}"))
            continue
        plan = resolve(recipes, arch, name)

        def builds(layer: str, variant: str, name: str = name) -> bool:
            sets = Options(overrides={layer: {"variant": variant}})
            return resolve(recipes, arch, name, sets).step(layer).status == "build"

        attention = tuple(
            _with_alternatives(
                recipes.layers[s.layer], s.variant, recipes.arches[arch],
                lambda v, layer=s.layer: builds(layer, v),
            )
            for s in plan.steps
            if ATTENTION_CAPS & set(recipes.layers[s.layer].provides)
        )  # fmt: skip
        blocked = plan.blocked_by
        reason = f"{blocked[0].layer}: {blocked[0].reason}" if blocked else ""
        found.append(StackOption(name, not blocked, attention, reason))
    return found


def aotriton_facts(recipes: Recipes, plan: Plan) -> dict[str, Any] | None:
    """What the recipes say of the AOTriton in this plan's torch, for the report: its version,
    whether it calls the arch experimental, and whether the image sets the knob for it."""
    for step in plan.chain:
        version = recipes.layers[step.layer].aotriton_for(step.variant)
        if version and "torch" in recipes.layers[step.layer].provides:
            status = recipes.arches[plan.arch].aotriton_status(version)
            return {
                "version": version,
                "experimental": status == "experimental",
                "image_sets_knob": step.args.get("AOTRITON_EXPERIMENTAL") == "1",
            }
    return None
