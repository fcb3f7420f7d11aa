"""`invoke bisect`, the pure part: which pin broke a check, found by binary search over pins.

The candidates are an ordered list of pins, oldest first: the commits of a source layer between
a good and a bad commit, or the versions of a wheel between a good and a bad version. The first is
taken as good and the last as bad (as `git bisect` takes them; `verify_ends` probes them
first). Each probe builds the stack with one pin and runs a check on the image; its verdict is
good, bad or skip (the pin could not be judged: its build failed). The next probe is the untested
candidate nearest the middle of the range still in doubt, so n candidates take about log2(n)
probes; skipped candidates are gone around, and when only skipped ones are left the result names
every pin that could be the first bad one, as `git bisect` does.

Also pure: the check selectors (what a probe runs in the image and how its outcome becomes a
verdict) and the evidence (what differs between the last good and the first bad probe's
reports). The state lives in one JSON file, written aside and renamed after every probe, so an
interrupt never leaves it half-written and re-running the same command continues the bisect.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contract import names

from ..baseline.gate import (
    DEFAULT_MIN_RATIO,
    BaselineError,
    Gate,
    compare,
    median_ms,
    parse_gate,
    ratio_text,
)
from ..errors import UserError
from ..files import write_aside

GOOD, BAD, SKIP = "good", "bad", "skip"
VERDICTS = (GOOD, BAD, SKIP)
STATE_KIND = names.BISECT
STATE_VERSION = names.KIND_VERSIONS[STATE_KIND]


class BisectError(UserError):
    """The bisect cannot go on as asked (the ends contradict the check, verdicts disagree)."""

    exit_code = 1


@dataclass(frozen=True)
class Candidate:
    """One pin to try: a commit or a version, with what a person recognises it by."""

    pin: str
    label: str = ""  # commit: date and subject; wheel: the date in its version, or a file name


@dataclass
class Probe:
    """What one probe found."""

    pin: str
    verdict: str  # good | bad | skip
    reason: str  # one sentence: the check's outcome, or why the pin could not be judged
    report: str = ""  # the probe's folder of evidence (reports/<arch>/<stack>/bisect/...)
    build: dict[str, str] = field(default_factory=dict)  # layer -> built/cached/failed/...
    seconds: float = 0.0
    at: str = ""  # ISO 8601 time it finished


# ---------------------------------------------------------------------------- the search


@dataclass(frozen=True)
class Outcome:
    """Where a bisect stands: running (next is the index to probe), found, or ambiguous."""

    status: str  # running | found | ambiguous
    next: int | None = None
    last_good: int | None = None
    first_bad: int | None = None
    could_be: tuple[int, ...] = ()  # ambiguous: every index that may be the first bad one


def expected_probes(n_candidates: int) -> int:
    """Probes a bisect of this many candidates (both ends included) takes without skips:
    ceil(log2(n)) for the n pins after the good one."""
    steps = n_candidates - 1
    return math.ceil(math.log2(steps)) if steps > 1 else 0


def _index(candidates: Sequence[Candidate], verdicts: Mapping[str, str]) -> dict[int, str]:
    where = {c.pin: i for i, c in enumerate(candidates)}
    unknown = [p for p in verdicts if p not in where]
    if unknown:
        raise BisectError(f"a verdict names {unknown[0]}, which is not among the candidates")
    bad_verdicts = [v for v in verdicts.values() if v not in VERDICTS]
    if bad_verdicts:
        raise BisectError(f"unknown verdict {bad_verdicts[0]!r}; valid: {', '.join(VERDICTS)}")
    return {where[p]: v for p, v in verdicts.items()}


def decide(
    candidates: Sequence[Candidate], verdicts: Mapping[str, str], *, verify_ends: bool = False
) -> Outcome:
    """The next pin to probe, or the result. `verdicts`: pin -> good/bad/skip so far."""
    n = len(candidates)
    if n < 2:
        raise BisectError("a bisect needs a good and a bad pin that differ")
    seen = _index(candidates, verdicts)
    good_pin, bad_pin = candidates[0].pin, candidates[-1].pin
    if verify_ends:
        for end, wanted in ((0, GOOD), (n - 1, BAD)):
            if end not in seen:
                return Outcome("running", next=end)
            if seen[end] != wanted:
                pin = candidates[end].pin
                what = {
                    (GOOD, BAD): f"the good pin {pin} fails the check: it is not good",
                    (BAD, GOOD): f"the bad pin {pin} passes the check: there is nothing to find",
                }.get((wanted, seen[end]), f"the {wanted} pin {pin} could not be judged (skip)")
                raise BisectError(what)
    goods = [i for i, v in seen.items() if v == GOOD]
    bads = [i for i, v in seen.items() if v == BAD]
    lo = max([0, *goods])
    hi = min([n - 1, *bads])
    if lo >= hi:
        raise BisectError(
            f"the verdicts contradict each other: {candidates[lo].pin} is good but the older "
            f"{candidates[hi].pin} is bad (is the check flaky?); good end {good_pin}, "
            f"bad end {bad_pin}"
        )
    open_ = [i for i in range(lo + 1, hi) if i not in seen]
    if open_:
        middle = (lo + hi) / 2
        return Outcome("running", next=min(open_, key=lambda i: (abs(i - middle), i)), last_good=lo,
                       first_bad=hi)  # fmt: skip
    if hi == lo + 1:
        return Outcome("found", last_good=lo, first_bad=hi)
    return Outcome("ambiguous", last_good=lo, first_bad=hi, could_be=tuple(range(lo + 1, hi + 1)))


def run(
    candidates: Sequence[Candidate],
    judge: Callable[[str], str],
    verdicts: Mapping[str, str] | None = None,
    *,
    verify_ends: bool = False,
    max_probes: int | None = None,
) -> tuple[Outcome, list[str]]:
    """Bisect with a verdict function (for tests and simple callers): (outcome, pins probed)."""
    known = dict(verdicts or {})
    probed: list[str] = []
    while True:
        outcome = decide(candidates, known, verify_ends=verify_ends)
        if outcome.status != "running" or (max_probes is not None and len(probed) >= max_probes):
            return outcome, probed
        pin = candidates[outcome.next].pin
        known[pin] = judge(pin)
        probed.append(pin)


# ---------------------------------------------------------------------------- check selectors


@dataclass(frozen=True)
class CheckSpec:
    """What a probe runs in the image (`argv`, with the probe's folder mounted at /out) and how
    its outcome becomes a verdict."""

    selector: str  # as the user wrote it
    kind: str  # check | validate | stress | bench | cmd
    argv: tuple[str, ...]
    globs: tuple[str, ...] = ()  # kind check: the check ids that decide
    output: str = ""  # the document it writes under /out (report.json, stress-<w>.json)
    gates: tuple[Gate, ...] = ()  # kind bench: what must keep its speed ...
    baseline: str = ""  # ... against this bench.json (the stack's kept baseline)


@dataclass(frozen=True)
class Selector:
    kind: str
    syntax: str
    meaning: str
    make: Callable[[str, Mapping[str, Any]], CheckSpec] | None  # None: not available yet
    unavailable: str = ""


def _suite_argv(globs: Sequence[str], opts: Mapping[str, Any], expect: bool) -> list[str]:
    argv = ["python3", "-m", "validate", "all", "--json", "/out/report.json",
            "--md", "/out/report.md"]  # fmt: skip
    if expect:
        argv += ["--expect", "/out/expect.json"]
    for glob in globs:
        argv += ["--only", glob]
    if opts.get("quick"):
        argv.append("--quick")
    if opts.get("timeout"):
        argv += ["--timeout", str(opts["timeout"])]
    return argv


def _check(text: str, opts: Mapping[str, Any]) -> CheckSpec:
    globs = tuple(g.strip() for g in text.split(",") if g.strip())
    if not globs:
        raise UserError("check: needs a check id or glob, e.g. check:sdpa.case.* or check:env")
    return CheckSpec(f"check:{text}", "check", tuple(_suite_argv(globs, opts, expect=False)),
                     globs=globs, output="report.json")  # fmt: skip


def _validate(text: str, opts: Mapping[str, Any]) -> CheckSpec:
    if text:
        raise UserError(f"validate takes nothing after it, not {text!r}; to choose checks use "
                        "check:GLOB")  # fmt: skip
    return CheckSpec("validate", "validate", tuple(_suite_argv((), opts, expect=True)),
                     output="report.json")  # fmt: skip


# what `stress:WORKLOAD,key=value` may set, and the flag of `python -m validate stress` it becomes
STRESS_KEYS = {
    "iters": "--iters", "backend": "--backend", "check-every": "--check-every",
    "resolution": "--resolution", "shape": "--shape", "dtype": "--dtype", "timeout": "--timeout",
    "tiny": "--tiny", "serialize": "--serialize",
}  # fmt: skip
STRESS_FLAGS = {"tiny", "serialize"}
STRESS_DEFAULT_ITERS = "20"
_WORD = re.compile(r"[A-Za-z0-9._x+-]+")


def _stress(text: str, opts: Mapping[str, Any]) -> CheckSpec:
    workload, *rest = text.split(",")
    if not _WORD.fullmatch(workload or ""):
        raise UserError("stress: needs a workload, e.g. stress:sd15 or stress:llm,iters=50,tiny "
                        "(python -m validate stress --help lists them)")  # fmt: skip
    given: dict[str, str] = {}
    for item in rest:
        key, eq, value = item.partition("=")
        key = key.strip()
        if key not in STRESS_KEYS:
            raise UserError(f"stress: has no setting {key!r}; valid: {', '.join(STRESS_KEYS)}")
        if key in STRESS_FLAGS:
            if eq:
                raise UserError(f"stress: {key} is a flag and takes no value")
        elif not eq or not _WORD.fullmatch(value.strip()):
            raise UserError(f"stress: {key} needs a value of letters, digits and . _ x + -, "
                            f"e.g. {key}=1")  # fmt: skip
        given[key] = value.strip()
    given.setdefault("iters", STRESS_DEFAULT_ITERS)
    given.setdefault("backend", "all")
    if opts.get("timeout") and "timeout" not in given:
        given["timeout"] = str(opts["timeout"])
    output = f"stress-{workload}.json"
    argv = ["python3", "-m", "validate", "stress", "--workload", workload,
            "--json", f"/out/{output}"]  # fmt: skip
    for key, value in given.items():
        argv += [STRESS_KEYS[key]] if key in STRESS_FLAGS else [STRESS_KEYS[key], value]
    return CheckSpec(f"stress:{text}", "stress", tuple(argv), output=output)


def _bench(text: str, opts: Mapping[str, Any]) -> CheckSpec:
    """python -m validate bench for the gate's backend and mode, at the size and repeats of the
    baseline it is judged against (opts: baseline = path, baseline_doc = its bench document)."""
    try:
        gate = parse_gate(text)
    except BaselineError as exc:
        raise UserError(f"bench: {exc}; e.g. bench:kernels,mode=fwd,min_ratio=0.9") from None
    doc = opts.get("baseline_doc")
    if not doc:
        raise UserError("bench: needs a baseline to hold each pin to, and this arch and stack "
                        "has none kept",
                        hint="run `invoke validate --bench` on a good build first: its passing "
                        "run is kept as reports/<arch>/<stack>/baseline/")  # fmt: skip
    argv = ["python3", "-m", "validate", "bench", "--json", "/out/bench.json"]
    if not any(c in gate.backend for c in "*?["):
        argv += ["--backend", gate.backend]
    if gate.mode != "all":
        argv += ["--mode", gate.mode]
    if doc.get("size") in ("tiny", "quick"):
        argv.append(f"--{doc['size']}")
    if doc.get("size") == "tiny" and doc.get("quick"):
        argv.append("--quick")  # the baseline's one-shape tiny sweep (`validate --quick --bench`)
    if doc.get("repeats"):
        argv += ["--repeats", str(doc["repeats"])]
    if opts.get("timeout"):
        argv += ["--timeout", str(opts["timeout"])]
    return CheckSpec(f"bench:{text}", "bench", tuple(argv), output="bench.json", gates=(gate,),
                     baseline=str(opts.get("baseline") or ""))  # fmt: skip


def _cmd(text: str, opts: Mapping[str, Any]) -> CheckSpec:
    if not text.strip():
        raise UserError("cmd: needs a shell command, e.g. cmd:'python3 -c \"import flash_attn\"'")
    argv: tuple[str, ...] = ("sh", "-c", text)
    if opts.get("timeout"):  # coreutils timeout(1) exits 124 and takes the command down with it
        argv = ("timeout", str(opts["timeout"]), *argv)
    return CheckSpec(f"cmd:{text}", "cmd", argv)


SELECTORS = {
    s.kind: s
    for s in (
        Selector("check", "check:GLOB[,GLOB...]",
                 "the validation checks whose id matches (python -m validate all --only GLOB); "
                 "bad if any of them fails, crashes or times out", _check),
        Selector("validate", "validate",
                 "the whole suite with the stack's expectations, as `invoke validate` runs it; "
                 "bad if it exits non-zero", _validate),
        Selector("stress", "stress:WORKLOAD[,iters=N,backend=NAME,tiny,...]",
                 "python -m validate stress at a workload's shapes; bad if a run fails, crashes "
                 "or hangs", _stress),
        Selector("bench", "bench:BACKEND[,shape=GLOB,mode=MODE,min_ratio=R]",
                 "python -m validate bench for that backend; bad if a result the gate matches "
                 "runs below min_ratio (default 0.9) of the kept baseline's speed", _bench),
        Selector("cmd", "cmd:SHELL COMMAND",
                 "a shell command in the image; exit 0 good, 125 skip (as git bisect run), "
                 "anything else bad", _cmd),
    )
}  # fmt: skip


def parse_check(text: str, **opts: Any) -> CheckSpec:
    """A --check selector -> what to run; UserError with the valid kinds for a bad one."""
    kind, colon, rest = text.partition(":")
    kind = kind.strip()
    if kind not in SELECTORS:
        valid = "; ".join(s.syntax for s in SELECTORS.values())
        raise UserError(f"--check {text!r}: unknown kind {kind!r}; valid: {valid}",
                        hint="docs/bisect.md explains each kind")  # fmt: skip
    selector = SELECTORS[kind]
    if selector.make is None:
        raise UserError(f"--check {text!r}: {selector.unavailable}")
    if kind != "validate" and not colon:
        raise UserError(f"--check {text!r}: expected {selector.syntax}")
    return selector.make(rest, opts)


# ---------------------------------------------------------------------------- verdicts

FAILED_STATUSES = names.FAILING  # what a check must not end as (contract/names.py)
CMD_SKIP = 125  # `git bisect run`: "the current source code cannot be tested"; docker run's own
CMD_TIMEOUT = 124  # timeout(1)


def verdict_of_exit(kind: str, code: int) -> tuple[str, str]:
    """(verdict, reason) from a probe command's exit status (cmd, validate, stress)."""
    if kind == "cmd":
        if code == 0:
            return GOOD, "the command exited 0"
        if code == CMD_SKIP:
            return SKIP, f"the command exited {CMD_SKIP}: it could not test this pin"
        if code == CMD_TIMEOUT:
            return BAD, f"the command exited {CMD_TIMEOUT}: it ran past --timeout (a hang)"
        return BAD, f"the command exited {code}" + (
            f" (killed by signal {code - 128})" if code > 128 else ""
        )
    if code == 0:
        return GOOD, f"{kind} passed (exit 0)"
    if code == 1:
        return BAD, f"{kind} failed (exit 1)"
    return SKIP, f"{kind} could not run (exit {code})"


def verdict_of_bench(
    baseline: Mapping[str, Any], now: Mapping[str, Any], gates: Sequence[Gate]
) -> tuple[str, str]:
    """(verdict, reason) from a probe's bench.json against the baseline's: bad when a gated
    result is below its threshold (or no longer runs); skip when no gated result was timed."""
    doc = compare(baseline, now, gates, DEFAULT_MIN_RATIO)
    if doc["failures"]:
        more = f" (and {len(doc['failures']) - 1} more)" if len(doc["failures"]) > 1 else ""
        return BAD, doc["failures"][0] + more
    gated = [r for r in doc["rows"] if r["verdict"] == "pass"]
    if not gated:
        return SKIP, (f"no result matching {', '.join(g.describe() for g in gates)} was timed "
                      "in both the baseline and this probe")  # fmt: skip
    worst = min(gated, key=lambda r: r["ratio"])
    return GOOD, (f"{len(gated)} gated result(s) at or above the threshold (slowest "
                  f"{ratio_text(worst['ratio'])}: {worst['backend']} {worst['shape']} {worst['mode']})")  # fmt: skip


def verdict_of_report(report: Mapping[str, Any], globs: Sequence[str]) -> tuple[str, str]:
    """(verdict, reason) from a validation report: bad when a check matching `globs` failed,
    crashed or timed out; skip when none of them ran."""
    matched = [
        c for c in report.get("checks", [])
        if any(fnmatch.fnmatchcase(str(c.get("id", "")), g) for g in globs)
    ]  # fmt: skip
    if not matched:
        return SKIP, f"no check matching {', '.join(globs)} ran"
    failed = [c for c in matched if c.get("status") in FAILED_STATUSES]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        message = str(first.get("message", "")).strip().splitlines()
        said = f": {message[0][:160]}" if message else ""
        return BAD, f"{first['id']} {first['status']}{said}{more}"
    return GOOD, f"{len(matched)} matching check(s) passed or skipped"


# ---------------------------------------------------------------------------- evidence


def report_rows(good: Mapping[str, Any] | None, bad: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:  # fmt: skip
    """(what, last good, first bad) rows for the two probes' documents, the differences only
    (plus the overall status): validation reports by check id, stress documents by backend."""
    good, bad = good or {}, bad or {}
    rows: list[tuple[str, str, str]] = []
    if "checks" in good or "checks" in bad:
        status = lambda doc: str(doc.get("summary", {}).get("status", "-"))  # noqa: E731
        rows.append(("summary", status(good), status(bad)))
        before = {c["id"]: c for c in good.get("checks", [])}
        after = {c["id"]: c for c in bad.get("checks", [])}
        for cid in sorted(set(before) | set(after)):
            b, a = before.get(cid, {}), after.get(cid, {})
            if b.get("status") != a.get("status"):
                rows.append((cid, _said(b), _said(a)))
    elif "results" in good or "results" in bad:  # bench documents: each result's median time
        before = {(r["backend"], r["shape"]["name"], r["mode"]): r for r in good.get("results", [])}
        after = {(r["backend"], r["shape"]["name"], r["mode"]): r for r in bad.get("results", [])}
        for key in sorted(set(before) | set(after)):
            rows.append((" ".join(key), _timed(before.get(key)), _timed(after.get(key))))
    elif "runs" in good or "runs" in bad:
        before = {r["backend"]: r for r in good.get("runs", [])}
        after = {r["backend"]: r for r in bad.get("runs", [])}
        for backend in sorted(set(before) | set(after)):
            b, a = before.get(backend, {}), after.get(backend, {})
            if b.get("status") != a.get("status") or b.get("first_failure") != a.get("first_failure"):  # fmt: skip
                rows.append((backend, _run_said(b), _run_said(a)))
    return rows


def _said(check: Mapping[str, Any]) -> str:
    if not check:
        return "(not run)"
    message = str(check.get("message", "")).strip().splitlines()
    return f"{check.get('status')}" + (f": {message[0][:100]}" if message else "")


def _timed(result: Mapping[str, Any] | None) -> str:
    if not result:
        return "(not run)"
    ms = median_ms(result)
    return f"{ms:.4g} ms" if ms is not None else str(result.get("status"))


def _run_said(run_: Mapping[str, Any]) -> str:
    if not run_:
        return "(not run)"
    failure = run_.get("first_failure")
    if failure:
        return (
            f"{run_.get('status')} at iteration {failure.get('iteration')}: {failure.get('kind')}"
        )
    return str(run_.get("status"))


# ---------------------------------------------------------------------------- state


def short_pin(pin: str) -> str:
    """A folder-safe short name of a pin: a commit's first 12 digits, a version as it is."""
    if re.fullmatch(r"[0-9a-f]{40}", pin):
        return pin[:12]
    return re.sub(r"[^A-Za-z0-9._+-]", "_", pin)


def state_path(state_dir: Path, arch: str, stack: str, layer: str) -> Path:
    return state_dir / f"bisect-{arch}-{stack}-{layer}.json"


@dataclass
class BisectState:
    """One bisect: the question (what is bisected, between which pins, by which check) and the
    probes done so far. Saved after every probe; `question` decides whether a re-run continues it."""

    arch: str
    stack: str
    layer: str
    key: str  # the pin that varies: SOURCE_REF, TORCH_VERSION ...
    good: str
    bad: str
    check: str
    candidates: list[Candidate]
    sets: list[str] = field(default_factory=list)  # the other --set overrides of every probe
    verify_ends: bool = False
    source: str = ""  # where the candidates were read: a repository or an index page
    probes: list[Probe] = field(default_factory=list)
    in_progress: str | None = None  # the pin being probed (an interrupt leaves it here)
    created: str = ""
    updated: str = ""

    def question(self) -> dict[str, Any]:
        return {
            "arch": self.arch, "stack": self.stack, "layer": self.layer, "key": self.key,
            "good": self.good, "bad": self.bad, "check": self.check, "sets": list(self.sets),
            "verify_ends": self.verify_ends,
        }  # fmt: skip

    def verdicts(self) -> dict[str, str]:
        return {p.pin: p.verdict for p in self.probes}

    def probe_of(self, pin: str) -> Probe | None:
        return next((p for p in self.probes if p.pin == pin), None)

    def outcome(self) -> Outcome:
        return decide(self.candidates, self.verdicts(), verify_ends=self.verify_ends)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {"kind": STATE_KIND, "version": STATE_VERSION, **data}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BisectState:
        if data.get("kind") != STATE_KIND or data.get("version") != STATE_VERSION:
            raise ValueError(f"not a {STATE_KIND} version {STATE_VERSION} document")
        fields = {k: v for k, v in data.items() if k not in ("kind", "version")}
        fields["candidates"] = [Candidate(**c) for c in fields["candidates"]]
        fields["probes"] = [Probe(**p) for p in fields.get("probes", [])]
        return cls(**fields)

    def save(self, path: Path) -> None:
        """Write aside, then rename: an interrupt leaves the old state or the new, never half."""
        write_aside(path, json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> BisectState | None:
        """The recorded bisect, None when there is none; UserError for a damaged file."""
        if not path.is_file():
            return None
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise UserError(f"{path}: the recorded bisect cannot be read ({exc})",
                            hint="start over with --reset") from None  # fmt: skip


def differences(recorded: Mapping[str, Any], asked: Mapping[str, Any]) -> list[str]:
    """How the recorded bisect's question differs from the one asked now, one clause each."""
    return [
        f"{key} {_shown(recorded.get(key))} (recorded) vs {_shown(asked.get(key))} (now)"
        for key in asked
        if recorded.get(key) != asked.get(key)
    ]


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return shlex.quote(str(value)) if isinstance(value, str) else str(value)
