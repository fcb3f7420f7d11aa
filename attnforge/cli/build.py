"""invoke build / invoke schema: argument handling and printing only; the work is in attnforge."""

from __future__ import annotations

import json
import time
from pathlib import Path

from invoke import task

from .. import hostinfo
from ..build import BuildState, Invocation, execute
from ..console import LayerProgress, out, plan_table, summary_table, user_errors
from ..engine import connect
from ..errors import UserError
from ..plan import Options, Plan, mark_cached, parse_overrides, resolve
from ..recipes import Recipes, json_schema, load_recipes, selector_matches


def find_root(start: Path | None = None) -> Path:
    """The attnforge tree to work on: the nearest folder above the working directory that holds
    recipes/stacks.yaml (so a copy of the tree works on itself), else the one this code is in."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "recipes" / "stacks.yaml").is_file():
            return folder
    return Path(__file__).resolve().parents[2]


ROOT = find_root()


def default_arch() -> tuple[str, str]:
    """(arch, why): the host's AMD GPU if one is found, else the cpu reference arch."""
    found = hostinfo.detect_amd_arches()
    if found:
        return found[0], f"detected AMD GPU {found[0]}" + (
            f" (also {', '.join(found[1:])})" if found[1:] else ""
        )
    return "cpu", "no AMD GPU detected (no /sys/class/kfd nodes); using the cpu reference stack"


def default_stack(recipes: Recipes, arch: str) -> str:
    spec = recipes.arches[arch] if arch in recipes.arches else None
    if spec is None:
        return "default"
    fits = [
        n for n, s in recipes.stacks.items() if any(selector_matches(x, spec) for x in s.arches)
    ]
    return "default" if "default" in fits else (fits[0] if fits else "default")


def choose_target(recipes: Recipes, arch: str | None, stack: str | None) -> tuple[str, str]:
    """(arch, stack) for a task: the given ones, else the host's default arch (saying why) and
    that arch's default stack."""
    if arch is None:
        arch, why = default_arch()
        out.print(f"[dim]--arch not given: {why}[/]")
    return arch, stack or default_stack(recipes, arch)


def make_plan(inv: Invocation, recipes: Recipes, engine=None) -> tuple[Plan, bool]:
    """Resolve the invocation; with an engine, the base image's id and the cache status are known."""
    overrides = parse_overrides(inv.sets, recipes)
    base_ref = inv.base_image or (
        recipes.stacks[inv.stack].base_image if inv.stack in recipes.stacks else None
    )
    digest = engine.image_id(base_ref) if engine is not None and base_ref else None
    options = Options(
        base_image=inv.base_image, base_digest=digest, jobs=inv.jobs, namespace=inv.namespace,
        only=inv.only, overrides=overrides,
    )  # fmt: skip
    plan = resolve(recipes, inv.arch, inv.stack, options)
    if engine is None:
        return plan, False
    return mark_cached(plan, engine.existing(s.hash_tag for s in plan.steps)), True


@task(
    iterable=["set_"],
    help={
        "arch": "GPU arch to build for (default: the host's AMD GPU, else cpu); see recipes/arches.yaml",
        "stack": "stack from recipes/stacks.yaml (default: 'default', or the arch's only stack)",
        "only": "build only this layer and the layers it sits on",
        "dry_run": "print the plan (layer, tag, status, why) and build nothing",
        "json": "with --dry-run: print the plan as JSON",
        "continue_": "resume the last build where it failed or was interrupted, with its options",
        "set_": "override a recipe value: LAYER.KEY=VALUE (repeatable)",
        "base_image": "base image for the first layer instead of the stack's",
        "wheelhouse": "folder of local wheels offered to pip inside builds",
        "ca_cert": "extra CA bundle for builds, passed as a BuildKit secret (never stored in an image)",
        "engine": "container engine: docker (default) or podman",
        "jobs": "MAX_JOBS and build parallelism (default: from host memory, 4 GiB a job)",
        "namespace": "image name prefix, e.g. registry.example.com/team (default: attnforge)",
        "push": "push every built or cached tag to the namespace's registry afterwards",
        "debug": "show tracebacks",
    },
)
@user_errors
def build(
    c, arch=None, stack=None, only=None, dry_run=False, json=False, continue_=False, set_=None,
    base_image=None, wheelhouse=None, ca_cert=None, engine="docker", jobs=0, namespace="attnforge",
    push=False, debug=False,
):  # fmt: skip
    """Build a stack's images layer by layer, skipping every layer whose inputs did not change."""
    started = time.monotonic()
    recipes = load_recipes(ROOT)
    if continue_:
        state = BuildState.load(ROOT)
        inv = state.invocation
        out.print(
            f"continuing the last build: stack {inv.stack} for {inv.arch}"
            + (f", which stopped at layer {state.failed}" if state.failed else "")
        )
    else:
        arch, stack = choose_target(recipes, arch, stack)
        for path, flag in ((wheelhouse, "--wheelhouse"), (ca_cert, "--ca-cert")):
            if path and not Path(path).exists():
                raise UserError(f"{flag} {path}: no such file or folder")
        inv = Invocation(
            arch=arch, stack=stack, sets=list(set_ or []), only=only, base_image=base_image,
            wheelhouse=str(Path(wheelhouse).resolve()) if wheelhouse else None,
            ca_cert=str(Path(ca_cert).resolve()) if ca_cert else None,
            jobs=jobs or hostinfo.default_jobs(), engine=engine, namespace=namespace,
        )  # fmt: skip
        state = BuildState(inv)

    if dry_run:
        try:
            eng = connect(inv.engine)
        except UserError as exc:
            eng = None
            if not json:
                out.print(f"[dim]{exc.message}: cache status unknown[/]")
        plan, known = make_plan(inv, recipes, eng)
        if json:
            print(_json_dump(plan.to_json()))
        else:
            out.print(plan_table(plan, cache_known=known))
            _explain_blockers(plan)
        return

    eng = connect(inv.engine)
    plan, _ = make_plan(inv, recipes, eng)
    if plan.blocked_by:
        out.print(plan_table(plan, cache_known=True))
        first = plan.blocked_by[0]
        raise UserError(
            f"stack {plan.stack} cannot be built for {plan.arch}: layer {first.layer} is unsupported: {first.reason}"
        )
    out.print(f"engine: {eng.describe()}; jobs: {inv.jobs}")
    if not continue_:
        state.save(ROOT)
    progress = LayerProgress(total=len(plan.chain))
    try:
        outcomes = execute(
            plan, eng, root=ROOT, state=state,
            wheelhouse=Path(inv.wheelhouse) if inv.wheelhouse else None,
            ca_cert=Path(inv.ca_cert) if inv.ca_cert else None, progress=progress,
        )  # fmt: skip
    finally:
        progress.close()
    if push:
        log = ROOT / "build" / "logs" / plan.arch / "push.log"
        with log.open("w") as fh:
            for s in plan.chain:
                for ref in (s.hash_tag, *s.moving_tags):
                    out.print(f"pushing {ref}")
                    eng.push(ref, fh)
    out.print(summary_table(outcomes, time.monotonic() - started))
    if plan.final_tag:
        out.print(
            f"final image: [bold]{plan.final_tag}[/]  (validate it: invoke validate --arch {plan.arch} --stack {plan.stack})"
        )


def _explain_blockers(plan: Plan) -> None:
    for s in plan.blocked_by:
        out.print(f"[red]{s.layer} is unsupported on {plan.arch}:[/] {s.reason}")


def _json_dump(data) -> str:
    return json.dumps(data, indent=2, sort_keys=True)


@task(
    help={
        "output": "where to write the JSON Schema (default: print it)",
        "debug": "show tracebacks",
    }
)
@user_errors
def schema(c, output=None, debug=False):
    """Export the JSON Schema of the recipe formats, for editors (YAML language servers)."""
    text = _json_dump(json_schema()) + "\n"
    if output:
        Path(output).write_text(text)
        out.print(f"wrote {output}")
    else:
        print(text, end="")


@task(help={"debug": "show tracebacks"})
@user_errors
def arches(c, debug=False):
    """List the arches, their families and which stacks build for them."""
    recipes = load_recipes(ROOT)
    from rich.table import Table

    table = Table(title="arches", title_justify="left")
    for col in ("arch", "family", "wave", "matrix", "stacks", "description"):
        table.add_column(col)
    for name, a in recipes.arches.items():
        stacks = [
            n for n, s in recipes.stacks.items() if any(selector_matches(x, a) for x in s.arches)
        ]
        table.add_row(
            name,
            a.family,
            str(a.wave_size or "-"),
            a.matrix_unit or "-",
            ", ".join(stacks) or "-",
            a.description,
        )
    out.print(table)
