"""invoke bisect: argument handling and printing only; the search is attnforge/bisection/search.py and the
probes attnforge/bisection/probe.py."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

from invoke.exceptions import Exit

from ..console import LayerProgress, err, out, user_errors
from ..errors import UserError
from ..workspace import Workspace
from . import ARCH, IN_DIR, STACK, command, number, text
from .build import BUILD_OPTIONS, build_invocation, local_defaults

if TYPE_CHECKING:  # the library is imported where a task uses it (attnforge/cli/__init__.py)
    from ..bisection import search as bs
    from ..build import Invocation
    from ..plan import Step
    from ..recipes import Recipes


def _verdict_style(verdict: str) -> str:
    from ..bisection import search as bs

    return {bs.GOOD: "green", bs.BAD: "bold red", bs.SKIP: "yellow"}[verdict]


@command(
    options={
        **{k: v for k, v in BUILD_OPTIONS.items() if k not in ("only", "cache_from")},
        "arch": ARCH,
        "stack": STACK,
        "layer": text("LAYER"),
        "good": text("PIN"),
        "bad": text("PIN"),
        "check": text("KIND:WHAT"),
        "key": text("KEY"),
        "repo": text("URL|DIR"),
        "index": text("URL"),
        "offline": IN_DIR,
        "max_probes": number("N"),
        "timeout": number("SECONDS"),
    },  # fmt: skip
    writes=("build", "reports"),
    help={
        "arch": "arch of the stack (default: the host's AMD GPU, else cpu)",
        "stack": "stack to build at each pin (default: the arch's default stack)",
        "layer": "the layer whose pin is bisected",
        "good": "a pin that passes the check: a commit, tag or branch of the layer's repository, "
        "or a version (default: the recipe's pin)",
        "bad": "a later pin that fails the check",
        "check": "what decides good or bad in each probe's image: check:GLOB, validate, "
        "stress:WORKLOAD[,iters=N,...], bench:BACKEND[,mode=M,min_ratio=R,...] (against the "
        "kept baseline of invoke validate --bench), cmd:SHELL COMMAND; docs/bisect.md",
        "key": "the pin to vary (default: SOURCE_REF of a source layer, else the layer's only "
        "*_VERSION pin)",
        "repo": "read the commits from this repository (a local mirror folder or a URL) instead "
        "of the layer's SOURCE_REPO",
        "index": "read the versions from this package index (default: the layer's *_INDEX_URL, "
        "else PyPI)",
        "offline": "a folder of git mirrors and saved index pages to read candidates from, laid "
        "out as for `invoke pins.check --offline` (docs/pins.md)",
        "verify": "probe --good and --bad first, and stop if they do not hold",
        "max_probes": "stop after this many probes; the same command continues later",
        "reset": "forget the recorded bisect of this arch, stack and layer and start over",
        "quick": "check: and validate: run the suite's fewer cases",
        "timeout": "seconds: each validation check's timeout (check:, validate), stress's "
        "no-progress timeout, or the whole command's (cmd:, a hang is bad)",
        "set_": "another recipe override for every probe: LAYER.KEY=VALUE (repeatable)",
        "base_image": "base image for the first layer (as for invoke build)",
        "wheelhouse": "folder of local wheels offered to pip inside builds (as for invoke build)",
        "ca_cert": "CA bundle for pip inside builds, or 'none' (as for invoke build)",
        "engine": "container engine: docker (default) or podman",
        "jobs": "MAX_JOBS and build parallelism (as for invoke build)",
        "namespace": "image name prefix (default: attnforge); probes add content tags only",
        "debug": "show tracebacks",
    },
)
@user_errors
def bisect(
    c, arch=None, stack=None, layer=None, good=None, bad=None, check=None, key=None, repo=None,
    index=None, offline=None, verify=False, max_probes=None, reset=False, quick=False,
    timeout=None, set_=None, base_image=None, wheelhouse=None, ca_cert=None, engine="docker",
    jobs=None, namespace="attnforge", debug=False,
):  # fmt: skip
    """Find the first pin of a layer that breaks a check, narrowing by halves from a good pin.

    Builds and checks the stack at pins between a good and a bad one; re-running the same
    command continues an interrupted bisect."""
    from ..bisection import search as bs
    from ..recipes import load_recipes

    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    inv = build_invocation(
        recipes, ws, arch, stack, None, set_, base_image, wheelhouse, ca_cert,
        engine, jobs, namespace,
    )  # fmt: skip
    limit, seconds = max_probes, timeout
    if not check:
        raise UserError("--check is needed: what tells a good pin from a bad one",
                        hint="e.g. --check 'check:sdpa.case.*' or --check 'cmd:python3 -c "
                        "\"import flash_attn\"' (docs/bisect.md)")  # fmt: skip
    spec = bs.parse_check(check, quick=quick, timeout=seconds,
                          **_kept_baseline(ws, inv.arch, inv.stack, check))  # fmt: skip
    step = _bisected_step(recipes, inv, layer)
    key = key or _default_key(recipes, step)
    _check_key(step, key, inv.sets)
    if not bad:
        raise UserError("--bad is needed: a pin that fails the check")
    if good is None:
        good = step.pins[key]
        out.print(f"[dim]--good not given: the recipe's {layer}.{key} = {good}[/]")

    path = bs.state_path(ws.state_dir, inv.arch, inv.stack, step.layer)
    if reset and path.exists():
        path.unlink()
        out.print(f"forgot the recorded bisect ({path})")
    asked = bs.BisectState(inv.arch, inv.stack, step.layer, key, good, bad, spec.selector, [],
                           sets=list(inv.sets), verify_ends=verify)  # fmt: skip
    state = bs.BisectState.load(path)
    if state is not None:
        diff = bs.differences(state.question(), asked.question())
        if diff:
            raise UserError(
                f"a different bisect of {inv.arch}/{inv.stack}/{step.layer} is recorded in {path}: "
                + "; ".join(diff),
                hint="run it with the recorded options to continue it, or add --reset to start over",
            )
        out.print(f"continuing the bisect recorded in {path}: {len(state.probes)} probe(s) done"
                  + (f"; the probe of {state.in_progress[:12]} was interrupted and runs again"
                     if state.in_progress else ""))  # fmt: skip
    else:
        state = asked
        base = inv.base_image or recipes.stacks[inv.stack].base_image
        state.candidates, state.source = _candidates(ws, step, key, good, bad, repo, index,
                                                     offline, base)  # fmt: skip
        state.created = _now()
        state.save(path)
        n = len(state.candidates) - 1
        out.print(f"{n} pin(s) after the good one in {state.source}; about "
                  f"{bs.expected_probes(len(state.candidates))} probe(s)")  # fmt: skip

    outcome = state.outcome()
    if outcome.status == "running":
        outcome = _probe_until_done(state, path, recipes, ws, inv, spec, limit,
                                    given_base=base_image is not None)  # fmt: skip
    _print_result(state, outcome, spec, path)
    if outcome.status == "ambiguous":
        raise Exit(code=1)


def _kept_baseline(ws: Workspace, arch: str, stack: str, check: str) -> dict:
    """bench: judges each probe against the kept baseline of the arch and stack, if there is one."""
    from ..baseline.gate import BaselineError, load_bench
    from ..baseline.store import kept_dir

    if not check.startswith("bench:"):
        return {}
    kept = kept_dir(ws.reports_for(arch, stack))
    if kept is None:
        return {}
    try:
        return {"baseline": str(kept / "bench.json"), "baseline_doc": load_bench(kept)}
    except BaselineError as exc:
        raise UserError(f"the kept baseline cannot be read: {exc}",
                        hint="run `invoke validate --bench` on a good build again") from None  # fmt: skip


def _bisected_step(recipes: Recipes, inv: Invocation, layer: str | None) -> Step:
    from ..plan import Options, parse_overrides, resolve

    plan = resolve(recipes, inv.arch, inv.stack, Options(overrides=parse_overrides(inv.sets, recipes)))  # fmt: skip
    pinned = [s.layer for s in plan.chain if _bisectable(s)]
    if not layer:
        raise UserError("--layer is needed: the layer whose pin is bisected",
                        hint=f"layers of stack {inv.stack} with a commit or version pin: "
                        f"{', '.join(pinned) or 'none'}")  # fmt: skip
    step = plan.step(layer)
    if not step.runs:
        raise UserError(f"layer {layer} is not built in stack {inv.stack} for {inv.arch}: "
                        f"{step.reason or step.status}")  # fmt: skip
    return step


def _bisectable(step: Step) -> bool:
    from ..recipes import pin_kind

    return any(pin_kind(k) in ("commit", "version") for k in step.pins)


def _default_key(recipes: Recipes, step: Step) -> str:
    """SOURCE_REF of a source layer; else the one commit or version pin, or among several the
    version of what the layer is named after or provides (triton: TRITON_VERSION, not NUMPY's)."""
    from ..pins.upstream import project_of
    from ..recipes import pin_kind

    if "SOURCE_REF" in step.pins:
        return "SOURCE_REF"
    choices = [k for k in step.pins if pin_kind(k) in ("version", "commit")]
    own = {step.layer, *recipes.layers[step.layer].provides}
    named = [k for k in choices if pin_kind(k) == "version" and project_of(k) in own]
    if len(choices) == 1 or len(named) == 1:
        return choices[0] if len(choices) == 1 else named[0]
    raise UserError(
        f"layer {step.layer} has {'no' if not choices else 'several'} pins to bisect"
        + (f": {', '.join(choices)}" if choices else " (no commit or version pin)"),
        hint="choose one with --key" if choices else "choose another --layer",
    )


def _check_key(step: Step, key: str, sets: list[str]) -> None:
    from ..recipes import pin_kind

    if key not in step.pins:
        raise UserError(f"layer {step.layer} has no pin {key!r}; its pins: "
                        f"{', '.join(sorted(step.pins)) or 'none'}")  # fmt: skip
    if pin_kind(key) not in ("commit", "version"):
        raise UserError(f"--key {key} is a {pin_kind(key)} pin; only commits (SOURCE_REF, "
                        "*_COMMIT) and versions (*_VERSION) can be bisected")  # fmt: skip
    if any(s.partition("=")[0] == f"{step.layer}.{key}" for s in sets):
        raise UserError(f"--set {step.layer}.{key} is what the bisect varies; leave it out")


def _candidates(
    ws: Workspace, step: Step, key: str, good: str, bad: str, repo: str | None,
    index: str | None, offline: str | None, base_image: str,
) -> tuple[list[bs.Candidate], str]:  # fmt: skip
    """[good, ..., bad] and where they were read."""
    from ..bisection.probe import GitHistory, wheel_candidates
    from ..pins.upstream import (
        IndexSource,
        Sources,
        Unavailable,
        distro_python,
        project_of,
        step_indexes,
    )
    from ..recipes import pin_kind

    if pin_kind(key) == "commit":
        url = repo or (step.pins.get("SOURCE_REPO") if key == "SOURCE_REF" else None)
        if not url:
            raise UserError(f"the recipes do not say where {step.layer}.{key}'s commits live",
                            hint="give --repo URL or a local mirror folder")  # fmt: skip
        mirror = Path(url) if Path(url).is_dir() else None
        if offline and mirror is None:
            try:
                mirror = Sources(Path(offline)).repo(url).path
            except Unavailable as exc:
                raise UserError(f"--offline {offline}: {exc}") from None
        history = GitHistory(url, cache_dir=ws.build_dir / "bisect-cache", mirror=mirror)
        good_sha, bad_sha = history.resolve(good, "--good"), history.resolve(bad, "--bad")
        return history.between(good_sha, bad_sha), history.describe()
    url = index or step_indexes(step)[0]
    python = distro_python(base_image)  # the wheels that install on the image's Python
    source = IndexSource(Path(offline) if offline else None)
    found = wheel_candidates(source, url, project_of(key), python, good, bad)
    return found, f"{project_of(key)} on {url}"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _probe_until_done(
    state: bs.BisectState, path: Path, recipes: Recipes, ws: Workspace, inv: Invocation,
    spec: bs.CheckSpec, limit: int | None, given_base: bool,
) -> bs.Outcome:  # fmt: skip
    from ..bisection.probe import Prober
    from ..engine import connect
    from ..plan import Options, parse_overrides, resolve
    from ..validation import device_flags, expect_document

    flags = device_flags(recipes.arches[inv.arch].vendor)
    eng = connect(inv.engine)
    inv = local_defaults(inv, recipes, ws, eng, given_base=given_base)
    expect = None
    if spec.kind == "validate":
        plan = resolve(recipes, inv.arch, inv.stack, Options(namespace=inv.namespace))
        expect = expect_document(recipes, plan)
    prober = Prober(ws, recipes, eng, inv, state.layer, state.key, spec, flags, expect,
                    on_line=lambda line: out.print(f"    {line}", markup=False, highlight=False))  # fmt: skip
    done_now = 0
    while True:
        outcome = state.outcome()
        if outcome.status != "running":
            return outcome
        if limit is not None and done_now >= limit:
            out.print(f"stopped after {done_now} probe(s) as asked (--max-probes); run the same "
                      "command again to continue")  # fmt: skip
            return outcome
        cand = state.candidates[outcome.next]
        left = _left(outcome)
        out.print(f"\n[bold]probe {len(state.probes) + 1}[/] (about {left} left): "
                  f"{cand.pin} {cand.label}", soft_wrap=True)  # fmt: skip
        state.in_progress, state.updated = cand.pin, _now()
        state.save(path)
        chain_len = len(resolve(recipes, inv.arch, inv.stack, Options(
            overrides=parse_overrides(inv.sets, recipes))).chain)  # fmt: skip
        progress = LayerProgress(total=chain_len)
        prober.progress = progress
        try:
            probe = prober.probe(cand.pin)
        except KeyboardInterrupt:
            progress.close()
            err.print(f"[bold red]interrupted[/] during the probe of {cand.pin[:12]}; "
                      f"{len(state.probes)} finished probe(s) are kept in {path}: run the same "
                      "command again to continue")  # fmt: skip
            raise Exit(code=130) from None
        finally:
            progress.close()
        state.probes = [p for p in state.probes if p.pin != probe.pin] + [probe]
        state.in_progress, state.updated = None, _now()
        state.save(path)
        done_now += 1
        cached = [layer for layer, how in probe.build.items() if how == "cached"]
        out.print(
            f"  → [{_verdict_style(probe.verdict)}]{probe.verdict}[/]: {probe.reason} "
            f"({probe.seconds:.0f}s; cached: {', '.join(cached) or 'none'})",
            soft_wrap=True,
        )


def _left(outcome: bs.Outcome) -> int:
    span = (outcome.first_bad or 0) - (outcome.last_good or 0)
    return max(1, math.ceil(math.log2(span))) if span > 1 else 1


def _print_result(state: bs.BisectState, outcome: bs.Outcome, spec: bs.CheckSpec, path: Path) -> None:  # fmt: skip
    from rich.table import Table

    from ..bisection import search as bs

    table = Table(
        title=f"probes of {state.layer}.{state.key} ({state.check})", title_justify="left"
    )
    for col in ("#", "pin", "what", "verdict", "why", "cached"):
        table.add_column(col, overflow="fold")
    labels = {c.pin: c.label for c in state.candidates}
    for i, p in enumerate(state.probes, 1):
        cached = [layer for layer, how in p.build.items() if how == "cached"]
        table.add_row(str(i), bs.short_pin(p.pin), labels.get(p.pin, ""),
                      f"[{_verdict_style(p.verdict)}]{p.verdict}[/]", p.reason,
                      ", ".join(cached) or "-")  # fmt: skip
    if state.probes:
        out.print(table)
        folder = Path(state.probes[0].report).parent
        out.print(f"each probe's evidence: {folder}/<pin>/ (probe.json, check.log, the check's "
                  "report, a failed build's log)", markup=False, soft_wrap=True)  # fmt: skip
    if outcome.status == "running":
        out.print(f"bisect in progress ({path}); the range still in doubt: "
                  f"{state.candidates[outcome.last_good].pin[:12]}..{state.candidates[outcome.first_bad].pin[:12]}")  # fmt: skip
        return
    good, bad = state.candidates[outcome.last_good], state.candidates[outcome.first_bad]
    if outcome.status == "ambiguous":
        out.print(
            f"[bold yellow]only skipped pins are left[/]: the first bad {state.key} is one of:"
        )
        for i in outcome.could_be:
            c = state.candidates[i]
            probe = state.probe_of(c.pin)
            out.print(f"  {c.pin}  {c.label}" + (f"  (skip: {probe.reason})" if probe else ""),
                      markup=False, soft_wrap=True)  # fmt: skip
        out.print(f"last good: {good.pin}  {good.label}", markup=False, soft_wrap=True)
        return
    out.print(f"[bold red]first bad {state.key}:[/] {bad.pin}  {bad.label}", soft_wrap=True)
    out.print(f"[bold green]last good {state.key}:[/] {good.pin}  {good.label}", soft_wrap=True)
    _print_evidence(state, good, bad, spec)


def _print_evidence(state: bs.BisectState, good: bs.Candidate, bad: bs.Candidate, spec: bs.CheckSpec) -> None:  # fmt: skip
    """The two probes' reports side by side; an end that was taken on trust has none."""
    from rich.table import Table

    from ..bisection import search as bs
    from ..bisection.probe import read_doc

    pg, pb = state.probe_of(good.pin), state.probe_of(bad.pin)
    for which, c, p in (("last good", good, pg), ("first bad", bad, pb)):
        if p is None:
            out.print(f"[dim]{which} {c.pin[:12]} was not probed (taken as {which.split()[-1]} "
                      "from --good/--bad; --verify probes it)[/]")  # fmt: skip
    table = Table(title="evidence: last good vs first bad", title_justify="left")
    table.add_column("")
    table.add_column(f"last good {bs.short_pin(good.pin)}", overflow="fold")
    table.add_column(f"first bad {bs.short_pin(bad.pin)}", overflow="fold")
    table.add_row("verdict", pg.reason if pg else "(taken as good)", pb.reason if pb else "(taken as bad)")  # fmt: skip
    if spec.output:
        names = (spec.output,)
        for what, before, after in bs.report_rows(
            read_doc(pg.report, names) if pg else None, read_doc(pb.report, names) if pb else None
        ):
            table.add_row(what, before, after)
    else:
        table.add_row("output (last lines)", _tail(pg), _tail(pb))
    out.print(table)
    for which, p in (("last good", pg), ("first bad", pb)):
        if p is not None:
            shown = Path(p.report) / (spec.output or "check.log")
            out.print(f"{which}: {shown}", markup=False, soft_wrap=True)


def _tail(probe: bs.Probe | None, n: int = 6) -> str:
    if probe is None:
        return "-"
    log = Path(probe.report) / "check.log"
    try:
        lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no output kept)"
    return "\n".join(lines[-n:]) or "(no output)"
