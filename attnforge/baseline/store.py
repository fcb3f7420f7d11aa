"""Where a benchmark baseline comes from, and how the default one is kept.

- The kept baseline: `reports/<arch>/<stack>/baseline/` holds the report.json and bench.json of
  the last `invoke validate --bench` run that passed, gate included (plus baseline.json: when and
  what). A new one is written aside and swapped in only after such a run; a failed run leaves it.
- Published baselines: `invoke publish` keeps a copy of the validated image's report and bench in
  `reports/<arch>/<stack>/published/<digest12>/` beside its publish.json, so that
  `--baseline IMAGE` finds the report that was published with that image (by the image's
  registry digest, or its local image id when it was pulled here).
- Anything else is a path: a bench.json, a report.json or publish.json with bench.json beside
  it, or a folder holding bench.json.

Why the published report is kept beside publish.json and not in the image or the registry: the
benchmark runs on the finished image, so baking it in would make a new image (and `invoke
publish` pushes only the very image id that passed); labels are fixed at build time and too small
for a benchmark; pushing it as a registry artifact of its own would need the registry's blob API
with the engine's credentials, which attnforge does not handle (the engine does). A consumer on
another machine passes the report folder instead (CI uploads it as the reports-* artifact).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError
from .gate import BaselineError, bench_file, load_bench

KEPT = "baseline"
KEPT_FILES = ("report.json", "bench.json")
KEPT_META = "baseline.json"
PUBLISHED = "published"
# What a published snapshot copies from the report folder, when present.
PUBLISHED_FILES = ("report.json", "report.md", "bench.json", "bench_train.json", "expect.json",
                   "validated.json")  # fmt: skip


@dataclass(frozen=True)
class Baseline:
    """A benchmark to compare with: its document and where it came from, in words."""

    bench: dict[str, Any]
    source: str  # a path, or "IMAGE (published, <folder>)"
    folder: Path


def _swap_in(new: Path, final: Path) -> None:
    """Replace the folder `final` with `new`. The old one is renamed aside first and removed only
    after the new one is in place; if the process dies between the two renames, kept_dir() finds
    the old one under its aside name."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    os.replace(new, final)
    shutil.rmtree(old, ignore_errors=True)


def kept_dir(reports: Path) -> Path | None:
    """The kept baseline of a report folder, if any: baseline/, else one left aside by a swap
    that was interrupted between its two renames."""
    final = reports / KEPT
    if (final / "bench.json").is_file():
        return final
    aside = sorted(reports.glob(f".{KEPT}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((p for p in aside if (p / "bench.json").is_file()), None)


def keep(reports: Path, meta: dict[str, Any]) -> Path:
    """Make the report folder's report.json and bench.json (this run's, now in place) the kept
    baseline: copied into a new folder beside it, then swapped in."""
    final = reports / KEPT
    new = reports / f".{KEPT}.new-{os.getpid()}"
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    try:
        for name in KEPT_FILES:
            if (reports / name).is_file():
                shutil.copy2(reports / name, new / name)
        (new / KEPT_META).write_text(json.dumps(meta, indent=2) + "\n")
        _swap_in(new, final)
    finally:
        shutil.rmtree(new, ignore_errors=True)
    return final


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------- published


def snapshot_published(reports: Path, manifest: dict[str, Any], digest: str) -> Path:
    """Copy what was validated (the report, bench, ...) and the publish record into
    published/<digest12>/ (written aside, then renamed). A bench.json that is not the one the
    validation of this image wrote (validated.json names its sha256; a later --local run may have
    replaced it) is left out, so a published baseline is always the published image's."""
    validated = manifest.get("validation") or {}
    hashes = validated.get("documents") or {}
    final = reports / PUBLISHED / (digest.removeprefix("sha256:")[:12] or "unknown")
    new = final.with_name(f".{final.name}.new-{os.getpid()}")
    shutil.rmtree(new, ignore_errors=True)
    new.mkdir(parents=True)
    left_out = []
    try:
        for name in PUBLISHED_FILES:
            src = reports / name
            if not src.is_file():
                continue
            if name in hashes and hashes[name] != sha256_file(src):
                left_out.append(name)
                continue
            shutil.copy2(src, new / name)
        record = dict(manifest, snapshot_left_out=left_out)
        (new / "publish.json").write_text(json.dumps(record, indent=2) + "\n")
        _swap_in(new, final)
    finally:
        shutil.rmtree(new, ignore_errors=True)
    return final


def published_records(reports_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(folder, publish.json) of every published snapshot under the reports folder, newest first."""
    found = []
    for path in reports_dir.glob(f"*/*/{PUBLISHED}/*/publish.json"):
        try:
            found.append((path.parent, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return sorted(found, key=lambda f: f[0].stat().st_mtime, reverse=True)


def find_published(
    reports_dir: Path, *, digest: str | None = None, image_id: str | None = None
) -> Path | None:
    """The snapshot folder whose publish record names this registry digest or local image id."""
    for folder, record in published_records(reports_dir):
        final = record.get("image_id")
        # the refs of the final image only: the lower layers were pushed with their own digests
        digests = {r.get("digest") for r in record.get("refs") or [] if r.get("image_id") == final}
        if (digest and digest in digests) or (image_id and image_id == final):
            return folder
    return None


def looks_like_image(text: str) -> bool:
    return not Path(text).exists() and (":" in text or "@" in text) and not text.endswith(".json")


def resolve(
    spec: str,
    reports_dir: Path,
    *,
    image_id: Callable[[str], str | None] | None = None,
    registry_digest: Callable[[str], str] | None = None,
) -> Baseline:
    """--baseline REPORT|DIR|IMAGE -> the benchmark to compare with; UserError when there is none.
    For an image: a digest in the reference, else the local image's id, else the digest its
    registry serves (the engine's calls, passed in), looked up among the published snapshots."""
    if not looks_like_image(spec):
        try:
            path = bench_file(spec)
            return Baseline(load_bench(path), str(path), path.parent)
        except BaselineError as exc:
            raise UserError(str(exc)) from None
    tried = []
    folder = None
    if "@sha256:" in spec:
        digest = "sha256:" + spec.split("@sha256:", 1)[1]
        tried.append(f"digest {digest[:19]}")
        folder = find_published(reports_dir, digest=digest)
    if folder is None and image_id is not None:
        local = image_id(spec)
        if local:
            tried.append(f"local image {local[:19]}")
            folder = find_published(reports_dir, image_id=local)
    if folder is None and registry_digest is not None and "@sha256:" not in spec:
        try:
            digest = registry_digest(spec)
            tried.append(f"registry digest {digest[:19]}")
            folder = find_published(reports_dir, digest=digest)
        except Exception as exc:  # noqa: BLE001 - the registry's own words, as one clause
            tried.append(f"no registry answer ({str(exc).splitlines()[0][:120]})")
    if folder is None:
        raise UserError(
            f"--baseline {spec}: no report published with that image is kept under "
            f"{reports_dir} ({'; '.join(tried) or 'nothing to look it up by'})",
            hint="`invoke publish` keeps one in reports/<arch>/<stack>/published/; else pass "
            "the report folder or bench.json of the run to compare with",
        )
    try:
        return Baseline(load_bench(folder), f"{spec} (published; {folder})", folder)
    except BaselineError as exc:
        raise UserError(f"--baseline {spec}: the published report has no usable benchmark: "
                        f"{exc}") from None  # fmt: skip
