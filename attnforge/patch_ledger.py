"""The patch ledger: for each patch the recipes apply, is it still needed at the source's ref?

Each series.json may carry a `ledger`: per patch file, why it exists, the upstream issue or pull
request that would make it unnecessary, and machine-checkable drop conditions, all of which must
hold at a ref for the patch to be droppable there::

    "ledger": {
      "0001-x.patch": {
        "why": "is_rdna() lacks gfx1151, so autotune raises 'Unknown Device Type'",
        "upstream": ["https://github.com/ROCm/flash-attention/pull/165"],
        "drop_if": [
          {"file": "flash_attn/utils.py", "contains": "\\"gfx1151\\""},
          {"file": "setup.py", "lacks": "-std=c++17"},
          {"commit": "<40 hex digits>"}
        ]
      }
    }

`{"file", "contains"}`: the upstream file at the ref holds the text; `{"file", "lacks"}`: it
exists and does not; `{"commit"}`: the ref contains that commit (it is the commit or a
descendant). Repositories are read through pins.Sources (online, or offline mirrors laid out by
URL: docs/pins.md). A condition that cannot be read makes the patch `unknown`, never droppable.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import patches as patch_series
from .errors import UserError, unknown
from .pins.upstream import GitRepo, Sources, Unavailable, run_git
from .recipes import Recipes

NEEDED, DROPPABLE, UNKNOWN = "still needed", "droppable", "unknown"
_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class DropCondition:
    file: str = ""
    contains: str | None = None
    lacks: str | None = None
    commit: str = ""

    def describe(self) -> str:
        if self.commit:
            return f"the ref contains commit {self.commit[:12]}"
        if self.contains is not None:
            return f"{self.file} contains {self.contains!r}"
        return f"{self.file} lacks {self.lacks!r}"


@dataclass(frozen=True)
class LedgerEntry:
    why: str
    upstream: tuple[str, ...]
    drop_if: tuple[DropCondition, ...]


@dataclass
class PatchStatus:
    layer: str
    series: str  # repo path of the series folder
    patch: str
    ref: str  # where it was judged
    status: str  # still needed | droppable | unknown
    evidence: list[str] = field(default_factory=list)
    why: str = ""
    upstream: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer, "series": self.series, "patch": self.patch, "ref": self.ref,
            "status": self.status, "evidence": self.evidence, "why": self.why,
            "upstream": list(self.upstream),
        }  # fmt: skip


def read_ledger(series_dir: Path) -> dict[str, LedgerEntry]:
    """The `ledger` of a series.json, checked; {} when the series has none."""
    meta_path = series_dir / patch_series.SERIES_FILE
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    raw = meta.get("ledger", {})
    if not isinstance(raw, dict):
        raise UserError(f"{meta_path}: ledger must be an object: patch file -> entry")
    entries = {}
    for name, entry in raw.items():
        where = f"{meta_path}: ledger[{name!r}]"
        if not isinstance(entry, dict) or set(entry) - {"why", "upstream", "drop_if"}:
            raise UserError(f"{where} must be an object with why, upstream and drop_if")
        conditions = []
        for cond in entry.get("drop_if", []):
            keys = set(cond) if isinstance(cond, dict) else set()
            if keys == {"commit"} and _SHA.match(str(cond["commit"])):
                conditions.append(DropCondition(commit=cond["commit"]))
            elif keys in ({"file", "contains"}, {"file", "lacks"}):
                conditions.append(DropCondition(**{k: str(v) for k, v in cond.items()}))
            else:
                raise UserError(
                    f"{where}: drop_if entry {cond!r} is not {{file, contains}}, {{file, lacks}} "
                    "or {commit: <40 hex digits>}"
                )
        if not entry.get("why") or not conditions:
            raise UserError(f"{where} needs a why and at least one drop_if condition")
        entries[name] = LedgerEntry(
            str(entry["why"]), tuple(map(str, entry.get("upstream", []))), tuple(conditions)
        )
    return entries


def _holds(repo: GitRepo, ref: str, cond: DropCondition) -> tuple[bool, str]:
    """Whether one drop condition holds at ref, with the evidence; Unavailable if unreadable."""
    if cond.commit:
        if not repo.has_commit(ref) or not repo.has_commit(cond.commit):
            missing = ref if not repo.has_commit(ref) else cond.commit
            raise Unavailable(f"{repo.url} has no commit {missing[:12]} here")
        if repo.online:
            raise Unavailable("ancestry needs a full mirror (--offline DIR with a clone)")
        proc = run_git(["merge-base", "--is-ancestor", cond.commit, ref], cwd=repo.path)
        if proc.returncode not in (0, 1):
            raise Unavailable(f"git merge-base failed in {repo.path}")
        held = proc.returncode == 0
        return held, f"{ref[:12]} {'contains' if held else 'does not contain'} {cond.commit[:12]}"
    text = repo.show(ref, cond.file)
    if text is None:
        return False, f"{cond.file} does not exist at {ref[:12]}"
    if cond.contains is not None:
        held = cond.contains in text
        return (
            held,
            f"{cond.file} at {ref[:12]} {'contains' if held else 'lacks'} {cond.contains!r}",
        )
    held = cond.lacks not in text
    return held, f"{cond.file} at {ref[:12]} {'lacks' if held else 'contains'} {cond.lacks!r}"


def status(
    recipes: Recipes, sources: Sources, layer: str | None = None, ref: str | None = None
) -> list[PatchStatus]:
    """Every patch of every layer with a source (or of one layer), judged at the layer's pinned
    ref, or at `ref` (a commit or, in a mirror, a branch: "may I drop it when I move there?")."""
    if layer is not None and layer not in recipes.layers:
        raise unknown("layer", layer, [n for n, s in recipes.layers.items() if s.patches])
    found = []
    for name, spec in recipes.layers.items():
        if (layer and name != layer) or not spec.patches or spec.source is None:
            continue
        at = ref or spec.source.ref
        try:
            repo: GitRepo | None = sources.repo(spec.source.repo)
            unread = ""
        except Unavailable as exc:
            repo, unread = None, str(exc)
        for rel in spec.patches:
            try:
                series = patch_series.load_series(recipes.root / rel)
            except patch_series.PatchError as exc:
                raise UserError(str(exc)) from None
            ledger = read_ledger(recipes.root / rel)
            for patch in series.patches:
                entry = ledger.get(patch.name)
                row = PatchStatus(name, rel, patch.name, at, UNKNOWN)
                found.append(row)
                if entry is None:
                    row.evidence = [f"{rel}/series.json has no ledger entry for it"]
                    continue
                row.why, row.upstream = entry.why, entry.upstream
                try:
                    if repo is None:
                        raise Unavailable(unread)
                    verdicts = [_holds(repo, at, c) for c in entry.drop_if]
                except Unavailable as exc:
                    row.evidence = [str(exc)]
                    continue
                row.evidence = [e for _, e in verdicts]
                row.status = DROPPABLE if all(h for h, _ in verdicts) else NEEDED
    return found
