"""invoke build / schema / arches: argument handling and printing only; the work is in attnforge."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import hostinfo
from ..console import LayerProgress, err, out, plan_table, stacks_table, summary_table, user_errors
from ..errors import UserError
from ..files import write_aside
from ..workspace import Workspace
from . import (
    ARCH,
    CA_CERT,
    ENGINE,
    HOST_CA_BUNDLE,
    IN_DIR,
    NAMESPACE,
    OUT_FILE,
    STACK,
    choose_target,
    command,
    number,
    text,
)
from .mirror import MirrorBuild, mirror_lines, with_mirror

if TYPE_CHECKING:  # the library is imported where a task uses it (attnforge/cli/__init__.py)
    from ..build import BuildState, Invocation
    from ..engine import Engine
    from ..plan import Plan
    from ..recipes import Recipes

# The host's CA bundle (Debian/Ubuntu): handed to builds as a BuildKit secret by default, so pip
# inside a build trusts what this host trusts (a proxy's CA included); never stored in an image.


BUILD_OPTIONS = {
    "arch": ARCH, "stack": STACK, "only": text("LAYER"), "set_": text("LAYER.KEY=VALUE", repeatable=True),
    "base_image": text("IMAGE"), "wheelhouse": IN_DIR, "ca_cert": CA_CERT, "engine": ENGINE,
    "jobs": number("N"), "namespace": NAMESPACE, "cache_from": NAMESPACE,
}  # fmt: skip


@command(
    options={
        **BUILD_OPTIONS,
        "explain": text("LAYER"),
        "builder": text("BUILDER"),
        "mirror": IN_DIR,
    },  # fmt: skip
    writes=("build",),
    goes_with={"json": "dry_run", "explain": "dry_run"},
    help={
        "arch": "GPU arch to build for (default: the host's AMD GPU, else cpu); see `invoke arches`",
        "stack": "stack from recipes/stacks.yaml (default: 'default', or the arch's only stack)",
        "only": "build only this layer and the layers it sits on",
        "dry_run": "print the plan (layer, tag, status, why it rebuilds) and build nothing",
        "json": "with --dry-run: print the plan as JSON (each step's inputs and engine command)",
        "explain": "with --dry-run: everything about one layer: inputs, what changed, command",
        "continue_": "resume the last build where it failed or was interrupted, with its options",
        "set_": "override a recipe value: LAYER.KEY=VALUE (repeatable)",
        "base_image": "base image for the first layer (default: the stack's, or the local one "
        "tools/setup.sh made when the stack's is not here)",
        "wheelhouse": "folder of local wheels offered to pip inside builds (default: "
        "build/wheelhouse when it holds wheels)",
        "ca_cert": f"CA bundle for pip inside builds, passed as a BuildKit secret, never stored in "
        f"an image (default: {HOST_CA_BUNDLE} when it exists; 'none' for no bundle)",
        "engine": "container engine: docker (default) or podman",
        "jobs": "MAX_JOBS and build parallelism (default: from host memory, 4 GiB a job)",
        "namespace": "image name prefix, e.g. registry.example.com/team (default: attnforge)",
        "push": "push every built or cached tag to the namespace's registry afterwards",
        "cache_from": "registry namespace to pull layers from when it holds their content tag "
        "(e.g. registry.example.com/team; default: attnforge.cache_from in invoke.yaml)",
        "require_cache": "with --cache-from: fail when the registry does not answer, instead of "
        "building",
        "builder": "build on this BuildKit builder: a `docker buildx` builder name, or a buildkitd "
        'address such as tcp://host:1234 (for buildctl; e.g. "$BUILDKIT_HOST"); results come back '
        "to the engine for the smoke checks and tags (with --push: through the registry)",
        "mirror": "build from this mirror folder (`invoke mirror`) and from nothing else: it is "
        "checked first, served on 127.0.0.1, and every other URL is refused",
        "debug": "show tracebacks",
    },
)
@user_errors(resume="`invoke build --continue` resumes where this stopped")
def build(
    c, arch=None, stack=None, only=None, dry_run=False, json=False, explain=None,
    continue_=False, set_=None, base_image=None, wheelhouse=None, ca_cert=None, engine="docker",
    jobs=None, namespace="attnforge", push=False, cache_from=None, require_cache=False,
    builder=None, mirror=None, debug=False,
):  # fmt: skip
    """Build a stack's images layer by layer, skipping every layer whose inputs did not change."""
    from ..build import BuildState
    from ..recipes import load_recipes

    started = time.monotonic()
    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    if continue_:
        state = BuildState.load(ws)
        where = f", which stopped at layer {state.stopped_at}" if state.stopped_at else ""
        out.print(f"continuing the last build: stack {state.invocation.stack} for "
                  f"{state.invocation.arch}{where}")  # fmt: skip
        state.invocation.push = state.invocation.push or push
    else:
        inv = build_invocation(
            recipes, ws, arch, stack, only, set_, base_image, wheelhouse, ca_cert,
            engine, jobs, namespace,
        )  # fmt: skip
        # invoke.yaml (next to tasks.py, or ~/.invoke.yaml) may name the team's cache
        inv.cache_from = cache_from or (c.config.get("attnforge") or {}).get("cache_from")
        inv.require_cache = require_cache
        if require_cache and not inv.cache_from:
            raise UserError("--require-cache goes with --cache-from (or attnforge.cache_from)")
        inv.builder, inv.push = builder or None, push
        inv = with_mirror(inv, mirror, given_wheelhouse=wheelhouse is not None)
        state = BuildState(inv)
    if state.invocation.builder and state.invocation.engine != "docker":
        raise UserError(
            "--builder goes with --engine docker: podman has no BuildKit builders",
            hint="leave --builder out to build with podman itself",
        )
    if dry_run:
        _dry_run(state.invocation, recipes, ws, as_json=json, layer=explain)
        return
    plan, outcomes = _build(state, recipes, ws, given_base=base_image is not None or continue_,
                                 resumed=continue_)  # fmt: skip
    out.print(summary_table(outcomes, time.monotonic() - started))
    if plan.final_tag:
        out.print(
            f"final image: [bold]{plan.final_tag}[/]  (validate it: invoke validate --arch {plan.arch} --stack {plan.stack})"
        )


def _engine_for(inv: Invocation) -> Engine:
    """The engine a build runs on, its --builder checked (and a note where it needs --push)."""
    from ..engine import connect

    eng = connect(inv.engine)
    if inv.builder:
        eng.check_builder(inv.builder)
        if not inv.push:
            out.print(
                f"[dim]builder {inv.builder}: each layer starts from its parent's image, which a "
                "remote builder can only pull from a registry: add --push with --namespace "
                "REGISTRY/TEAM unless the builder shares this engine's images[/]"
            )
    return eng


def _buildable_plan(inv: Invocation, recipes: Recipes, ws: Workspace, eng: Engine) -> Plan:
    """The plan of a build, its notes printed; a UserError where a layer is unsupported."""
    from ..build import plan_build

    notes: list[str] = []
    plan, _ = plan_build(inv, recipes, ws, eng, notes)
    for note in notes:
        out.print(f"[yellow]{note}[/]")
    if plan.blocked_by:
        out.print(plan_table(plan, cache_known=True))
        first = plan.blocked_by[0]
        raise UserError(
            f"stack {plan.stack} cannot be built for {plan.arch}: layer {first.layer} is unsupported: {first.reason}"
        )
    return plan


def _build(state: BuildState, recipes: Recipes, ws: Workspace, given_base: bool, resumed: bool):
    """Plan and build (pushing where asked): (plan, each layer's outcome)."""
    from ..build import build_requests, execute

    eng = _engine_for(state.invocation)
    inv = state.invocation = local_defaults(state.invocation, recipes, ws, eng, given_base)
    plan = _buildable_plan(inv, recipes, ws, eng)
    out.print(f"engine: {eng.describe()}; jobs: {inv.jobs}")
    if not resumed:
        state.save(ws)
    pusher = _Pusher(eng, ws.logs_for(plan.arch) / "push.log")
    progress = LayerProgress(total=len(plan.chain))
    session = MirrorBuild(inv.mirror, plan, ws.root) if inv.mirror else None
    try:
        requests = build_requests(plan, ws, Path(inv.ca_cert) if inv.ca_cert else None,
                                  builder=inv.builder, push=inv.push)  # fmt: skip
        if session is not None:
            plan, requests = session.apply(plan, requests)
        outcomes = execute(
            plan, eng, ws=ws, state=state, requests=requests,
            wheelhouse=Path(inv.wheelhouse) if inv.wheelhouse else None, progress=progress,
            # a remote builder's next layer pulls its parent: push each one as soon as it passed
            after_layer=pusher.push if inv.builder and inv.push else None,
        )  # fmt: skip
    finally:
        progress.close()
        if session is not None:
            session.close()
    if inv.push:
        for s in plan.chain:
            pusher.push(s)
    return plan, outcomes


class _Pusher:
    """Pushes a layer's tags once each, logging to push.log (started afresh by each build)."""

    def __init__(self, eng: Engine, log: Path) -> None:
        self.eng, self.log, self.pushed = eng, log, set()
        log.unlink(missing_ok=True)

    def push(self, step) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as fh:
            for ref in (step.hash_tag, *step.moving_tags):
                if ref not in self.pushed:
                    out.print(f"pushing {ref}")
                    self.eng.push(ref, fh)
                    self.pushed.add(ref)


def build_invocation(
    recipes: Recipes, ws: Workspace, arch, stack, only, sets, base_image, wheelhouse, ca_cert,
    engine, jobs, namespace,
) -> Invocation:  # fmt: skip
    """Check the options a user gave (before anything runs) and fill in the defaults."""
    from ..build import Invocation

    jobs = jobs if jobs is not None else hostinfo.default_jobs()
    arch, stack = choose_target(recipes, arch, stack)
    if wheelhouse is None and any(ws.wheelhouse.glob("*.whl")):
        wheelhouse = ws.wheelhouse
        # Notes on chosen defaults go to stderr, like the base image's: stdout may be a --json plan.
        err.print(
            f"[dim]wheelhouse: {wheelhouse} (made by tools/setup.sh; --wheelhouse to change)[/]"
        )
    if ca_cert is None and HOST_CA_BUNDLE.is_file():
        ca_cert = HOST_CA_BUNDLE
    elif ca_cert == "none":
        ca_cert = None
    return Invocation(
        arch=arch, stack=stack, sets=list(sets or []), only=only, base_image=base_image,
        wheelhouse=str(Path(wheelhouse).resolve()) if wheelhouse else None,
        ca_cert=str(Path(ca_cert).resolve()) if ca_cert else None,
        jobs=jobs, engine=engine, namespace=namespace,
    )  # fmt: skip


def local_defaults(
    inv: Invocation,
    recipes: Recipes,
    ws: Workspace,
    eng: Engine,
    given_base: bool,
    to_stderr: bool = False,
) -> Invocation:
    """Offline by default where it can be: when the stack's base image is not in the engine but the
    local one tools/setup.sh makes (debootstrap + docker import) is, build on that instead of
    pulling from a registry, and say so."""
    from ..build import Invocation

    spec = recipes.stacks.get(inv.stack)
    local = spec.local_base_image if spec is not None else None
    if given_base or not local or eng.image_id(spec.base_image) is not None:
        return inv
    if eng.image_id(local) is None:
        return inv
    # A note on a chosen default: stderr, so that a --json plan on stdout stays JSON.
    err.print(
        f"[dim]base image: {local} ({spec.base_image} is not in the engine; --base-image to change)[/]"
    )
    return Invocation(**{**inv.__dict__, "base_image": local})


def connect_for_plan(name: str, quiet: bool) -> Engine | None:
    """The engine a plan asks what is cached, or None (said unless quiet) where none answers."""
    from ..engine import connect

    try:
        return connect(name)
    except UserError as exc:
        if not quiet:
            out.print(f"[dim]{exc.message}: cache status unknown[/]")
        return None


def _dry_run(inv: Invocation, recipes: Recipes, ws: Workspace, as_json: bool, layer: str | None):
    from ..build import build_requests, plan_build
    from ..plan import stack_options

    eng = connect_for_plan(inv.engine, quiet=as_json)
    if eng is not None:
        inv = local_defaults(inv, recipes, ws, eng, given_base=inv.base_image is not None)
    notes: list[str] = []
    plan, known = plan_build(inv, recipes, ws, eng, notes)
    for note in notes:
        err.print(f"[yellow]{note}[/]")
    requests = build_requests(plan, ws, Path(inv.ca_cert) if inv.ca_cert else None,
                              builder=inv.builder, push=inv.push)  # fmt: skip

    def command_of(layer: str) -> list[str] | None:
        req = requests.get(layer)
        if req is None:
            return None
        return eng.build_argv(req) if eng is not None else req.argv(["docker"], "buildx")

    if inv.mirror and not as_json:
        for line in mirror_lines(plan, ws.root, inv.mirror, layer):
            out.print(line, markup=False)
    if layer:
        _explain_layer(plan, plan.step(layer), command_of(layer), as_json)
        return
    if as_json:
        data = plan.to_json()
        for s in data["steps"]:
            s["command"] = command_of(s["layer"])
        print(_json_dump(data))
        return
    out.print(plan_table(plan, cache_known=known))
    for s in plan.blocked_by:
        out.print(f"[red]{s.layer} is unsupported on {plan.arch}:[/] {s.reason}")
    out.print(stacks_table(stack_options(recipes, plan.arch), plan.arch, plan.stack))


def _explain_layer(plan: Plan, step, argv: list[str] | None, as_json: bool) -> None:
    if as_json:
        print(_json_dump({"layer": step.layer, "status": step.status, "reason": step.reason,
                          "changes": list(step.changes), "key": step.hash,
                          "input": step.input.to_json() if step.input else None,
                          "command": argv}))  # fmt: skip
        return
    name = f"{step.layer}:{step.variant}" if step.variant else step.layer
    out.print(
        f"[bold]{name}[/] on {plan.arch}: {step.status}"
        + (f" ({step.reason})" if step.reason else "")
    )
    if step.input is None:
        return
    out.print(f"key: {step.hash}  tag: {step.hash_tag}")
    if step.changes:
        out.print("what changed since the last build of this layer:")
        for change in step.changes:
            out.print(f"  - {change}", markup=False)
    elif step.status == "build":
        out.print("no earlier build of this layer is recorded here")
    out.print("inputs (their canonical JSON is the key):")
    out.print(_json_dump(step.input.to_json()), markup=False)
    if argv:
        out.print("engine command:")
        out.print("  " + " ".join(argv), markup=False, soft_wrap=True)


def _json_dump(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


@command(
    options={"output": OUT_FILE},
    help={
        "output": "where to write the JSON Schema (default: print it)",
        "debug": "show tracebacks",
    },
)
@user_errors
def schema(c, output=None, debug=False):
    """Export the JSON Schema of the recipe formats, for editors (YAML language servers)."""
    from ..recipes import json_schema

    text = _json_dump(json_schema()) + "\n"
    if output:
        write_aside(Path(output), text)
        out.print(f"wrote {output}")
    else:
        print(text, end="")


@command(help={"debug": "show tracebacks"})
@user_errors
def arches(c, debug=False):
    """List the arches, their families and which stacks build for them."""
    from rich.table import Table

    from ..plan import stacks_for
    from ..recipes import load_recipes

    recipes = load_recipes(Workspace.discover().root)
    table = Table(title="arches", title_justify="left")
    for col in ("arch", "family", "wave", "matrix", "stacks", "description"):
        table.add_column(col)
    for name, a in recipes.arches.items():
        table.add_row(
            name, a.family, str(a.wave_size or "-"), a.matrix_unit or "-",
            ", ".join(stacks_for(recipes, name)) or "-", a.description,
        )  # fmt: skip
    out.print(table)
