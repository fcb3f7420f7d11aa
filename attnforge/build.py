"""Executes a Plan on an engine: stage each layer's context, build, smoke-check, then tag.

Tags move only after a layer is built *and* its smoke checks pass, so an interrupted or broken
build never leaves a hash tag (which would be taken as cached) or a moving tag on a bad image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import smoke_runner
from .engine import BuildFailed, BuildRequest, RunRequest
from .errors import UserError
from .plan import Plan, Step

MANIFEST_NAME = "attnforge-manifest.json"
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


@dataclass
class BuildState:
    invocation: Invocation
    done: list[str] = field(default_factory=list)  # hashes built or found cached
    failed: str | None = None
    interrupted: bool = False

    @staticmethod
    def path(root: Path) -> Path:
        return root / "build" / "state" / "last-build.json"

    def save(self, root: Path) -> None:
        path = self.path(root)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)  # atomic: never a half-written state file

    @classmethod
    def load(cls, root: Path) -> BuildState:
        path = cls.path(root)
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
        )


def labels_for(step: Step) -> dict[str, str]:
    return {
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


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def stage_context(step: Step, root: Path, dest: Path, wheelhouse: Path | None) -> Path:
    """Lay out exactly the hashed files (plus the derived manifest and offered wheels) in dest."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / step.dockerfile, dest / "Dockerfile")
    for cf in step.context:
        _link_or_copy(root / cf.path, dest / cf.path)
    (dest / MANIFEST_NAME).write_text(json.dumps(step.manifest, indent=2, sort_keys=True) + "\n")
    wh = dest / "wheelhouse"
    wh.mkdir(exist_ok=True)  # always there: Dockerfiles bind-mount it
    if step.wheelhouse and wheelhouse:
        for whl in sorted(wheelhouse.glob("*.whl")):
            _link_or_copy(whl, wh / whl.name)
    return dest / "Dockerfile"


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


def smoke(engine: Any, image: str, step: Step, log) -> list[dict[str, Any]]:
    """Run the step's smoke checks in the image; returns one dict per check."""
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


Progress = Callable[[str, Step, str], None]  # (event, step, detail)


def execute(
    plan: Plan,
    engine: Any,
    *,
    root: Path,
    state: BuildState,
    wheelhouse: Path | None = None,
    ca_cert: Path | None = None,
    progress: Progress | None = None,
) -> list[Outcome]:
    """Build every step of the plan in order; raises LayerFailed at the first failure."""
    notify = progress or (lambda event, step, detail: None)
    logs = root / "build" / "logs" / plan.arch
    logs.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    secrets = {"ca": ca_cert} if ca_cert else {}
    for step in plan.steps:
        if not step.runs:
            outcomes.append(Outcome(step.layer, step.status, detail=step.reason))
            continue
        if step.status == "cached":
            image = engine.image_id(step.hash_tag)
            for ref in step.moving_tags:
                if engine.image_id(ref) != image:
                    engine.tag(image, ref)
            notify("cached", step, step.hash_tag)
            outcomes.append(Outcome(step.layer, "cached", tag=step.hash_tag))
            state.done.append(step.hash)
            state.save(root)
            continue

        try:
            outcomes.append(
                _build_step(step, engine, root, logs, state, wheelhouse, secrets, notify)
            )
        except KeyboardInterrupt:
            state.failed, state.interrupted = step.layer, True
            state.save(root)
            raise
    return outcomes


def _build_step(
    step: Step,
    engine: Any,
    root: Path,
    logs: Path,
    state: BuildState,
    wheelhouse: Path | None,
    secrets: dict[str, Path],
    notify: Progress,
) -> Outcome:
    """Build, smoke-check and tag one step; LayerFailed if any of it fails."""
    log_path = logs / f"{step.layer}.log"
    notify("start", step, str(log_path))
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix=f"attnforge-{step.layer}-") as tmp,
        log_path.open("w") as log,
    ):
        ctx = Path(tmp) / "context"
        dockerfile = stage_context(step, root, ctx, wheelhouse)
        req = BuildRequest(
            context=ctx,
            dockerfile=dockerfile,
            build_args={"BASE_IMAGE": step.base_ref, **step.args, **step.hint_args},
            labels=labels_for(step),
            iidfile=Path(tmp) / "iid",
            secrets=secrets,
        )
        try:
            image = engine.build(req, log, on_line=lambda line, s=step: notify("line", s, line))
        except BuildFailed as exc:
            state.failed = step.layer
            state.save(root)
            log.flush()
            raise LayerFailed(
                step.layer, log_path, _tail(log_path), f"failed to build ({exc})"
            ) from None
        results = smoke(engine, image, step, log)
    bad = [r for r in results if not r["ok"]]
    for r in results:
        notify("smoke", step, f"{'ok ' if r['ok'] else 'FAIL'} {r['name']}: {r['detail']}")
    if bad:
        state.failed = step.layer
        state.save(root)
        tail = [f"{r['name']}: {r['detail']}" for r in bad]
        raise LayerFailed(step.layer, log_path, tail, f"built but failed {len(bad)} smoke check(s)")
    for ref in (step.hash_tag, *step.moving_tags):
        engine.tag(image, ref)
    seconds = time.monotonic() - started
    notify("built", step, f"{seconds:.0f}s")
    state.done.append(step.hash)
    state.failed, state.interrupted = None, False
    state.save(root)
    return Outcome(step.layer, "built", seconds, step.hash_tag)
