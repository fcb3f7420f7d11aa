"""What a Python environment holds: every installed distribution, its metadata and RECORD, the
interpreter's tags and the attention knobs it runs with.

Standard library only, and run as a script by any interpreter (`python - < envprobe.py`): in an
image, where attnforge is not installed, and in a user's venv for `invoke verify-env`. It prints
one JSON document; attnforge/export.py judges it.

    python envprobe.py [--records] [--verify]

--records adds each distribution's hashed RECORD entries (what the export matches wheel files
against); --verify hashes every file a RECORD lists and reports the ones missing or changed on disk
(damaged metadata: the installer's record no longer describes the files).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

# Variables that change which attention kernels run; the export carries the image's values.
KNOB_PREFIXES = (
    "TORCH_ROCM_", "PYTORCH_", "HIP_", "HSA_", "ROCM_", "AOTRITON_", "FLASH_ATTENTION_",
    "TRITON_", "MIOPEN_", "ATTNFORGE_",
)  # fmt: skip
# Variables with those prefixes that name a place in the image, not which kernels run: the
# validated image's build of the kernels' native launch path (attnforge_kernels/launch/replay.py). A venv keeps
# its own build in its user's cache; pointing it at the image's folder would find nothing there.
NOT_KNOBS = frozenset({"ATTNFORGE_NATIVE_DIR"})
# Files an installer writes into dist-info itself: they are not in the wheel.
INSTALLER_FILES = ("INSTALLER", "REQUESTED", "direct_url.json", "RECORD")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _metadata(text: str | None) -> dict[str, str]:
    """Name and Version from METADATA's header (email format; read by hand, no email parser quirks)."""
    found: dict[str, str] = {}
    for line in (text or "").splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        if key in ("Name", "Version") and key not in found:
            found[key] = value.strip()
    return found


def probe_dist(info: Path, records: bool, verify: bool) -> dict:
    meta = _metadata(_read(info / "METADATA"))
    site = info.parent
    entry: dict = {
        "dist_info": str(info),
        "name": meta.get("Name"),
        "version": meta.get("Version"),
        "installer": (_read(info / "INSTALLER") or "").strip() or None,
        "requested": (info / "REQUESTED").exists(),
        "direct_url": None,
        "record_sha256": None,
    }
    direct = _read(info / "direct_url.json")
    if direct:
        try:
            entry["direct_url"] = json.loads(direct)
        except ValueError:
            entry["direct_url"] = {"unreadable": True}
    record_text = _read(info / "RECORD")
    if record_text is None:
        entry["record_problems"] = ["RECORD is missing"]
        return entry
    entry["record_sha256"] = hashlib.sha256(record_text.encode()).hexdigest()
    rows = [r for r in csv.reader(record_text.splitlines()) if r]
    if records:
        entry["record"] = sorted(
            [r[0], r[1]] for r in rows if len(r) >= 2 and r[1] and "__pycache__" not in r[0]
        )
    if verify:
        problems = []
        for row in rows:
            if len(row) < 2 or not row[1]:
                continue  # RECORD itself and .pyc files carry no hash
            path = (site / row[0]).resolve()
            if not path.is_file():
                problems.append(f"{row[0]} is missing")
            elif _digest(path) != row[1]:
                problems.append(f"{row[0]} does not match its recorded hash")
        entry["record_problems"] = problems
    return entry


def probe(records: bool = False, verify: bool = False) -> dict:
    seen: set[Path] = set()
    dists = []
    for folder in sys.path:
        base = Path(folder or ".")
        if not base.is_dir():
            continue
        for info in sorted(base.glob("*.dist-info")):
            info = info.resolve()
            if info in seen or not info.is_dir():
                continue
            seen.add(info)
            dists.append(probe_dist(info, records, verify))
    impl = sys.implementation.name
    tag = f"{'cp' if impl == 'cpython' else impl}{sys.version_info.major}{sys.version_info.minor}"
    return {
        "python": {
            "executable": sys.executable,
            "version": ".".join(map(str, sys.version_info[:3])),
            "tag": tag,
            "platform": sysconfig.get_platform(),
            "prefix": sys.prefix,
            "in_venv": sys.prefix != sys.base_prefix,
        },
        "env": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith(KNOB_PREFIXES) and k not in NOT_KNOBS
        },
        "path_entries": [p for p in sys.path if p],
        "dists": dists,
    }


def main(argv: list[str]) -> int:
    json.dump(probe(records="--records" in argv, verify="--verify" in argv), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
