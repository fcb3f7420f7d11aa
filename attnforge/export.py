"""A validated stack outside containers: the export manifest, the files an installer reads, and
the comparison of an environment with it.

Pure: the inputs are what attnforge/image/envprobe.py printed (for the image or a user's Python), wheel
files on disk and the validation stamp; the engine and subprocess work is in attnforge/cli/export.py.

Why the wheel hashes are honest: pip records no hash of the wheel it installed from an index or a
find-links folder (direct_url.json exists only for direct URL installs). So a wheel file is taken
as "the wheel that was installed" only when every file its own RECORD lists is in the installed
RECORD with the same sha256: the installed files are byte for byte that wheel's files. Its sha256
is then the sha256 of that file, and the export ships the file.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from contract import names

EXPORT_KIND = names.EXPORT
EXPORT_VERSION = names.KIND_VERSIONS[EXPORT_KIND]
MANIFEST = "export.json"
REQUIREMENTS = "requirements.txt"
PYLOCK = "pylock.toml"
WHEELS = "wheels"
ENV_FILE = "env.sh"
# The installer's own tools: a fresh venv brings its own versions; they are listed, not compared.
TOOLING = frozenset({"pip", "setuptools", "wheel"})
KERNELS_DIST = "attnforge-kernels"
# Where a source-built layer keeps the wheel it built, so an export can carry it.
IMAGE_WHEELS = "/opt/attnforge/wheels"

# verify-env's exit statuses; 2 stays what it is for every task: a usage error (as diff(1) does).
SAME, DIFFERS, FAILS = 0, 1, 3


def local_label(version: str) -> str | None:
    try:
        return Version(version).local
    except InvalidVersion:
        return None


def _installed_rows(record: Iterable[Iterable[str]]) -> dict[str, str]:
    return {path: digest for path, digest in record}


def wheel_rows(path: Path) -> dict[str, str]:
    """The hashed files a wheel's RECORD lists, as paths relative to site-packages; the .data/
    tree (installed elsewhere) and the RECORD itself are left out."""
    with zipfile.ZipFile(path) as zf:
        record_name = next(
            (n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")),
            None,
        )
        if record_name is None:
            return {}
        text = zf.read(record_name).decode()
    rows = {}
    for row in csv.reader(text.splitlines()):
        if len(row) < 2 or not row[1] or ".data/" in row[0].split("/", 1)[0] + "/":
            continue
        rows[row[0]] = row[1]
    return rows


def wheel_matches(wheel: Path, installed_record: Iterable[Iterable[str]]) -> bool:
    """Whether the installed files are exactly this wheel's files (see the module docstring)."""
    want = wheel_rows(wheel)
    have = _installed_rows(installed_record)
    return bool(want) and all(have.get(p) == d for p, d in want.items())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def candidate_wheels(name: str, version: str, folders: Iterable[Path]) -> list[Path]:
    """Wheel files named for this distribution and version in the folders."""
    found = []
    for folder in folders:
        for path in sorted(Path(folder).glob("*.whl")) if Path(folder).is_dir() else []:
            try:
                wname, wver, _, _ = parse_wheel_filename(path.name)
            except ValueError:
                continue
            if wname == canonicalize_name(name) and str(wver) == str(Version(version)):
                found.append(path)
    return found


@dataclass(frozen=True)
class Dist:
    """One installed distribution as a probe saw it."""

    name: str
    version: str
    record: tuple[tuple[str, str], ...]
    record_problems: tuple[str, ...]
    direct_url: dict | None
    dist_info: str

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)


def dists_of(probe: dict) -> tuple[list[Dist], list[str]]:
    """The readable distributions of a probe, and a sentence for each dist-info whose METADATA
    names no distribution (damaged metadata)."""
    dists, broken = [], []
    for d in probe.get("dists", []):
        if not d.get("name") or not d.get("version"):
            broken.append(f"{d['dist_info']} has no readable Name/Version in METADATA")
            continue
        dists.append(
            Dist(
                name=d["name"],
                version=d["version"],
                record=tuple(tuple(r) for r in d.get("record", [])),
                record_problems=tuple(d.get("record_problems", [])),
                direct_url=d.get("direct_url"),
                dist_info=d["dist_info"],
            )
        )
    return dists, broken


def wheel_entry(dist: Dist, wheel: Path, source: str) -> dict:
    return {
        "name": dist.key,
        "version": dist.version,
        "local": local_label(dist.version),
        "filename": wheel.name,
        "sha256": sha256_file(wheel),
        "source": source,
    }


def env_knobs(image_env: Iterable[str], probe_env: dict[str, str], prefixes: tuple) -> dict:
    """The attention knobs the image sets (its config's Env), with what the probe saw as fallback."""
    knobs = dict(probe_env)
    for item in image_env:
        key, _, value = item.partition("=")
        if key.startswith(prefixes):
            knobs[key] = value
    return dict(sorted(knobs.items()))


def requirements_text(manifest: dict) -> str:
    """pip's hash-checking requirements: every wheel pinned by ==version and its sha256."""
    lines = [
        f"# attnforge export of {manifest['stack']} for {manifest['arch']}: image "
        f"{manifest['image']} ({manifest['image_id'][:19]}), validation "
        f"{'passed' if manifest['validation'].get('passed') else 'failed'}",
        f"# python {manifest['python']['version']} ({manifest['python']['tag']}, "
        f"{manifest['python']['platform']}); install offline with:",
        f"#   {install_command(manifest)}",
    ]
    for w in manifest["wheels"]:
        lines.append(f"{w['name']}=={w['version']} \\")
        lines.append(f"    --hash=sha256:{w['sha256']}")
    return "\n".join(lines) + "\n"


def install_command(manifest: dict, python: str = "python", where: str = "") -> str:
    """pip's offline install of an export; `where` is the export folder with a trailing slash
    ("" when run inside it)."""
    return (
        f"{python} -m pip install --no-index --find-links {where}{WHEELS} --require-hashes "
        f"--no-deps -r {where}{REQUIREMENTS}"
    )


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def pylock_text(manifest: dict) -> str:
    """PEP 751 lock file: every wheel by path, with its sha256."""
    py = manifest["python"]["version"].rsplit(".", 1)[0]
    lines = [
        'lock-version = "1.0"',
        'created-by = "attnforge"',
        f"requires-python = {_toml_str('==' + py + '.*')}",
        "",
    ]
    for w in manifest["wheels"]:
        lines += [
            "[[packages]]",
            f"name = {_toml_str(w['name'])}",
            f"version = {_toml_str(w['version'])}",
            "",
            "[[packages.wheels]]",
            f"name = {_toml_str(w['filename'])}",
            f"path = {_toml_str(WHEELS + '/' + w['filename'])}",
            f"hashes = {{sha256 = {_toml_str(w['sha256'])}}}",
            "",
        ]
    return "\n".join(lines)


def env_text(manifest: dict) -> str:
    lines = [f"# the environment {manifest['image']} sets; source this before running"]
    lines += [f"export {k}={_sh_quote(v)}" for k, v in manifest["env"].items()]
    return "\n".join(lines) + "\n"


def _sh_quote(value: str) -> str:
    return (
        value
        if re.fullmatch(r"[A-Za-z0-9_./:+,=-]*", value)
        else "'" + value.replace("'", "'\\''") + "'"
    )


# ---------------------------------------------------------------------------------------------
# The kernels wheel: the validated image's kernels/, validate/ and contract/ packages as one
# pure wheel.


def kernels_wheel(src: Path, out_dir: Path, base_version: str = "0.1.0") -> Path:
    """Build a deterministic pure-Python wheel of the `kernels`, `validate` and `contract`
    packages under src; its local label is the first 12 hex digits of the sources' sha256."""
    files = sorted(
        p
        for pkg in ("kernels", "validate", "contract")
        for p in (src / pkg).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    tree = hashlib.sha256()
    for p in files:
        tree.update(str(p.relative_to(src)).encode() + b"\0" + p.read_bytes())
    version = f"{base_version}+src{tree.hexdigest()[:12]}"
    dist = KERNELS_DIST.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    contents: list[tuple[str, bytes]] = [(str(p.relative_to(src)), p.read_bytes()) for p in files]
    contents.append((
        f"{info}/METADATA",
        f"Metadata-Version: 2.1\nName: {KERNELS_DIST}\nVersion: {version}\n"
        "Summary: attnforge's bundled attention kernels and validation suite, as validated\n"
        "Requires-Python: >=3.10\n".encode(),
    ))  # fmt: skip
    contents.append(
        (
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: attnforge\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    )
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in contents:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        writer.writerow([name, f"sha256={digest}", len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    contents.append((f"{info}/RECORD", record.getvalue().encode()))
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in contents:
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, data)
    return wheel


# ---------------------------------------------------------------------------------------------
# verify-env: an environment against a manifest.


@dataclass(frozen=True)
class Difference:
    kind: str  # missing, extra, version, local, record, metadata, knob
    sentence: str  # what differs, with the command that fixes it

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "sentence": self.sentence}


def compare(manifest: dict, probe: dict, export_dir: Path | None = None) -> list[Difference]:
    """Each way the probed environment differs from the manifest, as a sentence with its fix."""
    where = f" --no-index --find-links {export_dir / WHEELS}" if export_dir else ""
    pip = f"{probe['python']['executable']} -m pip"
    want = {w["name"]: w for w in manifest["wheels"]}
    dists, broken = dists_of(probe)
    have: dict[str, Dist] = {}
    for d in dists:
        have.setdefault(d.key, d)
    found: list[Difference] = []
    for sentence in broken:
        found.append(Difference("metadata", f"{sentence}; remove that folder and reinstall the distribution it belonged to"))  # fmt: skip
    for name, w in want.items():
        d = have.get(name)
        spec = f"{name}=={w['version']}"
        if d is None:
            found.append(Difference(
                "missing", f"{spec} is missing; fix: {pip} install --no-deps{where} '{spec}'"
            ))  # fmt: skip
            continue
        if Version(d.version) != Version(w["version"]):
            got_local, want_local = local_label(d.version), w.get("local")
            public = Version(d.version).public == Version(w["version"]).public
            kind = "local" if public and got_local != want_local else "version"
            what = (
                f"{name} has local label +{got_local or '(none)'} where the validated stack has +{want_local or '(none)'}"
                if kind == "local"
                else f"{name} is {d.version} where the validated stack has {w['version']}"
            )
            found.append(Difference(
                kind, f"{what}; fix: {pip} install --no-deps --force-reinstall{where} '{spec}'"
            ))  # fmt: skip
            continue
        if d.record_problems:
            shown = "; ".join(d.record_problems[:3])
            more = f" (and {len(d.record_problems) - 3} more)" if len(d.record_problems) > 3 else ""
            found.append(Difference(
                "record",
                f"{name} {d.version}: its dist-info RECORD does not match the files on disk "
                f"({shown}{more}), so pip may call it satisfied while it is damaged; fix: "
                f"{pip} install --no-deps --force-reinstall{where} '{spec}'",
            ))  # fmt: skip
    for name, d in sorted(have.items()):
        if name in want or name in TOOLING or name == KERNELS_DIST:
            continue  # an image holds the kernels as sources (PYTHONPATH), not as this wheel
        found.append(Difference(
            "extra",
            f"{name} {d.version} is installed but not in the validated stack; fix: {pip} uninstall -y {name}",
        ))  # fmt: skip
    env = probe.get("env", {})
    for key, value in manifest.get("env", {}).items():
        if value and env.get(key) != value:
            got = "unset" if key not in env else f"{env[key]!r}"
            found.append(Difference(
                "knob",
                f"{key} is {got} where the validated image sets {value!r}; fix: export {key}={_sh_quote(value)}"
                + (f" (or source {export_dir / ENV_FILE})" if export_dir else ""),
            ))  # fmt: skip
    return found


def manifest_from_image_probe(probe: dict, meta: dict) -> dict:
    """A manifest with names and versions only, from a probe of an image (no wheel files, so no
    hashes): what `--against IMAGE` compares with."""
    dists, _ = dists_of(probe)
    wheels = [
        {"name": d.key, "version": d.version, "local": local_label(d.version), "filename": None,
         "sha256": None, "source": "installed in the image"}
        for d in sorted(dists, key=lambda d: d.key) if d.key not in TOOLING
    ]  # fmt: skip
    return {**meta, "python": probe["python"], "wheels": wheels}
