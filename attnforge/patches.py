#!/usr/bin/env python3
"""Idempotent, all-or-nothing patch series for upstream source trees.

A series is a folder ``patches/<component>/<series>/`` holding ``NNNN-name.patch`` files
(unified diffs or ``git format-patch`` output) and a ``series.json``. For each patch the
tree itself is the truth, no stamp file is trusted:

- the patch reverse-applies cleanly -> already applied, skip;
- it applies cleanly -> apply;
- neither -> conflict: nothing is written, the error names the patch, the file and the hunk.

This module is stdlib-only and runs on Python 3.8+, because the planner copies this very
file into image build contexts and runs it in a ``RUN`` step::

    python3 patches.py {check,apply,status} [--component C] --src DIR SERIES_DIR [...]

Exit status: 0 ok, 1 conflict or failure, 2 usage.

Why a built-in applier instead of ``git apply`` or GNU ``patch``: build images do not
always carry git or patch; ``git apply`` silently skips every file when run in a
subdirectory of an unrelated repository, and its result depends on the repository's
config (core.autocrlf, .gitattributes eol, apply.whitespace); ``patch -N`` exits 1 both
for "already applied" and for a real failure. The applier here has git apply's default
semantics (exact context, no fuzz, hunks may move by any offset, a hunk anchored at the
start or end of a file must match there), works on bytes (CRLF files stay CRLF), reads
new/deleted files and mode changes from git headers, and evaluates a whole run in memory
first, so a conflict leaves the tree byte-identical to before. The tests cross-check its
verdicts against ``git apply --check``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional, Tuple  # noqa: UP035 - see FileState

SERIES_FILE = "series.json"
PATCH_NAME_RE = re.compile(r"^(\d{4})-[A-Za-z0-9][A-Za-z0-9._-]*\.patch$")
# Files a series folder may hold besides its patches.
EXTRA_FILES = ("README.md",)

# Patch states, as seen on the tree before this patch is considered.
APPLIED = "applied"  # reverse-applies cleanly: already in the tree
PENDING = "pending"  # applies cleanly: not yet in the tree
CONFLICT = "conflict"  # neither

_SERIES_KEYS_REQUIRED = ("component", "summary", "upstream", "links", "checked_against")
_SERIES_KEYS_OPTIONAL = ("drop_when", "notes", "selftest")


class PatchError(Exception):
    """A user-facing error about a series, a patch or a source tree; str() is the message."""


class PatchConflict(PatchError):
    """A patch neither applies nor reverse-applies; nothing was written."""

    def __init__(self, message: str, results: Sequence[PatchResult] = ()) -> None:
        super().__init__(message)
        self.results = list(results)


# --------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Hunk:
    header: str
    old_start: int
    new_start: int
    old: tuple[bytes, ...]  # lines with their terminators
    new: tuple[bytes, ...]
    leading: int  # context lines before the first change
    trailing: int  # context lines after the last change

    def reversed(self) -> Hunk:
        return Hunk(
            self.header,
            self.new_start,
            self.old_start,
            self.new,
            self.old,
            self.leading,
            self.trailing,
        )


@dataclasses.dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None: the file is created
    new_path: str | None  # None: the file is deleted
    hunks: tuple[Hunk, ...]
    old_mode: str | None = None
    new_mode: str | None = None

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or "?"

    def reversed(self) -> FilePatch:
        return FilePatch(
            self.new_path,
            self.old_path,
            tuple(h.reversed() for h in self.hunks),
            self.new_mode,
            self.old_mode,
        )


@dataclasses.dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    files: tuple[FilePatch, ...]

    def reversed(self) -> Patch:
        return Patch(self.name, self.path, tuple(f.reversed() for f in reversed(self.files)))


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


# File state in the overlay: (content, executable) or None when absent. Evaluated at run
# time, so spelled the typing way to keep Python 3.8 working.
FileState = Optional[Tuple[bytes, bool]]  # noqa: UP006, UP045


# --------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------

_HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_HEADER_PREFIXES = (
    b"old mode ",
    b"new mode ",
    b"deleted file mode ",
    b"new file mode ",
    b"index ",
    b"similarity index ",
    b"dissimilarity index ",
    b"rename from ",
    b"rename to ",
    b"copy from ",
    b"copy to ",
)


def _split_lines(data: bytes) -> list[bytes]:
    """Split at b"\\n" only, keeping terminators; a b"\\r" stays part of its line."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _text(line: bytes) -> str:
    return line.rstrip(b"\r\n").decode("utf-8", "surrogateescape")


def _unquote(path: str) -> str:
    if not (len(path) >= 2 and path[0] == '"' and path[-1] == '"'):
        return path
    raw = path[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
    return raw.encode("latin-1").decode("utf-8", "surrogateescape")


def _header_path(field: str) -> str | None:
    """Path from a ---/+++ line body, with one leading component stripped (-p1)."""
    field = field.split("\t", 1)[0].rstrip()
    field = _unquote(field)
    if field == "/dev/null":
        return None
    if "/" in field:
        field = field.split("/", 1)[1]
    return field


def _git_line_path(rest: str) -> str | None:
    """The path of a 'diff --git a/X b/X' line whose two names are equal."""
    if rest.startswith('"'):
        end = rest.find('" ', 1)
        if end > 0:
            return _header_path(rest[: end + 1])
    n = len(rest)
    if rest.startswith("a/") and (n - 5) % 2 == 0:
        length = (n - 5) // 2
        first, second = rest[2 : 2 + length], rest[5 + length :]
        if rest[2 + length : 5 + length] == " b/" and first == second:
            return first
    return None


def parse_patch(data: bytes, name: str = "<patch>") -> tuple[FilePatch, ...]:
    """Parse a unified diff or git format-patch text into file patches."""
    lines = _split_lines(data)
    files: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(b"diff --git "):
            i, fp = _parse_git_file(lines, i, name)
            files.append(fp)
        elif line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
            old = _header_path(_text(line)[4:])
            new = _header_path(_text(lines[i + 1])[4:])
            if old is not None and new is not None and old != new:
                old = new  # `diff -u f.orig f`: a plain diff edits the file in place
            i, hunks = _parse_hunks(lines, i + 2, name, new or old or "?")
            files.append(FilePatch(old, new, hunks))
        elif line.startswith((b"GIT binary patch", b"Binary files ")):
            raise PatchError(f"{name}: binary patches are not supported.")
        else:
            i += 1
    if not files:
        raise PatchError(
            f"{name}: no file changes found; a patch must be a unified diff or "
            "git format-patch output."
        )
    for fp in files:
        for p in (fp.old_path, fp.new_path):
            if p is not None:
                _check_relpath(p, name)
    return tuple(files)


def _parse_git_file(lines: list[bytes], i: int, name: str) -> tuple[int, FilePatch]:
    rest = _text(lines[i])[len("diff --git ") :]
    path = _git_line_path(rest)
    i += 1
    old_mode = new_mode = None
    created = deleted = False
    while i < len(lines) and lines[i].startswith(_GIT_HEADER_PREFIXES):
        text = _text(lines[i])
        if text.startswith(("rename ", "copy ", "similarity", "dissimilarity")):
            raise PatchError(
                f"{name}: renames and copies are not supported ({text!r}); "
                "regenerate the patch with `git diff --no-renames`."
            )
        if text.endswith(" 160000"):
            raise PatchError(
                f"{name}: {path} is a git submodule; a series cannot move a submodule's "
                "commit. Patch the submodule's files (paths inside it) instead."
            )
        if text.startswith("new file mode "):
            created, new_mode = True, text.rsplit(" ", 1)[1]
        elif text.startswith("deleted file mode "):
            deleted, old_mode = True, text.rsplit(" ", 1)[1]
        elif text.startswith("old mode "):
            old_mode = text.rsplit(" ", 1)[1]
        elif text.startswith("new mode "):
            new_mode = text.rsplit(" ", 1)[1]
        i += 1
    if i < len(lines) and lines[i].startswith((b"GIT binary patch", b"Binary files ")):
        raise PatchError(f"{name}: binary patches are not supported ({path}).")
    hunks: tuple[Hunk, ...] = ()
    old_path: str | None = path
    new_path: str | None = path
    if i + 1 < len(lines) and lines[i].startswith(b"--- ") and lines[i + 1].startswith(b"+++ "):
        old_path = _header_path(_text(lines[i])[4:])
        new_path = _header_path(_text(lines[i + 1])[4:])
        i, hunks = _parse_hunks(lines, i + 2, name, new_path or old_path or "?")
    if created:
        old_path = None
    if deleted:
        new_path = None
    if old_path is None and new_path is None:
        raise PatchError(f"{name}: cannot tell which file a 'diff --git' section is for.")
    if not hunks and not (created or deleted or (old_mode and new_mode)):
        raise PatchError(f"{name}: the section for {path} changes nothing.")
    return i, FilePatch(old_path, new_path, hunks, old_mode, new_mode)


def _parse_hunks(lines: list[bytes], i: int, name: str, path: str) -> tuple[int, tuple[Hunk, ...]]:
    hunks: list[Hunk] = []
    while i < len(lines) and lines[i].startswith(b"@@ "):
        m = _HUNK_RE.match(lines[i])
        if not m:
            raise PatchError(f"{name}: malformed hunk header for {path}: {_text(lines[i])!r}")
        header = _text(lines[i])
        old_start, new_start = int(m.group(1)), int(m.group(3))
        old_left = int(m.group(2)) if m.group(2) is not None else 1
        new_left = int(m.group(4)) if m.group(4) is not None else 1
        old: list[bytes] = []
        new: list[bytes] = []
        kinds: list[str] = []
        i += 1
        while old_left > 0 or new_left > 0 or (i < len(lines) and lines[i][:1] == b"\\"):
            if i >= len(lines):
                raise PatchError(f"{name}: hunk {header} of {path} is truncated.")
            line = lines[i]
            tag, body = line[:1], line[1:]
            if line == b"\n":  # an editor stripped the space of an empty context line
                tag, body = b" ", b"\n"
            if tag == b"\\":
                _strip_newline(kinds, old, new)
            elif tag == b" " and old_left > 0 and new_left > 0:
                old.append(body)
                new.append(body)
                kinds.append(" ")
                old_left -= 1
                new_left -= 1
            elif tag == b"-" and old_left > 0:
                old.append(body)
                kinds.append("-")
                old_left -= 1
            elif tag == b"+" and new_left > 0:
                new.append(body)
                kinds.append("+")
                new_left -= 1
            else:
                raise PatchError(
                    f"{name}: hunk {header} of {path} does not match its line counts "
                    f"(at patch line {i + 1}: {_text(line)[:60]!r})."
                )
            i += 1
        leading = len(kinds) - len("".join(kinds).lstrip(" "))
        trailing = len(kinds) - len("".join(kinds).rstrip(" "))
        hunks.append(Hunk(header, old_start, new_start, tuple(old), tuple(new), leading, trailing))
    return i, tuple(hunks)


def _strip_newline(kinds: list[str], old: list[bytes], new: list[bytes]) -> None:
    """Apply a '\\ No newline at end of file' marker to the line before it."""
    if not kinds:
        return
    kind = kinds[-1]
    if kind in (" ", "-") and old and old[-1].endswith(b"\n"):
        old[-1] = old[-1][:-1]
    if kind in (" ", "+") and new and new[-1].endswith(b"\n"):
        new[-1] = new[-1][:-1]


def _check_relpath(path: str, name: str) -> None:
    parts = path.replace("\\", "/").split("/")
    if path.startswith("/") or ".." in parts or not path or ".git" in parts:
        raise PatchError(f"{name}: refuses to touch the path {path!r} (outside the tree).")


def load_patch(path: Path) -> Patch:
    """Read and parse one patch file."""
    path = Path(path)
    return Patch(path.name, path, parse_patch(path.read_bytes(), path.name))


# --------------------------------------------------------------------------------------
# Series
# --------------------------------------------------------------------------------------


def series_files(path: Path) -> list[Path]:
    """Every file of a series folder, in a stable order: series.json, then the patches.

    The planner hashes these bytes (plus this module's own bytes) into a layer's key.
    """
    path = Path(path)
    patches = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(".patch"))
    extras = sorted(p for p in path.iterdir() if p.is_file() and p.name in EXTRA_FILES)
    return [path / SERIES_FILE] + extras + patches


ENGINE_FILE = Path(__file__).resolve()


def load_series(path: Path, component: str | None = None) -> Series:
    """Load and check a series folder; with component, refuse a series for another one."""
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
    missing = [k for k in _SERIES_KEYS_REQUIRED if k not in meta]
    if missing:
        raise PatchError(f"{meta_path}: missing field(s) {', '.join(missing)}.")
    unknown = sorted(set(meta) - set(_SERIES_KEYS_REQUIRED) - set(_SERIES_KEYS_OPTIONAL))
    if unknown:
        valid = ", ".join(_SERIES_KEYS_REQUIRED + _SERIES_KEYS_OPTIONAL)
        raise PatchError(f"{meta_path}: unknown field(s) {', '.join(unknown)}; valid: {valid}.")
    upstream = meta["upstream"]
    if (
        not isinstance(upstream, dict)
        or not isinstance(upstream.get("repo"), str)
        or not isinstance(upstream.get("refs"), list)
    ):
        raise PatchError(
            f'{meta_path}: field upstream must be {{"repo": "<url>", "refs": ["<ref>", ...]}}.'
        )
    if not isinstance(meta["links"], list) or not all(isinstance(x, str) for x in meta["links"]):
        raise PatchError(f"{meta_path}: field links must be a list of URLs.")
    checked = meta["checked_against"]
    if not isinstance(checked, dict):
        raise PatchError(f"{meta_path}: field checked_against must map patch file -> commit.")
    if not isinstance(meta["component"], str) or not meta["component"]:
        raise PatchError(f"{meta_path}: field component must be a non-empty string.")
    if component is not None and meta["component"] != component:
        raise PatchError(
            f"Series {path} is for component {meta['component']!r} (its {SERIES_FILE}), "
            f"not {component!r}: it would patch the wrong source tree."
        )

    names = sorted(p.name for p in path.iterdir() if p.is_file())
    stray = [n for n in names if n != SERIES_FILE and n not in EXTRA_FILES]
    bad = [n for n in stray if not PATCH_NAME_RE.match(n)]
    if bad:
        raise PatchError(
            f"{path}: file(s) {', '.join(bad)} are not named NNNN-name.patch; a series folder "
            f"holds only {SERIES_FILE}, {', '.join(EXTRA_FILES)} and NNNN-name.patch files."
        )
    numbers = [n[:4] for n in stray]
    dupes = sorted({n for n in numbers if numbers.count(n) > 1})
    if dupes:
        raise PatchError(f"{path}: two patches share the number(s) {', '.join(dupes)}.")
    if not stray:
        raise PatchError(f"{path}: the series has no NNNN-name.patch file.")
    unchecked = [n for n in stray if n not in checked]
    orphans = sorted(set(checked) - set(stray))
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
        upstream_repo=upstream["repo"],
        upstream_refs=tuple(str(r) for r in upstream["refs"]),
        links=tuple(meta["links"]),
        checked_against={str(k): str(v) for k, v in checked.items()},
        patches=tuple(load_patch(path / n) for n in stray),
        drop_when=str(meta.get("drop_when", "")),
    )


# --------------------------------------------------------------------------------------
# Applying in memory
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Failure:
    path: str
    reason: str
    hunk: Hunk | None = None
    hunk_number: int = 0
    closest: str = ""


class _Overlay:
    """A view of the tree with this run's changes held in memory."""

    def __init__(self, read: Callable[[str], FileState]) -> None:
        self._read = read
        self.changes: dict[str, FileState] = {}

    def get(self, path: str) -> FileState:
        if path in self.changes:
            return self.changes[path]
        return self._read(path)

    def update(self, changes: dict[str, FileState]) -> None:
        self.changes.update(changes)


def _disk_reader(src: Path) -> Callable[[str], FileState]:
    def read(path: str) -> FileState:
        full = src / path
        if full.is_symlink():
            raise PatchError(f"{full} is a symbolic link; patches do not follow links.")
        if not full.is_file():
            if full.exists():
                raise PatchError(f"{full} is not a regular file.")
            return None
        mode = full.stat().st_mode
        return full.read_bytes(), bool(mode & stat.S_IXUSR)

    return read


def _find(lines: list[bytes], old: Sequence[bytes], expected: int, hunk: Hunk) -> int | None:
    n, m = len(lines), len(old)
    if m > n:
        return None
    # git apply's rules: a hunk starting at line 0 or 1 must match at the start of the
    # file, a hunk without trailing context must match at its end.
    match_beginning = hunk.old_start <= 1
    match_end = hunk.trailing == 0
    last = n - m
    if match_beginning and match_end:
        candidates: Sequence[int] = [0] if n == m else []
    elif match_beginning:
        candidates = [0]
    elif match_end:
        candidates = [last]
    else:
        expected = min(max(expected, 0), last)
        candidates = [expected]
        for d in range(1, max(expected, last - expected) + 1):
            if expected - d >= 0:
                candidates.append(expected - d)
            if expected + d <= last:
                candidates.append(expected + d)
    old_list = list(old)
    for pos in candidates:
        if lines[pos : pos + m] == old_list:
            return pos
    return None


def _closest(lines: list[bytes], old: Sequence[bytes], expected: int) -> str:
    """Describe where the file comes closest to a hunk's expected lines."""
    if not old or not lines:
        return ""
    best, best_pos = -1, 0
    m = len(old)
    for pos in range(0, max(len(lines) - m, 0) + 1):
        window = lines[pos : pos + m]
        score = sum(1 for k in range(len(window)) if window[k] == old[k])
        if score > best or (score == best and abs(pos - expected) < abs(best_pos - expected)):
            best, best_pos = score, pos
    if best <= 0:
        return "none of its lines are in the file"
    found = lines[best_pos : best_pos + m]
    out = [f"closest place: line {best_pos + 1}, {best} of {m} lines agree; the file has:"]
    for k, have in enumerate(found):
        mark = " " if old[k] == have else "!"
        out.append(f"    {mark}| {_show(have)}")
    return "\n".join(out)


def _show(line: bytes) -> str:
    text = line.decode("utf-8", "replace")
    if text.endswith("\r\n"):
        return text[:-2] + "\\r"
    return text.rstrip("\n")


def _apply_hunks(
    content: bytes, fp: FilePatch, moved: list[int]
) -> tuple[bytes | None, _Failure | None]:
    """Apply a file's hunks; add to moved how far each landed from where the patch says."""
    lines = _split_lines(content)
    offset = 0
    nominal = 0  # the line shift the patch's own earlier hunks cause
    for number, hunk in enumerate(fp.hunks, 1):
        base = hunk.old_start if not hunk.old else hunk.old_start - 1
        expected = base + offset
        pos = _find(lines, hunk.old, expected, hunk)
        if pos is None:
            return None, _Failure(
                fp.path,
                "the lines it expects are not in the file",
                hunk,
                number,
                _closest(lines, hunk.old, expected),
            )
        lines[pos : pos + len(hunk.old)] = list(hunk.new)
        moved.append(abs(pos - base - nominal))
        offset = pos - base + len(hunk.new) - len(hunk.old)
        nominal += len(hunk.new) - len(hunk.old)
    return b"".join(lines), None


def _mode_exec(mode: str | None) -> bool | None:
    if not mode:
        return None
    return bool(int(mode, 8) & 0o100)


def _apply_file(
    fp: FilePatch, state: FileState, moved: list[int] | None = None
) -> tuple[FileState, _Failure | None]:
    if fp.old_path is None:  # creation
        if state is not None:
            return None, _Failure(fp.path, "the patch creates it, but it already exists")
        content = b"".join(line for h in fp.hunks for line in h.new)
        return (content, bool(_mode_exec(fp.new_mode))), None
    if state is None:
        return None, _Failure(fp.path, "the file does not exist")
    content, executable = state
    if fp.new_path is None:  # deletion
        expected = b"".join(line for h in fp.hunks for line in h.old)
        if content != expected:
            return None, _Failure(
                fp.path, "the patch deletes it, but its content differs from the patch's"
            )
        return None, None
    old_exec, new_exec = _mode_exec(fp.old_mode), _mode_exec(fp.new_mode)
    if old_exec is not None and new_exec is not None and old_exec != new_exec:
        if executable != old_exec:
            return None, _Failure(fp.path, f"its mode is not {fp.old_mode}")
        executable = new_exec
    new_content, failure = _apply_hunks(content, fp, [] if moved is None else moved)
    if failure is not None:
        return None, failure
    return (new_content if new_content is not None else content, executable), None


def _try_patch(
    patch: Patch, tree: _Overlay, moved: list[int] | None = None
) -> tuple[dict[str, FileState] | None, list[_Failure]]:
    """Apply a patch to the overlay's view; return the changes or every failing file."""
    changes: dict[str, FileState] = {}
    failures: list[_Failure] = []
    moved = [] if moved is None else moved
    for fp in patch.files:
        path = fp.old_path or fp.new_path or "?"
        state = changes[path] if path in changes else tree.get(path)
        result, failure = _apply_file(fp, state, moved)
        if failure is not None:
            failures.append(failure)
            continue
        if fp.old_path and fp.new_path and fp.old_path != fp.new_path:
            changes[fp.old_path] = None
        changes[fp.new_path or fp.old_path or "?"] = result
    return (None, failures) if failures else (changes, [])


def _diagnose(patch: Patch, tree: _Overlay) -> str:
    """Say whether a conflicting patch looks drifted or partly applied."""
    present = pending = neither = 0
    for fp in patch.files:
        state = tree.get(fp.old_path or fp.new_path or "?")
        if fp.old_path is None or fp.new_path is None or not fp.hunks:
            ok_fwd = _apply_file(fp, state)[1] is None
            ok_rev = _apply_file(fp.reversed(), state)[1] is None
            present += ok_rev and not ok_fwd
            pending += ok_fwd and not ok_rev
            neither += not ok_fwd and not ok_rev
            continue
        if state is None:
            neither += len(fp.hunks) or 1
            continue
        lines = _split_lines(state[0])
        for hunk in fp.hunks:
            base = hunk.old_start - 1
            ok_fwd = _find(lines, hunk.old, base, hunk) is not None
            ok_rev = _find(lines, hunk.new, hunk.new_start - 1, hunk.reversed()) is not None
            present += ok_rev and not ok_fwd
            pending += ok_fwd and not ok_rev
            neither += not ok_fwd and not ok_rev
    if neither and present:
        return (
            f"The tree looks partly applied and drifted: {present} hunk(s) are already in "
            f"it, {neither} match neither the original nor the patched text."
        )
    if neither:
        return (
            f"The tree looks drifted: {neither} hunk(s) match neither the original nor the "
            "patched text, so the upstream source changed where this patch edits it."
        )
    if present and pending:
        return (
            f"The tree looks partly applied: {present} hunk(s) are already in it and "
            f"{pending} are not (an interrupted or hand-made application)."
        )
    return "Each hunk matches on its own, but not all of them together (overlapping edits)."


def _conflict_message(
    series: Series,
    patch: Patch,
    failures: list[_Failure],
    tree: _Overlay,
    done: list[str],
    src: Path,
) -> str:
    out = [f"Patch {patch.name} of series {series.label} does not apply to {src}."]
    for failure in failures:
        out.append(f"  file: {failure.path}")
        if failure.hunk is not None:
            out.append(f"  hunk #{failure.hunk_number} ({failure.hunk.header}): {failure.reason}.")
            out.append("  it expects:")
            for line in failure.hunk.old[:12]:
                out.append(f"     | {_show(line)}")
            if len(failure.hunk.old) > 12:
                out.append(f"     | ... ({len(failure.hunk.old) - 12} more lines)")
            if failure.closest:
                out.append("  " + failure.closest)
        else:
            out.append(f"  {failure.reason}.")
    out.append(_diagnose(patch, tree))
    if done:
        out.append(
            f"Nothing was written: this run had applied {', '.join(done)} in memory only "
            "and rolled back; the tree is byte-identical to before."
        )
    else:
        out.append("Nothing was written; the tree is byte-identical to before.")
    refs = ", ".join(series.upstream_refs) or "-"
    out.append(f"The series is for {series.upstream_repo} at {refs}.")
    checked = series.checked_against.get(patch.name)
    if checked:
        out.append(f"{patch.name} was checked against {checked}.")
    if series.links:
        out.append("Upstream links: " + " ".join(series.links))
    out.append(
        "Check whether upstream fixed this (then drop the patch) or regenerate it on the "
        "new source (invoke patches.new)."
    )
    return "\n".join(out)


def _ambiguous_message(series: Series, patch: Patch, src: Path) -> str:
    return (
        f"Patch {patch.name} of series {series.label} both applies and reverse-applies to "
        f"{src}, equally well: its text occurs more than once, so the tree cannot say whether "
        "it is already applied. Nothing was written. Give the patch more context lines "
        "(git diff -U6) so it matches one place only."
    )


def _plan(
    series_list: Sequence[Series], tree: _Overlay, src: Path, stop_on_conflict: bool
) -> tuple[list[PatchResult], str | None]:
    results: list[PatchResult] = []
    done: list[str] = []
    for series in series_list:
        for patch in series.patches:
            touched = tuple(sorted({fp.path for fp in patch.files}))
            moved_back: list[int] = []
            moved_on: list[int] = []
            reverse, _ = _try_patch(patch.reversed(), tree, moved_back)
            forward, failures = _try_patch(patch, tree, moved_on)
            if reverse is not None and forward is not None:
                # Both fit when a hunk's text also occurs elsewhere in the file; the one that
                # lands where the patch says wins, and a tie is too uncertain to act on.
                if sum(moved_back) < sum(moved_on):
                    forward = None
                elif sum(moved_on) < sum(moved_back):
                    reverse = None
                else:
                    message = _ambiguous_message(series, patch, src)
                    results.append(
                        PatchResult(series.label, patch.name, CONFLICT, touched, False, message)
                    )
                    if stop_on_conflict:
                        return results, message
                    continue
            if reverse is not None:
                results.append(PatchResult(series.label, patch.name, APPLIED, touched))
                continue
            if forward is not None:
                tree.update(forward)
                results.append(PatchResult(series.label, patch.name, PENDING, touched))
                done.append(patch.name)
                continue
            message = _conflict_message(series, patch, failures, tree, done, src)
            results.append(PatchResult(series.label, patch.name, CONFLICT, touched, False, message))
            if stop_on_conflict:
                return results, message
    return results, None


def _check_component(series_list: Sequence[Series], component: str | None) -> None:
    if component is None:
        return
    for series in series_list:
        if series.component != component:
            raise PatchError(
                f"Series {series.path} is for component {series.component!r} (its "
                f"{SERIES_FILE}), not {component!r}: it would patch the wrong source tree."
            )


def _check_src(src: Path) -> Path:
    src = Path(src)
    if not src.is_dir():
        raise PatchError(f"Source tree {src} does not exist or is not a folder.")
    return src


def check(
    series_list: Sequence[Series], src: Path, component: str | None = None
) -> list[PatchResult]:
    """What apply would do, per patch; raises PatchConflict (writing nothing) on a conflict."""
    src = _check_src(src)
    _check_component(series_list, component)
    results, message = _plan(series_list, _Overlay(_disk_reader(src)), src, stop_on_conflict=True)
    if message is not None:
        raise PatchConflict(message, results)
    return results


def status(
    series_list: Sequence[Series], src: Path, component: str | None = None
) -> list[PatchResult]:
    """The state of every patch (applied, pending, conflict); never raises on a conflict."""
    src = _check_src(src)
    _check_component(series_list, component)
    results, _ = _plan(series_list, _Overlay(_disk_reader(src)), src, stop_on_conflict=False)
    return results


def apply(
    series_list: Sequence[Series], src: Path, component: str | None = None
) -> list[PatchResult]:
    """Apply every pending patch, all or nothing; raises PatchConflict on a conflict."""
    src = _check_src(src)
    _check_component(series_list, component)
    tree = _Overlay(_disk_reader(src))
    results, message = _plan(series_list, tree, src, stop_on_conflict=True)
    if message is not None:
        raise PatchConflict(message, results)
    _write(src, tree.changes)
    return [dataclasses.replace(r, written=r.state == PENDING) for r in results]


def _write(src: Path, changes: dict[str, FileState]) -> None:
    """Write the overlay's changes; on any error restore every file written so far."""
    read = _disk_reader(src)
    snapshot: list[tuple[str, FileState]] = []
    made_dirs: list[Path] = []
    try:
        for path, new in sorted(changes.items()):
            old = read(path)
            if old == new:
                continue
            snapshot.append((path, old))
            _put(src, path, new, made_dirs)
    except OSError as exc:
        for path, old in reversed(snapshot):
            try:
                _put(src, path, old, [])
            except OSError:
                pass
        for folder in reversed(made_dirs):
            try:
                folder.rmdir()
            except OSError:
                pass
        raise PatchError(
            f"Could not write {exc.filename or 'a file'}: {exc.strerror or exc}; "
            "every file this run had written was restored."
        ) from None


def _put(src: Path, path: str, state: FileState, made_dirs: list[Path]) -> None:
    full = src / path
    if state is None:
        if full.exists():
            full.unlink()
            parent = full.parent
            # Like git apply: a folder emptied by a deletion goes too.
            while parent != src and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        return
    content, executable = state
    missing = []
    parent = full.parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for folder in reversed(missing):
        folder.mkdir()
        made_dirs.append(folder)
    # A new inode, then rename: a hard-linked copy of the tree (cp -al, caches) must not
    # see the change through its other links.
    old_mode = full.stat().st_mode if full.exists() else None
    tmp = full.with_name(f".{full.name}.attnforge-tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(content)
        mode = tmp.stat().st_mode if old_mode is None else old_mode
        if executable:
            mode |= (mode & 0o444) >> 2
        else:
            mode &= ~0o111
        os.chmod(tmp, stat.S_IMODE(mode))
        os.replace(tmp, full)
    finally:
        if tmp.exists():
            tmp.unlink()


# --------------------------------------------------------------------------------------
# Making a new patch from a git checkout's uncommitted change
# --------------------------------------------------------------------------------------


def _git(src: Path, *args: str) -> bytes:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        proc = subprocess.run(
            ["git", "-C", str(src), *args], capture_output=True, env=env, check=False
        )
    except FileNotFoundError:
        raise PatchError("git is needed to make a new patch, and it is not on PATH.") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise PatchError(f"git {' '.join(args)} failed in {src}: {err}")
    return proc.stdout


def _unified(path: str, old: FileState, new: FileState) -> bytes:
    """A git-style diff of one file, with '\\ No newline at end of file' markers."""
    old_lines = _split_lines(old[0]) if old else []
    new_lines = _split_lines(new[0]) if new else []
    out = [f"diff --git a/{path} b/{path}\n".encode()]
    if old is None:
        out.append(f"new file mode {'100755' if new and new[1] else '100644'}\n".encode())
    elif new is None:
        out.append(f"deleted file mode {'100755' if old[1] else '100644'}\n".encode())
    elif old[1] != new[1]:
        out.append(f"old mode {'100755' if old[1] else '100644'}\n".encode())
        out.append(f"new mode {'100755' if new[1] else '100644'}\n".encode())
    if old_lines == new_lines:
        return b"".join(out)
    out.append(b"--- " + (f"a/{path}".encode() if old is not None else b"/dev/null") + b"\n")
    out.append(b"+++ " + (f"b/{path}".encode() if new is not None else b"/dev/null") + b"\n")
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for group in matcher.get_grouped_opcodes(3):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        old_start = i1 + 1 if i2 > i1 else i1
        new_start = j1 + 1 if j2 > j1 else j1
        out.append(f"@@ -{old_start},{i2 - i1} +{new_start},{j2 - j1} @@\n".encode())
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out.extend(_marked(b" ", old_lines[a1:a2]))
                continue
            out.extend(_marked(b"-", old_lines[a1:a2]))
            out.extend(_marked(b"+", new_lines[b1:b2]))
    return b"".join(out)


def _marked(prefix: bytes, lines: Sequence[bytes]) -> list[bytes]:
    out = []
    for line in lines:
        if line.endswith(b"\n"):
            out.append(prefix + line)
        else:
            out.append(prefix + line + b"\n\\ No newline at end of file\n")
    return out


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
    if not slug:
        raise PatchError(f"Patch name {name!r} has no letters or digits.")
    return slug[:60]


def new_patch(component: str, series: str, src: Path, name: str, patches_root: Path) -> Path:
    """Turn a git checkout's uncommitted change into the series' next numbered patch.

    The series' existing patches must already be applied in src; the new patch holds only
    what src changes beyond them, and gets a header naming the commit it was made on.
    """
    src = _check_src(src).resolve()
    top = Path(_git(src, "rev-parse", "--show-toplevel").decode().strip()).resolve()
    if top != src:
        raise PatchError(f"{src} is not the top of its git checkout ({top} is); pass --src {top}.")
    head = _git(src, "rev-parse", "HEAD").decode().strip()
    folder = Path(patches_root) / component / series
    existing: Series | None = None
    if folder.exists():
        existing = load_series(folder, component)
        states = status([existing], src)
        not_applied = [r.patch for r in states if r.state != APPLIED]
        if not_applied:
            raise PatchError(
                f"Patches {', '.join(not_applied)} of {component}/{series} are not applied in "
                f"{src}; apply the series first so the new patch is made on top of it."
            )

    def head_reader(path: str) -> FileState:
        listing = _git(src, "ls-tree", "-z", "HEAD", "--", path)
        if not listing:
            return None
        info = listing.split(b"\t", 1)[0].split()
        if info[1] != b"blob":
            return None
        return _git(src, "cat-file", "blob", info[2].decode()), info[0] == b"100755"

    base = _Overlay(head_reader)
    if existing is not None:
        for patch in existing.patches:
            forward, failures = _try_patch(patch, base)
            if forward is None:
                raise PatchError(
                    f"{patch.name} does not apply to HEAD ({head}) of {src}: "
                    f"{failures[0].path}: {failures[0].reason}."
                )
            base.update(forward)

    changed = _git(src, "diff", "HEAD", "--name-only", "--no-renames", "-z").split(b"\0")
    untracked = _git(src, "ls-files", "--others", "--exclude-standard", "-z").split(b"\0")
    paths = {p.decode("utf-8", "surrogateescape") for p in changed + untracked if p}
    paths |= set(base.changes)
    work = _disk_reader(src)
    body: list[bytes] = []
    for path in sorted(paths):
        old, new = base.get(path), work(path)
        if old == new:
            continue
        for state in (old, new):
            if state is not None and b"\0" in state[0]:
                raise PatchError(f"{path} is a binary file; binary patches are not supported.")
        body.append(_unified(path, old, new))
    if not body:
        raise PatchError(
            f"{src} has no uncommitted change beyond the series' existing patches; edit the "
            "source first, then run new."
        )
    numbers = [int(p.name[:4]) for p in existing.patches] if existing else []
    number = max(numbers, default=0) + 1
    filename = f"{number:04d}-{_slug(name)}.patch"
    header = (
        f"From: attnforge patches new\nSubject: [PATCH] {name}\n\n"
        f"Series {component}/{series}, made on {head}.\n"
        "Say here why the change is needed and link the upstream issue or PR.\n---\n"
    )
    data = header.encode() + b"".join(body)
    parse_patch(data, filename)  # refuse to write what the engine could not read back
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / filename
    target.write_bytes(data)
    meta_path = folder / SERIES_FILE
    if meta_path.exists():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    else:
        remote = ""
        try:
            remote = _git(src, "remote", "get-url", "origin").decode().strip()
        except PatchError:
            pass
        meta = {
            "component": component,
            "summary": "TODO: what this series fixes and why.",
            "upstream": {"repo": remote or "TODO: upstream repository URL", "refs": [head]},
            "links": [],
            "checked_against": {},
        }
    meta.setdefault("checked_against", {})[filename] = head
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return target


# --------------------------------------------------------------------------------------
# Script
# --------------------------------------------------------------------------------------

_STATE_WORDS = {APPLIED: "already applied", PENDING: "not applied", CONFLICT: "CONFLICT"}


def format_results(results: Sequence[PatchResult], command: str) -> str:
    """One line per patch, for people and build logs."""
    lines = []
    for r in results:
        if command == "status":
            word = _STATE_WORDS[r.state]
        elif command == "apply":
            word = {APPLIED: "skipped (already applied)", PENDING: "applied"}.get(r.state, "")
            word = word or "CONFLICT"
        else:
            word = {APPLIED: "would skip (already applied)", PENDING: "would apply"}.get(
                r.state, "CONFLICT"
            )
        lines.append(f"{r.series} {r.patch}: {word} [{', '.join(r.files)}]")
    return "\n".join(lines)


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
        action = {"check": check, "apply": apply, "status": status}[args.command]
        results = action(series_list, Path(args.src))
    except PatchConflict as exc:
        if exc.results[:-1]:
            # What would have happened before the conflict; all of it was rolled back.
            print("before the conflict (rolled back, nothing written):", file=sys.stderr)
            print(format_results(exc.results[:-1], "check"), file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except PatchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_results(results, args.command))
    if args.command == "status" and any(r.state == CONFLICT for r in results):
        for r in results:
            if r.state == CONFLICT:
                print(f"error: {r.detail}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
