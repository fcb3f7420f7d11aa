#!/usr/bin/env python3
"""Idempotent, all-or-nothing patch series for upstream source trees: a thin layer on git apply.

A series is a folder ``patches/<component>/<series>/`` holding ``NNNN-name.patch`` files
(``git diff`` or ``git format-patch`` output) and a ``series.json``. The tree itself is the
truth, no stamp file is trusted: the longest prefix of the series that reverse-applies is
already in the tree (skip), the rest must apply (apply); anything else is a conflict that
writes nothing and names the patch, the file and the hunk.

The planner copies this very file into image build contexts, where the image's python3
(stdlib only, 3.8+) runs it; every image that patches a tree has git::

    python3 patches.py {check,apply,status} [--component C] --src DIR SERIES_DIR [...]

Exit status: 0 ok, 1 conflict or failure, 2 usage.

git runs cut off from its surroundings: ``GIT_DIR`` names an empty folder, so git finds no
repository around or in the tree (inside an unrelated repository ``git apply`` silently skips
every file) and reads no repository config and no ``.gitattributes``; ``HOME`` and
``XDG_CONFIG_HOME`` point at that folder, ``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL`` and
``GIT_ATTR_NOSYSTEM`` shut out user and system config and attributes, and
``-c core.autocrlf=false -c apply.whitespace=nowarn`` pins the rest. Verdicts come from
replaying the patches one by one in a scratch copy of the files they touch (``git apply -R``
does not chain two patches of one file given in one input); the tree is then written by one
``git apply`` of every pending patch concatenated, which checks them all before it writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

SERIES_FILE = "series.json"
PATCH_NAME_RE = re.compile(r"^(\d{4})-[A-Za-z0-9][A-Za-z0-9._-]*\.patch$")
EXTRA_FILES = ("README.md",)  # what a series folder may hold besides its patches
APPLIED, PENDING, CONFLICT = "applied", "pending", "conflict"  # already in / applies / neither
_REQUIRED = ("component", "summary", "upstream", "links", "checked_against")
_OPTIONAL = ("drop_when", "notes", "selftest", "ledger")  # ledger: attnforge/patch_ledger.py
_SHAPES = {
    "component": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "upstream": (
        lambda v: (
            isinstance(v, dict)
            and isinstance(v.get("repo"), str)
            and isinstance(v.get("refs"), list)
        ),
        '{"repo": "<url>", "refs": ["<ref>", ...]}',
    ),
    "links": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list"),
    "checked_against": (lambda v: isinstance(v, dict), "an object: patch file -> commit"),
}
_UNSUPPORTED = re.compile(
    rb"^(?:(?:index \S+|(?:new|deleted) file mode|(?:old|new) mode) 160000"
    rb"|(?:rename|copy) from .*)\r?$",
    re.M,
)
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_FAILED = re.compile(r"^error: patch failed: (.*):(\d+)$", re.M)
_DIFF_OPTIONS = ("--no-renames", "--binary", "--no-ext-diff", "--no-color", "--no-textconv")


class PatchError(Exception):
    """A user-facing error about a series, a patch or a source tree; str() is the message."""


class PatchConflict(PatchError):
    """A patch neither applies nor is already applied; nothing was written."""

    def __init__(self, message: str, results: Sequence[PatchResult] = ()) -> None:
        super().__init__(message)
        self.results = list(results)


@dataclasses.dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    data: bytes
    files: tuple[str, ...]  # the paths it touches, as git apply --numstat reads them


@dataclasses.dataclass(frozen=True)
class Series:
    path: Path
    name: str
    component: str
    summary: str
    upstream_repo: str
    upstream_refs: tuple[str, ...]
    links: tuple[str, ...]
    checked_against: dict[str, str]
    patches: tuple[Patch, ...]
    drop_when: str = ""

    @property
    def label(self) -> str:
        return f"{self.component}/{self.name}"


@dataclasses.dataclass(frozen=True)
class PatchResult:
    series: str  # "<component>/<series>"
    patch: str  # file name
    state: str  # APPLIED, PENDING or CONFLICT, before this run touched the patch
    files: tuple[str, ...]
    written: bool = False  # this run wrote the patch into the tree
    detail: str = ""

    @property
    def action(self) -> str:
        """What apply does (or did) with this patch."""
        return {APPLIED: "skip", PENDING: "apply", CONFLICT: "conflict"}[self.state]


class _Git:
    """git apply, cut off from every repository, config and attributes file around it."""

    def __init__(self, tmp: str) -> None:
        self.tmp, self.stages = Path(tmp), 0
        self.empty = self.tmp / "empty"
        self.empty.mkdir()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        self.env.update(GIT_DIR=str(self.empty), HOME=str(self.empty))
        self.env.update(XDG_CONFIG_HOME=str(self.empty), GIT_CONFIG_GLOBAL=os.devnull)
        self.env.update(GIT_CONFIG_NOSYSTEM="1", GIT_ATTR_NOSYSTEM="1")

    def run(self, cwd: Path, data: bytes, *args: str) -> subprocess.CompletedProcess:
        command = ["git", "-c", "core.autocrlf=false", "-c", "apply.whitespace=nowarn", "apply"]
        try:
            return subprocess.run(
                [*command, *args, "-"], cwd=str(cwd), input=data, env=self.env,
                capture_output=True, check=False,
            )  # fmt: skip
        except FileNotFoundError:
            raise PatchError("git is not on PATH; patches are applied with `git apply`.") from None

    def apply(self, cwd: Path, patches: Sequence[Patch], *args: str) -> tuple[bool, str]:
        data = b"".join(p.data + (b"" if p.data.endswith(b"\n") else b"\n") for p in patches)
        proc = self.run(cwd, data, "-v", *args)
        return proc.returncode == 0, proc.stderr.decode("utf-8", "replace")

    def stage(self, src: Path, paths: Sequence[str]) -> Path:
        """A scratch copy of the tree's files at paths, or of what blocks them (a file or a
        link where a path needs a folder), so that a replay there fails where the tree would."""
        self.stages += 1
        work = self.tmp / f"stage{self.stages}"
        work.mkdir()
        for rel in paths:
            for part in [*reversed(list(Path(rel).parents)[:-1]), Path(rel)]:
                source, target = src / part, work / part
                if os.path.islink(source) or source.is_file():
                    if not os.path.lexists(target):
                        target.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(source, target, follow_symlinks=False)
                    break
        return work


def load_patch(path: Path) -> Patch:
    """Read one patch file; check that git apply reads it and that it stays inside the tree."""
    path, name = Path(path), Path(path).name
    data = path.read_bytes()
    bad = _UNSUPPORTED.search(data)
    if bad:
        raise PatchError(
            f"{path}: {bad.group(0).decode('utf-8', 'replace').strip()!r}: submodule bumps, "
            "renames and copies are not supported; patch the files inside a submodule, and "
            "make patches with `git diff --no-renames`."
        )
    with tempfile.TemporaryDirectory(prefix="attnforge-patches-") as tmp:
        git = _Git(tmp)
        proc = git.run(git.empty, data, "--numstat", "-z")
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise PatchError(f"{path}: git apply cannot read it as a patch: {err}")
    entries = [e.split(b"\t", 2) for e in proc.stdout.split(b"\0") if e.count(b"\t") >= 2]
    files = tuple(e[2].decode("utf-8", "surrogateescape") for e in entries)
    for rel in files:
        parts = rel.split("/")
        if rel.startswith("/") or ".." in parts or ".git" in parts:
            raise PatchError(f"{name}: refuses to touch the path {rel!r} (outside the tree).")
    return Patch(name, path, data, files)


def load_series(path: Path, component: str | None = None) -> Series:
    """Load and check a series folder as a build would; with component, refuse another one's."""
    path = Path(path)
    meta_path = path / SERIES_FILE
    if not path.is_dir():
        raise PatchError(f"Patch series folder {path} does not exist.")
    if not meta_path.is_file():
        raise PatchError(f"{path} is not a patch series: it has no {SERIES_FILE}.")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise PatchError(f"{meta_path}: not valid JSON ({exc}).") from None
    if not isinstance(meta, dict):
        raise PatchError(f"{meta_path}: the top level must be an object.")
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise PatchError(f"{meta_path}: missing field(s) {', '.join(missing)}.")
    unknown = sorted(set(meta) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        valid = ", ".join(_REQUIRED + _OPTIONAL)
        raise PatchError(f"{meta_path}: unknown field(s) {', '.join(unknown)}; valid: {valid}.")
    for key, (fits, shape) in _SHAPES.items():
        if not fits(meta[key]):
            raise PatchError(f"{meta_path}: field {key} must be {shape}.")
    if component is not None and meta["component"] != component:
        raise PatchError(
            f"Series {path} is for component {meta['component']!r} (its {SERIES_FILE}), "
            f"not {component!r}: it would patch the wrong source tree."
        )
    names = sorted(p.name for p in path.iterdir() if p.is_file())
    patches = [n for n in names if n != SERIES_FILE and n not in EXTRA_FILES]
    bad = [n for n in patches if not PATCH_NAME_RE.match(n)]
    if bad:
        raise PatchError(
            f"{path}: file(s) {', '.join(bad)} are not named NNNN-name.patch; a series folder "
            f"holds only {SERIES_FILE}, {', '.join(EXTRA_FILES)} and NNNN-name.patch files."
        )
    numbers = [n[:4] for n in patches]
    dupes = sorted({n for n in numbers if numbers.count(n) > 1})
    if dupes:
        raise PatchError(f"{path}: two patches share the number(s) {', '.join(dupes)}.")
    if not patches:
        raise PatchError(f"{path}: the series has no NNNN-name.patch file.")
    checked = meta["checked_against"]
    unchecked, orphans = [n for n in patches if n not in checked], sorted(set(checked) - {*patches})
    if unchecked or orphans:
        raise PatchError(
            f"{meta_path}: checked_against must name exactly the series' patches "
            f"(missing: {', '.join(unchecked) or '-'}; unknown: {', '.join(orphans) or '-'})."
        )
    return Series(
        path=path,
        name=path.name,
        component=meta["component"],
        summary=str(meta["summary"]),
        upstream_repo=meta["upstream"]["repo"],
        upstream_refs=tuple(str(r) for r in meta["upstream"]["refs"]),
        links=tuple(meta["links"]),
        checked_against={str(k): str(v) for k, v in checked.items()},
        patches=tuple(load_patch(path / n) for n in patches),
        drop_when=str(meta.get("drop_when", "")),
    )


def _hunks(data: bytes) -> dict[str, list[tuple[int, int, str]]]:
    """Each file's hunk headers, in order: (old start, new start, header line)."""
    lines = [x.decode("utf-8", "replace").rstrip("\r") for x in data.split(b"\n")]
    out: dict[str, list[tuple[int, int, str]]] = {}
    path = ""
    for i, line in enumerate(lines):
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:].split("\t")[0], lines[i + 1][4:].split("\t")[0]
            path = (old if new == "/dev/null" else new).split("/", 1)[-1]
        m = _HUNK.match(line)
        if m and path:
            out.setdefault(path, []).append((int(m.group(1)), int(m.group(2)), line))
    return out


def _conflict(git: _Git, work: Path, series: Series, patch: Patch, src: Path, done, said) -> str:
    """Why patch does not apply to the scratch tree, hunk by hunk, and where to look."""
    if "error: patch failed" in said:  # a hunk failed: name every failing hunk, not the first
        said = git.apply(work, [patch], "--check", "--reject")[1]
    rev = git.apply(work, [patch], "-R", "--check", "--reject")[1]
    not_undone = set(_FAILED.findall(rev))  # (path, new start) of the hunks -R cannot undo
    hunks = _hunks(patch.data)
    out = [f"Patch {patch.name} of series {series.label} does not apply to {src}."]
    drifted = present = 0
    for path, line in _FAILED.findall(said):
        found = [(k, h) for k, h in enumerate(hunks.get(path, []), 1) if h[0] == int(line)]
        number, (_, new_start, header) = found[0] if found else (0, (0, 0, f"at line {line}"))
        inside = bool(found) and (path, str(new_start)) not in not_undone
        present, drifted = present + inside, drifted + (not inside)
        why = "already in the tree" if inside else "matches neither the old nor the new text"
        out += [f"  file: {path}", f"  hunk #{number} ({header}): {why}."]
    lines = [x for x in said.strip().splitlines() if not x.startswith(("Checking", "Hunk #"))]
    out += ["  git apply says:"] + [f"    {x}".rstrip() for x in lines[:40]]
    out += ["    ..."] * (len(lines) > 40)
    if drifted:
        how = "partly applied and drifted" if present else "drifted"
        out.append(f"The tree looks {how}: upstream changed the source where this patch edits it.")
    elif present and "error" not in rev:
        out.append("It is already in the tree, but an earlier patch is not (applied out of order).")
    elif present:
        out.append("The tree looks partly applied: some of its hunks are in it, others are not.")
    first = f" ({', '.join(done)} would have been applied first)" if done else ""
    out.append(f"Nothing was written{first}; the tree is byte-identical to before.")
    out.append(f"The series is for {series.upstream_repo} at {', '.join(series.upstream_refs)}.")
    if series.checked_against.get(patch.name):
        out.append(f"{patch.name} was checked against {series.checked_against[patch.name]}.")
    if series.links:
        out.append("Upstream links: " + " ".join(series.links))
    out.append("Check whether upstream fixed this (then drop the patch) or regenerate it on the "
               "new source (invoke patches.new).")  # fmt: skip
    return "\n".join(out)


def _offsets(stderr: str) -> int:
    return sum(abs(int(n)) for n in re.findall(r"\(offset (-?\d+) lines?\)", stderr))


def _plan(git: _Git, series_list: Sequence[Series], src: Path, stop: bool) -> tuple:
    """Each patch's state, the first conflict's message ("" if none), the pending patches."""
    items = [(s, p) for s in series_list for p in s.patches]
    paths = sorted({f for _, p in items for f in p.files})
    applied = 0  # the longest prefix that reverse-applies, undone last patch first
    for n in range(len(items), 0, -1):
        work = git.stage(src, paths)
        if all(git.apply(work, [items[k][1]], "-R")[0] for k in reversed(range(n))):
            applied = n
            break
    results = [PatchResult(s.label, p.name, APPLIED, p.files) for s, p in items[:applied]]
    message, done = "", []
    if applied:  # if the top patch also applies, the closer fit wins and a tie is unsafe
        s, top = items[applied - 1]
        forward, fwd = git.apply(src, [top], "--check")
        rev = git.apply(src, [top], "-R", "--check")[1]
        if forward and _offsets(fwd) < _offsets(rev):
            applied -= 1
            results.pop()
        elif forward and _offsets(fwd) == _offsets(rev):
            message = (
                f"Patch {top.name} of series {s.label} both applies and reverse-applies to "
                f"{src}, equally well: its text occurs more than once, so the tree cannot say "
                "whether it is already applied. Nothing was written. Give the patch more "
                "context lines (git diff -U6) so it matches one place only."
            )
            results[-1] = PatchResult(s.label, top.name, CONFLICT, top.files, False, message)
            if stop:
                return results, message, done
    work = git.stage(src, paths)
    for s, patch in items[applied:]:
        ok, said = git.apply(work, [patch])
        if ok:
            results.append(PatchResult(s.label, patch.name, PENDING, patch.files))
            done.append(patch)
            continue
        detail = _conflict(git, work, s, patch, src, [p.name for p in done], said)
        results.append(PatchResult(s.label, patch.name, CONFLICT, patch.files, False, detail))
        message = message or detail
        if stop:
            break
    return results, message, done


def _run(series_list: Sequence[Series], src: Path, component: str | None, mode: str) -> list:
    src = Path(src)
    if not src.is_dir():
        raise PatchError(f"Source tree {src} does not exist or is not a folder.")
    for series in series_list:
        if component is not None and series.component != component:
            raise PatchError(
                f"Series {series.path} is for component {series.component!r} (its "
                f"{SERIES_FILE}), not {component!r}: it would patch the wrong source tree."
            )
    with tempfile.TemporaryDirectory(prefix="attnforge-patches-") as tmp:
        git = _Git(tmp)
        results, message, pending = _plan(git, series_list, src, stop=mode != "status")
        if message and mode != "status":
            raise PatchConflict(message, results)
        if mode != "apply" or not pending:
            return results
        ok, err = git.apply(src, pending)  # checks every patch before it writes any
        if not ok:
            raise PatchConflict(f"git apply refused the series on {src}:\n{err.strip()}", results)
    return [dataclasses.replace(r, written=r.state == PENDING) for r in results]


def check(series_list: Sequence[Series], src: Path, component: str | None = None) -> list:
    """What apply would do, per patch; raises PatchConflict (writing nothing) on a conflict."""
    return _run(series_list, src, component, "check")


def status(series_list: Sequence[Series], src: Path, component: str | None = None) -> list:
    """The state of every patch (applied, pending, conflict); never raises on a conflict."""
    return _run(series_list, src, component, "status")


def apply(series_list: Sequence[Series], src: Path, component: str | None = None) -> list:
    """Apply every pending patch, all or nothing; raises PatchConflict on a conflict."""
    return _run(series_list, src, component, "apply")


def _dev_git(src: Path, *args: str, index: str = "") -> bytes:
    """git in a developer's checkout (for new_patch), with their config; index: a scratch one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_INDEX_FILE": index} if index else {})
    try:
        proc = subprocess.run(["git", "-C", str(src), *args], env=env, capture_output=True)
    except FileNotFoundError:
        raise PatchError("git is needed to make a new patch, and it is not on PATH.") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise PatchError(f"git {' '.join(args[:2])} failed in {src}: {err}")
    return proc.stdout


def new_patch(component: str, series: str, src: Path, name: str, patches_root: Path) -> Path:
    """Turn a git checkout's uncommitted change into the series' next numbered patch.

    The series' existing patches must already be applied in src; the new patch holds only
    what src changes beyond them, and gets a header naming the commit it was made on.
    """
    src = Path(src).resolve()
    if not src.is_dir():
        raise PatchError(f"Source tree {src} does not exist or is not a folder.")
    top = Path(_dev_git(src, "rev-parse", "--show-toplevel").decode().strip()).resolve()
    if top != src:
        raise PatchError(f"{src} is not the top of its git checkout ({top} is); pass --src {top}.")
    head = _dev_git(src, "rev-parse", "HEAD").decode().strip()
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:60]
    if not slug:
        raise PatchError(f"Patch name {name!r} has no letters or digits.")
    folder = Path(patches_root) / component / series
    existing = load_series(folder, component) if folder.exists() else None
    if existing is not None:
        not_applied = [r.patch for r in status([existing], src) if r.state != APPLIED]
        if not_applied:
            raise PatchError(
                f"Patches {', '.join(not_applied)} of {component}/{series} are not applied in "
                f"{src}; apply the series first so the new patch is made on top of it."
            )
    with tempfile.TemporaryDirectory(prefix="attnforge-patches-") as tmp:
        index = str(Path(tmp, "index"))  # HEAD + the series, then the work tree: the user's
        _dev_git(src, "read-tree", "HEAD", index=index)  # own index stays untouched
        for patch in existing.patches if existing else ():
            _dev_git(src, "apply", "--cached", str(patch.path.resolve()), index=index)
        base = _dev_git(src, "write-tree", index=index).decode().strip()
        _dev_git(src, "add", "-A", index=index)
        body = _dev_git(src, "diff", "--cached", *_DIFF_OPTIONS, "--src-prefix=a/",
                        "--dst-prefix=b/", base, index=index)  # fmt: skip
    if not body:
        raise PatchError(
            f"{src} has no uncommitted change beyond the series' existing patches; edit the "
            "source first, then run new."
        )
    numbers = [int(p.name[:4]) for p in existing.patches] if existing else []
    target = folder / f"{max(numbers, default=0) + 1:04d}-{slug}.patch"
    header = (
        f"From: attnforge patches new\nSubject: [PATCH] {name}\n\n"
        f"Series {component}/{series}, made on {head}.\n"
        "Say here why the change is needed and link the upstream issue or PR.\n---\n"
    )
    folder.mkdir(parents=True, exist_ok=True)
    target.write_bytes(header.encode() + body)
    meta_path = folder / SERIES_FILE
    if meta_path.exists():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    else:
        try:
            remote = _dev_git(src, "remote", "get-url", "origin").decode().strip()
        except PatchError:
            remote = "TODO: upstream repository URL"
        meta = {
            "component": component,
            "summary": "TODO: what this series fixes and why.",
            "upstream": {"repo": remote, "refs": [head]},
            "links": [],
            "checked_against": {},
        }
    meta.setdefault("checked_against", {})[target.name] = head
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    load_series(folder, component)  # what was written must load
    return target


_WORDS = {
    "status": {APPLIED: "already applied", PENDING: "not applied"},
    "apply": {APPLIED: "skipped (already applied)", PENDING: "applied"},
    "check": {APPLIED: "would skip (already applied)", PENDING: "would apply"},
}


def format_results(results: Sequence[PatchResult], command: str) -> str:
    """One line per patch, for people and build logs."""
    return "\n".join(
        f"{r.series} {r.patch}: {_WORDS[command].get(r.state, 'CONFLICT')} [{', '.join(r.files)}]"
        for r in results
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="patches.py", description="Check, apply or show idempotent patch series."
    )
    parser.add_argument("command", choices=("check", "apply", "status"))
    parser.add_argument("--src", required=True, help="source tree to patch")
    parser.add_argument("--component", help="refuse series for another component")
    parser.add_argument("series", nargs="+", metavar="SERIES_DIR")
    args = parser.parse_args(argv)
    try:
        series_list = [load_series(Path(p), args.component) for p in args.series]
        results = _run(series_list, Path(args.src), None, args.command)
    except PatchConflict as exc:
        if exc.results[:-1]:
            print("before the conflict (nothing written):", file=sys.stderr)
            print(format_results(exc.results[:-1], "check"), file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except PatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_results(results, args.command))
    conflicts = [r.detail for r in results if r.state == CONFLICT]
    for detail in conflicts:
        print(f"error: {detail}", file=sys.stderr)
    return 1 if conflicts else 0


if __name__ == "__main__":
    sys.exit(main())
