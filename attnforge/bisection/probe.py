"""`invoke bisect`, the part that touches the world: reading candidates from a git repository or
a package index, and probing one pin (build the stack with it, run the check in the image).

The search itself, the selectors, the verdicts and the state are pure (attnforge/bisection/search.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from contract import names

from ..baseline.gate import bench_file, load_bench
from ..build import (
    BuildState,
    Invocation,
    LayerFailed,
    Outcome,
    build_requests,
    execute,
    plan_build,
)
from ..engine import Engine, RunRequest
from ..errors import UserError
from ..files import swap_folder
from ..pins.update import by_version, fitting
from ..pins.upstream import IndexSource, Unavailable, run_git, url_path
from ..plan import Plan
from ..recipes import Recipes
from ..workspace import Workspace
from .search import (
    BAD,
    GOOD,
    SKIP,
    Candidate,
    CheckSpec,
    Probe,
    short_pin,
    verdict_of_bench,
    verdict_of_exit,
    verdict_of_report,
)

_SHA = re.compile(r"[0-9a-f]{40}")
# How far back a shallow fetch reaches for the good commit before it fetches the whole history.
DEEPEN = (64, 512, 4096)


# ---------------------------------------------------------------------------- git candidates


def local_path(url: str) -> Path | None:
    """The folder of a repository this host can read directly (file:// URL or a path), if any."""
    if url.startswith("file://"):
        path = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    elif "://" not in url:
        path = Path(url)
    else:
        return None
    return path if path.is_dir() else None


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_git(list(args), cwd=repo)


def _last(proc: subprocess.CompletedProcess[str]) -> str:
    """What git said went wrong: its fatal:/error: line (its last line is often advice, such as
    "and the repository exists.", which read alone says the opposite of what happened)."""
    lines = [x.strip() for x in (proc.stderr or proc.stdout).splitlines() if x.strip()]
    said = [x for x in lines if x.startswith(("fatal:", "error:"))]
    return (said or lines or [f"exit {proc.returncode}"])[-1 if not said else 0]


def _has_commit(repo: Path, sha: str) -> bool:
    return _git(repo, "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0


class GitHistory:
    """The commits of one repository between two pins: read from a local repository or mirror
    as it is, or from a remote through a cache repository of commits only (a partial clone with
    --filter=tree:0: no trees, no files), fetched shallow and deepened until the good commit is
    in it."""

    def __init__(self, url: str, *, cache_dir: Path, mirror: Path | None = None) -> None:
        self.url = url
        self.local = mirror or local_path(url)
        self.repo = self.local or cache_dir / url_path(url).with_suffix(".git")

    def describe(self) -> str:
        return str(self.local) if self.local else self.url

    def resolve(self, ref: str, flag: str) -> str:
        """A commit id for a ref (a full id, a tag, a branch or any name git understands)."""
        if self.local is not None:
            proc = _git(self.local, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
            if proc.returncode != 0 or not _SHA.fullmatch(proc.stdout.strip()):
                raise UserError(f"{flag} {ref}: no such commit in {self.local}",
                                hint="give a commit id, tag or branch of that repository")  # fmt: skip
            return proc.stdout.strip()
        if _SHA.fullmatch(ref):
            return ref
        proc = run_git(["ls-remote", self.url, ref, f"{ref}^{{}}"])
        if proc.returncode != 0:
            raise UserError(f"git ls-remote {self.url} failed: {_last(proc)}",
                            hint="check the network, or use --repo with a local mirror")  # fmt: skip
        found = dict(line.split("\t", 1)[::-1] for line in proc.stdout.splitlines() if "\t" in line)
        sha = next((found[k] for k in found if k.endswith("^{}")), None) or next(
            iter(found.values()), None
        )
        if sha is None:
            raise UserError(f"{flag} {ref}: {self.url} has no such branch or tag",
                            hint="give a full 40-digit commit id")  # fmt: skip
        return sha

    def _init_cache(self) -> None:
        if (self.repo / "HEAD").is_file():
            return
        self.repo.mkdir(parents=True, exist_ok=True)
        for args in (["init", "-q", "--bare"], ["remote", "add", "origin", self.url]):
            proc = _git(self.repo, *args)
            if proc.returncode != 0:
                raise UserError(f"cannot set up {self.repo}: {_last(proc)}")

    def _fetch(self, *args: str) -> None:
        proc = _git(self.repo, "fetch", "-q", "--filter=tree:0", *args)
        if proc.returncode != 0:
            raise UserError(f"git fetch {self.url} failed: {_last(proc)}",
                            hint="check the network, or use --repo with a local mirror")  # fmt: skip

    def fetch(self, good: str, bad: str) -> None:
        """Make both commits and the history between them readable (remote repositories only)."""
        if self.local is not None:
            for sha, flag in ((good, "--good"), (bad, "--bad")):
                if not _has_commit(self.local, sha):
                    raise UserError(f"{flag} {sha}: no such commit in {self.local}")
            return
        self._init_cache()
        for depth in DEEPEN:
            if _has_commit(self.repo, bad) and _has_commit(self.repo, good):
                if _git(self.repo, "merge-base", "--is-ancestor", good, bad).returncode == 0:
                    return
            self._fetch(f"--depth={depth}", "origin", bad)
        if (self.repo / "shallow").exists():
            self._fetch("--unshallow", "origin", bad)
        if not _has_commit(self.repo, good):
            self._fetch("--depth=1", "origin", good)

    def between(self, good: str, bad: str) -> list[Candidate]:
        """[good, ..., bad]: the first-parent line from good to bad, oldest first (a merge stands
        for the commits it brought in)."""
        if good == bad:
            raise UserError(
                f"--good and --bad are the same commit ({good[:12]}): nothing to bisect"
            )
        self.fetch(good, bad)
        repo = self.local or self.repo
        if _git(repo, "merge-base", "--is-ancestor", good, bad).returncode != 0:
            backwards = _git(repo, "merge-base", "--is-ancestor", bad, good).returncode == 0
            raise UserError(
                f"--good {good[:12]} is not an ancestor of --bad {bad[:12]}"
                + ("; the bad commit is the older one" if backwards else ""),
                hint="swap --good and --bad" if backwards else "give two commits of one line",
            )
        proc = _git(repo, "log", "--reverse", "--first-parent", "--ancestry-path",
                    "--format=%H%x09%cs %s", f"{good}..{bad}")  # fmt: skip
        if proc.returncode != 0:
            raise UserError(f"git log {good[:12]}..{bad[:12]} failed: {_last(proc)}")
        found = [Candidate(*line.split("\t", 1)) for line in proc.stdout.splitlines() if line]
        head = _git(repo, "log", "-1", "--format=%cs %s", good).stdout.strip()
        return [Candidate(good, head), *found]


# ---------------------------------------------------------------------------- wheel candidates


def _local_family(version: Version) -> str | None:
    """The letters a local label starts with: cpu, cu, rocm (None without a label)."""
    if version.local is None:
        return None
    return re.match(r"[a-z]*", version.local).group(0)


def _date(text: str) -> str:
    m = re.search(r"(20\d{2})(\d{2})(\d{2})", text)
    return f"{m.group(1)}-{m.group(2)}-{m.group(3)}" if m else ""


def _version(flag: str, value: str) -> Version:
    try:
        return Version(value)
    except InvalidVersion:
        raise UserError(
            f"{flag} {value!r}: not a version; a wheel's pin is a PEP 440 version such as 2.11.0"
        ) from None


def wheel_candidates(
    index: IndexSource, index_url: str, project: str, python: str | None, good: str, bad: str
) -> list[Candidate]:
    """[good, ..., bad]: the versions of `project` the index serves between two versions (for
    `python` when known, with the local label family of the good one: +cpu, +rocm...)."""
    g, b = _version("--good", good), _version("--bad", bad)
    if g == b:
        raise UserError(f"--good and --bad are the same version ({good}): nothing to bisect")
    if b < g:
        raise UserError(f"--bad {bad} is older than --good {good}", hint="swap --good and --bad")
    try:
        files = index.files(index_url, project)
    except Unavailable as exc:
        raise UserError(f"cannot read {project}'s versions on {index_url}: {exc}",
                        hint="run where the index is reachable, or pass --offline DIR "
                        "with saved pages (docs/pins.md)") from None  # fmt: skip
    served = fitting(files, project, python) if python else {
        v: fs[0].filename for v, fs in by_version(files, project).items()
    }  # fmt: skip
    family = _local_family(g)
    between = sorted(v for v in served if g < v < b and _local_family(v) == family)
    return [
        Candidate(good, _date(good) or "good"),
        *(Candidate(str(v), _date(str(v)) or served[v]) for v in between),
        Candidate(bad, _date(bad) or "bad"),
    ]


# ---------------------------------------------------------------------------- probing


class ProbeBuildState(BuildState):
    """The state of a probe's build, kept apart from the user's last build, so that `invoke build
    --continue` still resumes the user's own build after a bisect."""

    @staticmethod
    def path(ws: Workspace) -> Path:
        return ws.state_dir / "bisect-probe-build.json"


def without_moving_tags(plan: Plan) -> Plan:
    """Probes tag content tags only: the stack's moving tags (attnforge/<stack>:<arch>) stay on
    the user's own build, not on whichever pin was probed last."""
    return replace(plan, steps=tuple(replace(s, moving_tags=()) for s in plan.steps))


@dataclass
class Prober:
    """Builds the stack with one pin and runs the check in its image; the evidence lands in
    `reports/<arch>/<stack>/bisect/<layer>/<pin>/` (probe.json, plus the check's report)."""

    ws: Workspace
    recipes: Recipes
    engine: Engine
    invocation: Invocation  # every probe's build options, the other --set overrides included
    layer: str
    key: str
    check: CheckSpec
    run_flags: dict[str, Any]  # devices, groups, extra run flags for the arch
    expect: dict[str, Any] | None = None  # kind validate: the stack's expectations document
    progress: Callable[[str, Any, str], None] | None = None
    on_line: Callable[[str], None] | None = None

    def evidence_dir(self, pin: str) -> Path:
        return self.ws.reports_for(self.invocation.arch, self.invocation.stack) / "bisect" / self.layer / short_pin(pin)  # fmt: skip

    def probe(self, pin: str) -> Probe:
        started = time.monotonic()
        inv = replace(
            self.invocation, sets=[*self.invocation.sets, f"{self.layer}.{self.key}={pin}"]
        )
        final = self.evidence_dir(pin)
        work = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            build, image, failure = self._build(inv, work)
            if failure:
                verdict, reason = SKIP, failure
            else:
                verdict, reason = self._check(image, work)
            result = Probe(pin, verdict, reason, str(final), build,
                           round(time.monotonic() - started, 1),
                           time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip
            (work / "probe.json").write_text(json.dumps(
                {"kind": names.BISECT_PROBE, "version": names.KIND_VERSIONS[names.BISECT_PROBE], "layer": self.layer,
                 "key": self.key, "pin": pin, "check": self.check.selector,
                 "command": list(self.check.argv), "image": image, **result.__dict__},
                indent=2) + "\n")  # fmt: skip
            # the evidence of an earlier probe of this pin is replaced only by a complete one
            swap_folder(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return result

    def _build(self, inv: Invocation, work: Path) -> tuple[dict[str, str], str, str]:
        """(layer -> outcome, final image id, why the pin cannot be judged or '')."""
        plan, _ = plan_build(inv, self.recipes, self.ws, self.engine)
        if plan.blocked_by:
            first = plan.blocked_by[0]
            raise UserError(f"stack {plan.stack} cannot be built for {plan.arch}: layer "
                            f"{first.layer} is unsupported: {first.reason}")  # fmt: skip
        plan = without_moving_tags(plan)
        chain = [s.layer for s in plan.chain]
        requests = build_requests(plan, self.ws, Path(inv.ca_cert) if inv.ca_cert else None)
        outcomes: list[Outcome] = []
        try:
            outcomes = execute(
                plan, self.engine, ws=self.ws, state=ProbeBuildState(inv), requests=requests,
                wheelhouse=Path(inv.wheelhouse) if inv.wheelhouse else None,
                progress=self.progress,
            )  # fmt: skip
        except LayerFailed as exc:
            if chain.index(exc.layer) < chain.index(self.layer):
                raise UserError(
                    f"layer {exc.layer}, below the bisected layer {self.layer}, failed: that does "
                    f"not depend on the pin, so no probe can tell good from bad; log: {exc.log}",
                    hint=f"build the stack first (invoke build --arch {inv.arch} --stack "
                    f"{inv.stack}) and fix what fails",
                ) from None
            if exc.log.is_file():
                shutil.copy2(exc.log, work / f"build-{exc.layer}.log")
            build = {layer: ("failed" if layer == exc.layer else "") for layer in chain}
            for layer in chain[: chain.index(exc.layer)]:
                build[layer] = "cached" if plan.step(layer).status == "cached" else "built"
            first_line = exc.message.split(";", 1)[0]
            return {k: v or "not run" for k, v in build.items()}, "", first_line
        build = {o.layer: o.status for o in outcomes if o.layer in chain}
        final = plan.chain[-1]
        return build, self.engine.image_id(final.hash_tag) or final.hash_tag, ""

    def _check(self, image: str, work: Path) -> tuple[str, str]:
        spec = self.check
        if self.expect is not None:
            (work / "expect.json").write_text(json.dumps(self.expect, indent=2) + "\n")
        req = RunRequest(
            image=image, command=list(spec.argv), devices=self.run_flags["devices"],
            groups=self.run_flags["groups"], extra=self.run_flags["extra"],
            env={"ATTNFORGE_ENGINE": self.engine.describe()},
            mounts=[(work.resolve(), "/out", False)],
        )  # fmt: skip
        log_path = work / "check.log"
        with log_path.open("w") as log:
            code = self.engine.run_streaming(req, log, on_line=self.on_line)
        if spec.kind == "cmd":
            return verdict_of_exit("cmd", code)
        doc = work / spec.output
        if not doc.is_file():
            return SKIP, f"{spec.kind} wrote no {spec.output} (exit {code}); see {log_path.name}"
        if spec.kind == "check":
            return verdict_of_report(json.loads(doc.read_text()), spec.globs)
        if code == 2:
            raise UserError(f"the check {spec.selector!r} was refused as a usage error in the "
                            f"image; see {log_path}")  # fmt: skip
        if spec.kind == "bench":  # judged against the baseline, whatever the exit status
            baseline = load_bench(spec.baseline)
            shutil.copy2(bench_file(spec.baseline), work / "baseline-bench.json")
            return verdict_of_bench(baseline, json.loads(doc.read_text()), spec.gates)
        return verdict_of_exit(spec.kind, code)


def verdict_word(verdict: str) -> str:
    return {GOOD: "good", BAD: "bad", SKIP: "skip"}[verdict]


def read_doc(folder: str, names: tuple[str, ...]) -> dict[str, Any] | None:
    """The first of `names` found in a probe's folder, parsed; None when absent or damaged."""
    for name in names:
        path = Path(folder) / name
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except (OSError, ValueError):
                return None
    return None
