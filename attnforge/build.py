"""Executes a Plan on an engine: stage each layer's context, build, smoke-check, then tag.

Tags move only after a layer is built *and* its smoke checks pass, so an interrupted or broken
build never leaves a hash tag (which would be taken as cached) or a moving tag on a bad image.
The build requests are made from the plan before anything runs (`build_requests`), so a dry run
can print the exact engine command of every layer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from contract import arches

from .engine import BuildFailed, BuildRequest, Engine, RegistryUnavailable, RunRequest
from .errors import UserError
from .files import write_aside
from .mirror.use import rehearsal_mark
from .plan import (
    Options,
    Plan,
    Step,
    cache_ref,
    explain,
    mark_cached,
    mark_pullable,
    parse_overrides,
    resolve,
)
from .recipes import Recipes
from .workspace import Workspace

MANIFEST_NAME = "attnforge-manifest.json"
ARCHES_YAML = "recipes/arches.yaml"
SMOKE_TIMEOUT_S = 600


@dataclass
class Outcome:
    layer: str
    status: str  # built | cached | failed | interrupted | not run | skipped | unsupported | blocked
    seconds: float = 0.0
    tag: str = ""
    detail: str = ""


class LayerFailed(UserError):
    """A layer failed to build or failed its smoke checks: names the layer, the log and its tail."""

    exit_code = 1

    def __init__(self, layer: str, log: Path, tail: list[str], what: str) -> None:
        body = "\n".join("    " + line for line in tail)
        super().__init__(
            f"layer {layer!r} {what}; log: {log}\n  last lines of the log:\n{body}",
            hint="fix the cause, then `invoke build --continue` resumes at this layer",
        )
        self.layer, self.log = layer, log


@dataclass
class Invocation:
    """What `invoke build` was asked, saved so that `--continue` can repeat it."""

    arch: str
    stack: str
    sets: list[str] = field(default_factory=list)
    only: str | None = None
    base_image: str | None = None
    wheelhouse: str | None = None
    ca_cert: str | None = None
    jobs: int = 2
    engine: str = "docker"
    namespace: str = "attnforge"
    cache_from: str | None = None  # a registry namespace whose content tags are pulled, not built
    require_cache: bool = False  # a cache that does not answer is an error, not a fallback
    builder: str | None = None  # a buildx builder or a buildkitd address (BuildRequest.builder)
    push: bool = False  # push the tags (with a builder: each layer as soon as it passed its checks)
    mirror: str | None = None  # build from this mirror folder only (attnforge/mirror)


def _write_json(path: Path, data: Any) -> None:
    """Write aside, then rename: a reader never sees a half-written file."""
    write_aside(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


@dataclass
class BuildState:
    """The last build, saved before and after every layer so `--continue` can say where it stopped
    even when the process was killed (`in_progress` is set before a layer starts)."""

    invocation: Invocation
    done: list[str] = field(default_factory=list)  # hashes built or found cached
    failed: str | None = None
    interrupted: bool = False
    in_progress: str | None = None

    @staticmethod
    def path(ws: Workspace) -> Path:
        return ws.state_dir / "last-build.json"

    def save(self, ws: Workspace) -> None:
        _write_json(self.path(ws), asdict(self))

    @property
    def stopped_at(self) -> str | None:
        """The layer the last build stopped at: failed, interrupted, or killed while building it."""
        return self.failed or self.in_progress

    @classmethod
    def load(cls, ws: Workspace) -> BuildState:
        path = cls.path(ws)
        if not path.exists():
            raise UserError(
                "nothing to continue: no earlier build was recorded",
                hint="run `invoke build --arch ...` first",
            )
        data = json.loads(path.read_text())
        return cls(
            Invocation(**data["invocation"]),
            data["done"],
            data.get("failed"),
            data.get("interrupted", False),
            data.get("in_progress"),
        )


class InputsStore:
    """What each layer's last image was built from, per arch: the BuildInput JSON that `--dry-run`
    compares with to say why a layer rebuilds."""

    def __init__(self, ws: Workspace) -> None:
        self.dir = ws.state_dir / "inputs"

    def _path(self, arch: str, layer: str) -> Path:
        return self.dir / arch / f"{layer}.json"

    def load(self, arch: str) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for path in sorted((self.dir / arch).glob("*.json")):
            try:
                found[path.stem] = json.loads(path.read_text())["input"]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a damaged record only loses the explanation, never a build
        return found

    def record(self, step: Step) -> None:
        if step.input is not None:
            _write_json(
                self._path(step.arch, step.layer),
                {"key": step.hash, "tag": step.hash_tag, "input": step.input.to_json()},
            )


def provenance(ws: Workspace, env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """OCI provenance labels shared by every image of a build: where the recipes came from (the
    git remote and commit of this checkout, when it is one) and when. Labels are not part of the
    cache key: the same inputs still make the same content tag.

    The time is SOURCE_DATE_EPOCH's where it is set (the reproducible-builds.org convention:
    whole seconds since 1970 UTC), else now. Under Podman it matters beyond the label: Buildah
    writes labels as a last LABEL step into the image's history, which the layers built on it
    compare, so a build time that differs gives the next build of the layers above no cache."""
    epoch = env.get("SOURCE_DATE_EPOCH")
    if epoch is None or epoch == "":
        when = time.gmtime()
    elif epoch.isascii() and epoch.isdigit() and int(epoch) < 253402300800:  # year < 10000
        when = time.gmtime(int(epoch))
    else:
        raise UserError(
            f"SOURCE_DATE_EPOCH={epoch!r} is not a time: give whole seconds since 1970-01-01 UTC",
            hint="e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct), or unset it",
        )
    found = {"org.opencontainers.image.created": time.strftime("%Y-%m-%dT%H:%M:%SZ", when)}
    for key, argv in (
        ("org.opencontainers.image.revision", ["rev-parse", "HEAD"]),
        ("org.opencontainers.image.source", ["config", "--get", "remote.origin.url"]),
    ):
        try:
            proc = subprocess.run(["git", "-C", str(ws.root), *argv], capture_output=True,
                                  text=True, timeout=10)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            continue
        if proc.returncode == 0 and proc.stdout.strip():
            found[key] = proc.stdout.strip()
    return found


def labels_for(step: Step, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # the stack's key versions so far (every layer's *_VERSION pins, root first)
    versions = [
        f"{k.removesuffix('_VERSION').lower()}={v}"
        for layer in step.manifest.values() if isinstance(layer, dict)
        for k, v in layer.items() if k.endswith("_VERSION")
    ]  # fmt: skip
    return {
        **(extra or {}),
        "org.opencontainers.image.version": ",".join(versions) or step.short_hash,
        "org.attnforge.layer": step.layer,
        "org.attnforge.variant": step.variant or "",
        "org.attnforge.arch": step.arch,
        "org.attnforge.hash": step.hash,
        "org.attnforge.versions": json.dumps(step.manifest, sort_keys=True, separators=(",", ":")),
        # the layers this image is made of, root first: what `invoke publish` pushes
        "org.attnforge.lineage": json.dumps(
            [[layer, h[:12]] for layer, h in step.lineage], separators=(",", ":")
        ),
    }


def plan_build(
    inv: Invocation,
    recipes: Recipes,
    ws: Workspace,
    engine: Engine | None = None,
    notes: list[str] | None = None,
) -> tuple[Plan, bool]:
    """Resolve an invocation into a plan. With an engine, the base image's id and what is cached
    are known (the bool says so), locally or in the registry cache; every step that will build
    says what changed since its last build. Sentences for the user go to `notes`."""
    overrides = parse_overrides(inv.sets, recipes)
    base_ref = inv.base_image or (
        recipes.stacks[inv.stack].base_image if inv.stack in recipes.stacks else None
    )
    digest = engine.image_id(base_ref) if engine is not None and base_ref else None
    options = Options(
        base_image=inv.base_image, base_digest=digest, jobs=inv.jobs, namespace=inv.namespace,
        only=inv.only, overrides=overrides, rehearsal=rehearsal_mark(inv.mirror),
    )  # fmt: skip
    plan = resolve(recipes, inv.arch, inv.stack, options)
    known = engine is not None
    if engine is not None:
        plan = mark_cached(plan, engine.existing(s.hash_tag for s in plan.steps))
        if inv.cache_from:
            plan = mark_pullable(plan, inv.cache_from, _in_cache(plan, inv, engine, notes))
    return explain(plan, InputsStore(ws).load(inv.arch)), known


def _in_cache(plan: Plan, inv: Invocation, engine: Engine, notes: list[str] | None) -> set[str]:
    """The content tags of the steps to build that the registry cache holds. A registry that does
    not answer is said once; the layers then build (or, with require_cache, nothing does)."""
    found = set()
    for step in plan.steps:
        if step.status != "build":
            continue
        ref = cache_ref(step, inv.cache_from or "")
        try:
            if engine.remote_has(ref):
                found.add(ref)
        except RegistryUnavailable as exc:
            if inv.require_cache:
                raise UserError(exc.message, hint="check the registry, or build without "
                                "--require-cache to fall back to building") from None  # fmt: skip
            if notes is not None:
                notes.append(f"{exc.message}; building instead of pulling from the cache")
            break
    return found


# ---------------------------------------------------------------------------- staging


OWNER_FILE = ".owner"  # the pid of the build using a staging folder


def staging_for(ws: Workspace, step: Step) -> Path:
    return ws.staging_dir / step.arch / f"{step.layer}-{step.short_hash}"


def sweep_staging(ws: Workspace) -> list[Path]:
    """Remove staging folders left by builds that no longer run (killed with SIGKILL, a crash):
    they can hold hundreds of MB of wheels. Folders of a live build are left alone."""
    removed = []
    for owner in sorted(ws.staging_dir.glob(f"*/*/{OWNER_FILE}")):
        try:
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            pid = 0
        if pid and pid != os.getpid() and _alive(pid):
            continue
        shutil.rmtree(owner.parent, ignore_errors=True)
        removed.append(owner.parent)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def render_arch_facts(ctx: Path) -> Path | None:
    """A context with the contract package and recipes/arches.yaml gets the facts as JSON
    (contract/arches.json), which the image reads without PyYAML (contract/arches.py)."""
    src, dest = ctx / ARCHES_YAML, ctx / "contract" / arches.JSON_NAME
    if not (src.is_file() and dest.parent.is_dir()):
        return None
    dest.unlink(
        missing_ok=True
    )  # a staged file may be a hard link into the tree: never write through
    dest.write_text(
        arches.render(yaml.safe_load(src.read_text(encoding="utf-8"))), encoding="utf-8"
    )
    return dest


def stage_context(step: Step, root: Path, dest: Path, wheelhouse: Path | None) -> Path:
    """Lay out exactly the hashed files (plus the derived manifest and offered wheels) in dest."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / OWNER_FILE).write_text(f"{os.getpid()}\n")
    ctx = dest / "context"
    ctx.mkdir()
    shutil.copy2(root / step.dockerfile, ctx / "Dockerfile")
    for cf in step.context:
        _link_or_copy(root / cf.path, ctx / cf.path)
    (ctx / MANIFEST_NAME).write_text(json.dumps(step.manifest, indent=2, sort_keys=True) + "\n")
    render_arch_facts(ctx)
    wh = ctx / "wheelhouse"
    wh.mkdir(exist_ok=True)  # always there: Dockerfiles bind-mount it
    if step.wheelhouse and wheelhouse:
        for whl in sorted(wheelhouse.glob("*.whl")):
            _link_or_copy(whl, wh / whl.name)
    return ctx / "Dockerfile"


def unchecked_ref(step: Step) -> str:
    """Where a builder pushes a layer straight to the registry before its smoke checks ran: beside
    the content tag, never on it, so a registry cache never offers an image that failed them."""
    return f"{step.hash_tag}-unchecked"


def build_requests(
    plan: Plan,
    ws: Workspace,
    ca_cert: Path | None = None,
    builder: str | None = None,
    push: bool = False,
) -> dict[str, BuildRequest]:
    """The engine request of every step that will build, keyed by layer: made before anything
    runs, so a dry run shows them and tests can compare them with what the engine received.
    With a builder and push, each layer goes straight to the registry (`unchecked_ref`)."""
    secrets = {"ca": ca_cert} if ca_cert else {}
    origin = provenance(ws)
    requests = {}
    for step in plan.steps:
        if step.status != "build":
            continue
        stage = staging_for(ws, step)
        requests[step.layer] = BuildRequest(
            context=stage / "context",
            dockerfile=stage / "context" / "Dockerfile",
            build_args={"BASE_IMAGE": step.base_ref, **step.args, **step.hint_args},
            labels=labels_for(step, origin),
            iidfile=stage / "iid",
            secrets=secrets,
            builder=builder,
            push_to=unchecked_ref(step) if builder and push else None,
        )
    return requests


# ---------------------------------------------------------------------------- failures


_STEP_LINE = re.compile(r"^#(\d+) \d+\.\d+ (.*)$")
_STEP_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")


def failure_tail(text: str, n: int = 30) -> list[str]:
    """The lines that explain a failed build: the failing BuildKit step's own output (without
    BuildKit's '#6 7.408' prefixes and the echo of the whole RUN command), else the log's tail."""
    lines = text.splitlines()
    failed = next((m.group(1) for m in map(_STEP_ERROR.match, reversed(lines)) if m), None)
    if failed is None:
        return lines[-n:]
    output = [m.group(2) for m in map(_STEP_LINE.match, lines) if m and m.group(1) == failed]
    return output[-n:] or lines[-n:]


def _tail(path: Path, n: int = 30) -> list[str]:
    try:
        return failure_tail(path.read_text(errors="replace"), n)
    except OSError:
        return []


def smoke(engine: Engine, image: str, step: Step, log) -> list[dict[str, Any]]:
    """Run the step's smoke checks in the image; returns one dict per check."""
    from .image import smoke_runner  # its source goes into the image; a plan never needs it

    if not step.smoke:
        return []
    req = RunRequest(
        image=image,
        command=["python3", "-", json.dumps(list(step.smoke))],
        stdin=True,
        network="none",
    )
    source = Path(smoke_runner.__file__).read_text()
    log.write(f"\n$ smoke checks in {image[:19]}\n")
    proc = engine.run(req, input=source, timeout=SMOKE_TIMEOUT_S)
    log.write(proc.stdout + proc.stderr)
    results = []
    for line in proc.stdout.splitlines():
        try:
            results.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if proc.returncode not in (0, 1) or not results:
        results.append(
            {
                "name": "smoke runner",
                "ok": False,
                "detail": (proc.stderr or proc.stdout).strip()[-300:],
            }
        )
    return results


# ---------------------------------------------------------------------------- execute


Progress = Callable[[str, Step, str], None]  # (event, step, detail)


def execute(
    plan: Plan,
    engine: Engine,
    *,
    ws: Workspace,
    state: BuildState,
    requests: Mapping[str, BuildRequest],
    wheelhouse: Path | None = None,
    progress: Progress | None = None,
    after_layer: Callable[[Step], None] | None = None,
) -> list[Outcome]:
    """Build every step of the plan in order; raises LayerFailed at the first failure.
    `after_layer` runs once a layer's tags have moved (built, pulled or cached): a remote
    builder's next layer can only start from a parent that was pushed there."""
    notify = progress or (lambda event, step, detail: None)
    done_with = after_layer or (lambda step: None)
    logs = ws.logs_for(plan.arch)
    logs.mkdir(parents=True, exist_ok=True)
    inputs = InputsStore(ws)
    sweep_staging(ws)
    outcomes: list[Outcome] = []
    for step in plan.steps:
        if not step.runs:
            outcomes.append(Outcome(step.layer, step.status, detail=step.reason))
            continue
        if step.status == "cached":
            image = engine.image_id(step.hash_tag)
            assert image is not None, f"{step.hash_tag} vanished"
            for ref in step.moving_tags:
                if engine.image_id(ref) != image:
                    engine.tag(image, ref)
            notify("cached", step, step.hash_tag)
            outcomes.append(Outcome(step.layer, "cached", tag=step.hash_tag))
            inputs.record(step)
            state.done.append(step.hash)
            state.save(ws)
            done_with(step)
            continue

        state.in_progress = step.layer
        state.save(ws)
        try:
            if step.status == "pull":
                outcomes.append(_pull_step(step, engine, logs, state, ws, notify))
            else:
                outcomes.append(
                    _build_step(
                        step, engine, ws, requests[step.layer], logs, state, wheelhouse, notify
                    )
                )
        except KeyboardInterrupt:
            state.failed, state.interrupted = step.layer, True
            state.save(ws)
            raise
        inputs.record(step)
        done_with(step)
    state.in_progress = None
    state.save(ws)
    return outcomes


def _pull_step(
    step: Step, engine: Engine, logs: Path, state: BuildState, ws: Workspace, notify: Progress
) -> Outcome:
    """Pull the layer's image from the registry cache, smoke-check it as if built here, then
    tag it: a cache hit is trusted no more than a build."""
    log_path = logs / f"{step.layer}.log"
    notify("pull", step, step.pull_ref)
    started = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"$ pull {step.pull_ref}\n")
        try:
            image = engine.pull(step.pull_ref, log)
        except UserError as exc:
            state.failed = step.layer
            state.save(ws)
            raise LayerFailed(step.layer, log_path, _tail(log_path), exc.message) from None
        results = smoke(engine, image, step, log)
    return _finish(step, engine, image, results, log_path, state, ws, notify, started, "pulled")


def _finish(
    step: Step, engine: Engine, image: str, results: list[dict[str, Any]], log_path: Path,
    state: BuildState, ws: Workspace, notify: Progress, started: float, status: str,
) -> Outcome:  # fmt: skip
    """Smoke verdicts, then (only if all passed) the tags; the state records either."""
    bad = [r for r in results if not r["ok"]]
    for r in results:
        notify("smoke", step, f"{'ok ' if r['ok'] else 'FAIL'} {r['name']}: {r['detail']}")
    if bad:
        state.failed = step.layer
        state.save(ws)
        tail = [f"{r['name']}: {r['detail']}" for r in bad]
        raise LayerFailed(
            step.layer, log_path, tail, f"{status} but failed {len(bad)} smoke check(s)"
        )
    for ref in (step.hash_tag, *step.moving_tags):
        engine.tag(image, ref)
    seconds = time.monotonic() - started
    notify(status, step, f"{seconds:.0f}s")
    state.done.append(step.hash)
    state.failed, state.interrupted = None, False
    state.save(ws)
    return Outcome(step.layer, status, seconds, step.hash_tag)


def _build_step(
    step: Step,
    engine: Engine,
    ws: Workspace,
    req: BuildRequest,
    logs: Path,
    state: BuildState,
    wheelhouse: Path | None,
    notify: Progress,
) -> Outcome:
    """Build, smoke-check and tag one step; LayerFailed if any of it fails."""
    log_path = logs / f"{step.layer}.log"
    notify("start", step, str(log_path))
    started = time.monotonic()
    stage = req.iidfile.parent
    try:
        with log_path.open("w") as log:
            stage_context(step, ws.root, stage, wheelhouse)
            try:
                image = engine.build(req, log, on_line=lambda line, s=step: notify("line", s, line))
            except BuildFailed as exc:
                state.failed = step.layer
                state.save(ws)
                log.flush()
                raise LayerFailed(
                    step.layer, log_path, _tail(log_path), f"failed to build ({exc})"
                ) from None
            results = smoke(engine, image, step, log)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return _finish(step, engine, image, results, log_path, state, ws, notify, started, "built")
