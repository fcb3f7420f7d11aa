"""A validated stack outside containers: the export manifest, the files an installer reads, and
the comparison of an environment with it.

Pure up to its last section: the inputs are what attnforge/image/envprobe.py printed (for the image
or a user's Python), wheel files on disk and the validation stamp. The last section runs the export
through an Engine (attnforge/probing.py probes the image); attnforge/cli/export.py holds the
options and the printing.

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
import os
import re
import shlex
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from contract import names

from .engine import Engine, RunRequest
from .errors import UserError
from .probing import probe_image

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
# The kernels wheel: the validated image's attnforge_kernels/, validate/ and contract/ packages as
# one pure wheel.


def kernels_wheel(src: Path, out_dir: Path, base_version: str = "0.1.0") -> Path:
    """Build a deterministic pure-Python wheel of the `attnforge_kernels`, `validate` and `contract`
    packages under src; its local label is the first 12 hex digits of the sources' sha256."""
    files = sorted(
        p
        for pkg in ("attnforge_kernels", "validate", "contract")
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


# ---------------------------------------------------------------------------------------------
# The export's run: the image's wheels found (a local folder, the image, pip in the image), the
# files written into a dot folder beside the target and moved over it only once complete.


@dataclass(frozen=True)
class ExportJob:
    """What an export is made from: the validated image and where its wheels may come from."""

    arch: str
    stack: str
    image: str
    image_id: str
    record: dict  # the validation stamp the image passed with
    wheelhouse: Path  # a folder of wheels taken first
    ca_cert: Path | None  # the CA bundle pip trusts in the image
    indexes: tuple[str, ...]  # the package indexes the stack's layers name


def ca_bundle(value: str | None, default: Path = Path("/etc/ssl/certs/ca-certificates.crt")):
    """--ca-cert as a file: 'none' is pip's own bundle; not given, the host's when it has one."""
    if value == "none":
        return None
    path = Path(value) if value else default
    return path if path.is_file() else None


def stack_indexes(plan: Any) -> tuple[str, ...]:
    """The package indexes a plan's layers name (*_INDEX_URL args and hints)."""
    return tuple(sorted({
        str(v) for s in plan.steps for k, v in {**s.args, **s.hint_args}.items()
        if k.endswith("INDEX_URL") and v
    }))  # fmt: skip


def choose_wheels(
    dists: Iterable[Dist],
    chosen: dict[str, tuple[Path, str]],
    sources: Iterable[tuple[Path, Callable[[Path], str]]],
) -> None:
    """For each distribution not yet chosen, the first wheel (folder by folder) whose files are
    what the image installed, with a note of where it came from."""
    sources = list(sources)
    for d in dists:
        for folder, source in sources if d.key not in chosen else ():
            match = next((c for c in candidate_wheels(d.name, d.version, [folder])
                          if wheel_matches(c, d.record)), None)  # fmt: skip
            if match is not None:
                chosen[d.key] = (match, source(match))
                break


def refuse_unmatched(
    dists: Iterable[Dist], chosen: dict[str, tuple[Path, str]], image: str, house: Path
) -> None:
    """A UserError naming the distributions no wheel was found for (nothing is exported)."""
    left = [d for d in dists if d.key not in chosen]
    from_source = [f"{d.key}=={d.version}" for d in left if "dir_info" in (d.direct_url or {})]
    if from_source:
        raise UserError(
            f"{', '.join(from_source)} {'was' if len(from_source) == 1 else 'were'} built from a "
            f"source tree in {image} and no wheel of it was kept in {IMAGE_WHEELS}; "
            "nothing was exported",
            hint="rebuild that layer with a Dockerfile that keeps its wheel there "
            "(dockerfiles/pytorch-source.Dockerfile does)",
        )
    if left:
        raise UserError(
            f"no wheel whose files match what {image} installed was found for "
            f"{', '.join(f'{d.key}=={d.version}' for d in left)}; nothing was exported",
            hint=f"put those wheels in {house} (or pass --wheelhouse) and run it again",
        )


def _fetch_script(dest: Path, specs: list[str], wheelhouse: bool, indexes: Iterable[str]) -> str:
    script = [
        "set -e",
        "cp -r /opt/attnforge/src /out/src",
        f"mkdir -p /out/built && if [ -d {IMAGE_WHEELS} ]; then cp {IMAGE_WHEELS}/*.whl /out/built/ 2>/dev/null || true; fi",
    ]
    if specs:
        (dest / "specs.txt").write_text("\n".join(specs) + "\n")
        links = "--find-links /wheelhouse" if wheelhouse else ""
        # the indexes the stack's layers install from (AMD's, PyTorch's), beside PyPI; one retry,
        # so that an index this network cannot reach costs seconds, not minutes (a wheel that is
        # then missing is named by refuse_unmatched; a wrong one never matches the installed RECORD)
        links += "".join(f" --extra-index-url {shlex.quote(url)}" for url in indexes)
        script += [
            "if [ -s /run/ca.crt ]; then export PIP_CERT=/run/ca.crt; fi",
            f"pip install -q --retries 1 --dry-run --ignore-installed --no-deps --only-binary=:all: {links} --report /out/report.json -r /out/specs.txt",
            f"pip download -q --retries 1 --no-deps --only-binary=:all: {links} -d /out/downloaded -r /out/specs.txt",
        ]
    return "\n".join(script)


def fetch_in_image(eng: Engine, job: ExportJob, dest: Path, specs: list[str]) -> None:
    """In the image (its pip, Python and platform): copy out its kernels sources and the wheels
    a source build kept, and download the pinned wheels no local folder had, with the index
    pip resolved each from (pip's --report); a UserError if that fails."""
    house = job.wheelhouse if job.wheelhouse.is_dir() else None
    mounts = [(dest, "/out", False)]
    if house:
        mounts.append((house, "/wheelhouse", True))
    if job.ca_cert:
        mounts.append((job.ca_cert, "/run/ca.crt", True))
    req = RunRequest(
        image=job.image, command=["bash", "-c", _fetch_script(dest, specs, bool(house), job.indexes)],
        mounts=mounts, env={"HOME": "/tmp", "PIP_CACHE_DIR": "/tmp/pip-cache"},
        extra=["--user", f"{os.getuid()}:{os.getgid()}"],
    )  # fmt: skip
    proc = eng.run(req, timeout=1800)
    if proc.returncode != 0:
        raise UserError(
            f"fetching wheels in {job.image} failed: {(proc.stderr or proc.stdout).strip()[-800:]}"
        )


def pip_report_urls(report: Path) -> dict[str, str]:
    """wheel file name -> the URL pip resolved it from, out of `pip install --report`."""
    if not report.is_file():
        return {}
    found = {}
    for item in json.loads(report.read_text()).get("install", []):
        url = (item.get("download_info") or {}).get("url", "")
        if url:
            found[url.rsplit("/", 1)[-1].split("#")[0].replace("%2B", "+")] = url.split("#")[0]
    return found


def gather_wheels(eng: Engine, job: ExportJob, dists: list[Dist], fetch: Path) -> dict:
    """key -> (wheel file, where it came from) for every distribution: the wheelhouse first, then
    what the image kept and what pip in the image downloads; a UserError if any is missing."""
    chosen: dict[str, tuple[Path, str]] = {}
    choose_wheels(dists, chosen, [(job.wheelhouse, lambda _: f"wheelhouse {job.wheelhouse}")])
    fetch_in_image(eng, job, fetch, [f"{d.key}=={d.version}" for d in dists if d.key not in chosen])
    urls = pip_report_urls(fetch / "report.json")
    choose_wheels(dists, chosen, [
        (fetch / "built", lambda _: f"built in the image ({IMAGE_WHEELS})"),
        (fetch / "downloaded", lambda wheel: urls.get(wheel.name, "downloaded by pip")),
    ])  # fmt: skip
    refuse_unmatched(dists, chosen, job.image, job.wheelhouse)
    return chosen


def kernels_entry(kernels: Path, image: str) -> dict:
    """The export's entry for the kernels wheel built from the image's sources."""
    version = kernels.name.split("-")[1]
    return {
        "name": KERNELS_DIST, "version": version, "local": local_label(version),
        "filename": kernels.name, "sha256": sha256_file(kernels),
        "source": f"built by attnforge from {image}:/opt/attnforge/src",
    }  # fmt: skip


def _fill(eng: Engine, job: ExportJob, probe: dict, dists: list[Dist], tmp: Path) -> dict:
    """Write the export's wheels and files into `tmp`; its manifest."""
    fetch = tmp / ".fetch"
    fetch.mkdir()
    chosen = gather_wheels(eng, job, dists, fetch)
    wheels_dir = tmp / WHEELS
    wheels_dir.mkdir()
    entries = []
    for d in dists:
        path, source = chosen[d.key]
        shutil.copy2(path, wheels_dir / path.name)
        entries.append(wheel_entry(d, wheels_dir / path.name, source))
    entries.append(kernels_entry(kernels_wheel(fetch / "src", wheels_dir), job.image))
    shutil.rmtree(fetch)
    manifest = {
        "kind": EXPORT_KIND, "version": EXPORT_VERSION, "arch": job.arch, "stack": job.stack,
        "image": job.image, "image_id": job.image_id, "python": probe["python"],
        "env": probe["env"], "validation": job.record,
        "verdict": "passed" if job.record.get("passed") else "failed",
        "wheels": entries,
    }  # fmt: skip
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (tmp / REQUIREMENTS).write_text(requirements_text(manifest))
    (tmp / PYLOCK).write_text(pylock_text(manifest))
    (tmp / ENV_FILE).write_text(env_text(manifest))
    return manifest


def replace_dir(tmp: Path, target: Path) -> None:
    """Move a finished export into place; the last one is removed only after."""
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)


def write_export(eng: Engine, job: ExportJob, target: Path) -> dict:
    """Export the validated image's exact wheels into `target` (the last export stays until the
    new one is complete); its manifest."""
    probe = probe_image(eng, job.image, "--records")
    dists, broken = dists_of(probe)
    if broken:
        raise UserError(f"{job.image} has damaged metadata: {'; '.join(broken)}")
    dists = sorted((d for d in dists if d.key not in TOOLING), key=lambda d: d.key)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; an export is for users to read
    try:
        manifest = _fill(eng, job, probe, dists, tmp)
        (tmp / "README.md").write_text(readme_text(manifest, target.resolve()))
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def readme_text(m: dict, where: Path) -> str:
    """The export's README.md: what was validated and how to install it."""
    py = m["python"]
    env = ", ".join(f"{k}={v}" for k, v in m["env"].items() if v) or "none"
    return f"""# {m["stack"]} for {m["arch"]}, as validated

Image {m["image"]} ({m["image_id"]}), validation {m["verdict"]} (exit {m["validation"].get("exit")}).
Its wheels are built for Python {py["version"]} ({py["tag"]}, {py["platform"]}): use a Python of
that version.

## Install

python{py["version"].rsplit(".", 1)[0]} -m venv ~/attn-venv
{install_command(m, "~/attn-venv/bin/python", f"{where}/")}
. {where}/{ENV_FILE}     # the environment the image sets: {env}
invoke verify-env --python ~/attn-venv/bin/python --against {where}

{built_here(m)}pip 26.3 also installs from the PEP 751 lock ({PYLOCK}; experimental in pip): run
`~/attn-venv/bin/python -m pip install --no-index -r {PYLOCK}` inside {where}.
"""


def built_here(m: dict) -> str:
    """The wheels a source-built layer compiled in the image: each for one Python and platform."""
    built = [w for w in m["wheels"] if w["source"].startswith("built in the image")]
    if not built:
        return ""
    lines = ["Built from source in the image (each wheel runs only on the Python and platform its",
             "name carries; the requirements install them too):", ""]  # fmt: skip
    for w in built:
        _, _, _, tags = parse_wheel_filename(w["filename"])
        tag = sorted(tags, key=str)[0]
        py = m["python"]["version"].rsplit(".", 1)[0]
        lines.append(f"  # {w['name']} {w['version']}: {tag.interpreter}, {tag.platform}")
        lines.append(f"  echo '{w['sha256']}  wheels/{w['filename']}' | sha256sum -c")
        lines.append(f"  python{py} -m pip install --no-deps wheels/{w['filename']}")
    return "\n".join(lines) + "\n\n"
