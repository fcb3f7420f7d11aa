"""invoke export / invoke verify-env: a validated stack outside containers, and an environment
held against it."""

from __future__ import annotations

import functools
import json as jsonlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from invoke.exceptions import Exit

from ..console import out, user_errors
from ..engine import RunRequest, connect
from ..errors import UserError
from ..workspace import VALIDATED, Workspace
from . import (
    ARCH,
    ENGINE,
    IN_DIR,
    NAMESPACE,
    OUT_DIR,
    STACK,
    Opt,
    _existing,
    choose_target,
    command,
    text,
)


@functools.cache
def probe_source() -> str:
    """envprobe's source, read when a probe runs (the library is imported where a task uses it:
    attnforge/cli/__init__.py)."""
    from ..image import envprobe

    return Path(envprobe.__file__).read_text()


def validated_image(
    ws: Workspace, recipes, eng, arch: str, stack: str, namespace: str
) -> tuple[str, str, dict]:
    """(final tag, image id, validation stamp) of a stack whose final image passed `invoke
    validate`; the same refusals as `invoke publish`."""
    from ..multiarch import ArchSet
    from ..plan import Options, resolve

    final = resolve(recipes, arch, stack, Options(namespace=namespace)).final_tag
    final_id = eng.image_id(final) if final else None
    if final_id is None:
        raise UserError(f"no image {final}", hint=f"invoke build --arch {arch} --stack {stack}")
    from ..mirror.use import refuse_rehearsal
    from .publish import set_validation, single_validation

    refuse_rehearsal(eng.labels(final), final, "exported")

    if isinstance(recipes.arches[arch], ArchSet):  # every arch of the set passed on this image
        return final, final_id, set_validation(ws, recipes.arches[arch], stack, final, final_id)
    return final, final_id, single_validation(ws, arch, stack, final, final_id, done="exported")


def probe_image(eng, image: str, *flags: str) -> dict:
    """envprobe's document for the image's Python (the script goes in on stdin)."""
    proc = eng.run(
        RunRequest(image=image, command=["python3", "-", *flags], stdin=True, network="none"),
        input=probe_source(),
        timeout=600,
    )
    if proc.returncode != 0:
        raise UserError(f"probing the Python of {image} failed: {proc.stderr.strip()[-500:]}")
    return jsonlib.loads(proc.stdout)


def fetch_in_image(
    eng,
    image: str,
    dest: Path,
    specs: list[str],
    wheelhouse: Path | None,
    ca_cert: Path | None,
    indexes: list[str] = (),
) -> subprocess.CompletedProcess[str]:
    """In the image (its pip, Python and platform): copy out its kernels sources and the wheels
    a source build kept, and download the pinned wheels no local folder had, with the index
    pip resolved each from (pip's --report)."""
    from .. import export as core

    script = [
        "set -e",
        "cp -r /opt/attnforge/src /out/src",
        f"mkdir -p /out/built && if [ -d {core.IMAGE_WHEELS} ]; then cp {core.IMAGE_WHEELS}/*.whl /out/built/ 2>/dev/null || true; fi",
    ]
    if specs:
        (dest / "specs.txt").write_text("\n".join(specs) + "\n")
        links = "--find-links /wheelhouse" if wheelhouse else ""
        # the indexes the stack's layers install from (AMD's, PyTorch's), beside PyPI; one retry,
        # so that an index this network cannot reach costs seconds, not minutes (a wheel that is
        # then missing is named below; a wrong one never matches the installed RECORD)
        links += "".join(f" --extra-index-url {shlex.quote(url)}" for url in indexes)
        script += [
            "if [ -s /run/ca.crt ]; then export PIP_CERT=/run/ca.crt; fi",
            f"pip install -q --retries 1 --dry-run --ignore-installed --no-deps --only-binary=:all: {links} --report /out/report.json -r /out/specs.txt",
            f"pip download -q --retries 1 --no-deps --only-binary=:all: {links} -d /out/downloaded -r /out/specs.txt",
        ]
    mounts = [(dest, "/out", False)]
    if wheelhouse:
        mounts.append((wheelhouse, "/wheelhouse", True))
    if ca_cert:
        mounts.append((ca_cert, "/run/ca.crt", True))
    req = RunRequest(
        image=image, command=["bash", "-c", "\n".join(script)], mounts=mounts,
        env={"HOME": "/tmp", "PIP_CACHE_DIR": "/tmp/pip-cache"},
        extra=["--user", f"{os.getuid()}:{os.getgid()}"],
    )  # fmt: skip
    return eng.run(req, timeout=1800)


def _replace_dir(tmp: Path, target: Path) -> None:
    """Move a finished export into place; the last one is removed only after."""
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)


@command(
    options={
        "arch": ARCH,
        "stack": STACK,
        "output": OUT_DIR,
        "namespace": NAMESPACE,
        "wheelhouse": IN_DIR,
        "ca_cert": text("FILE"),
        "engine": ENGINE,
    },  # fmt: skip
    writes=("build",),
    help={
        "arch": "arch of the validated stack (default: the host's AMD GPU, else cpu)",
        "stack": "stack to export (default: as for build)",
        "output": "folder to write (default: build/export/<arch>/<stack>)",
        "namespace": "local image name prefix the stack was built under (default: attnforge)",
        "wheelhouse": "folder of wheels to take files from first (default: build/wheelhouse)",
        "ca_cert": "CA bundle pip trusts when it downloads a wheel in the image (default: the host's; 'none': pip's own)",
        "engine": "container engine: docker (default) or podman",
        "debug": "show tracebacks",
    },
)
@user_errors
def export(c, arch=None, stack=None, output=None, namespace="attnforge", wheelhouse=None,
           ca_cert=None, engine="docker", debug=False):  # fmt: skip
    """Write a validated stack's exact wheels, hashes, environment and verdict for a venv."""
    from .. import export as core
    from ..recipes import load_recipes

    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    arch, stack = choose_target(recipes, arch, stack)
    eng = connect(engine)
    final, final_id, record = validated_image(ws, recipes, eng, arch, stack, namespace)
    house = Path(wheelhouse) if wheelhouse else ws.wheelhouse
    if wheelhouse and not house.is_dir():
        raise UserError(f"--wheelhouse {wheelhouse}: no such folder")
    ca = _ca_cert(ca_cert)
    target = Path(output) if output else ws.build_dir / "export" / arch / stack
    target.parent.mkdir(parents=True, exist_ok=True)

    out.print(f"exporting the validated {final} ({final_id[:19]})", markup=False)
    probe = probe_image(eng, final, "--records")
    dists, broken = core.dists_of(probe)
    if broken:
        raise UserError(f"{final} has damaged metadata: {'; '.join(broken)}")
    dists = sorted((d for d in dists if d.key not in core.TOOLING), key=lambda d: d.key)

    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; an export is for users to read
    try:
        wheels_dir = tmp / core.WHEELS
        wheels_dir.mkdir()
        chosen: dict[str, tuple[Path, str]] = {}
        for d in dists:
            for cand in core.candidate_wheels(d.name, d.version, [house]):
                if core.wheel_matches(cand, d.record):
                    chosen[d.key] = (cand, f"wheelhouse {house}")
                    break
        fetch = tmp / ".fetch"
        fetch.mkdir()
        specs = [f"{d.key}=={d.version}" for d in dists if d.key not in chosen]
        proc = fetch_in_image(eng, final, fetch, specs, house if house.is_dir() else None, ca,
                              stack_indexes(recipes, arch, stack))  # fmt: skip
        if proc.returncode != 0:
            raise UserError(
                f"fetching wheels in {final} failed: {(proc.stderr or proc.stdout).strip()[-800:]}"
            )
        urls = _report_urls(fetch / "report.json")
        for d in dists:
            if d.key in chosen:
                continue
            for folder, source in ((fetch / "built", f"built in the image ({core.IMAGE_WHEELS})"),
                                   (fetch / "downloaded", None)):  # fmt: skip
                for cand in core.candidate_wheels(d.name, d.version, [folder]):
                    if core.wheel_matches(cand, d.record):
                        chosen[d.key] = (cand, source or urls.get(cand.name, "downloaded by pip"))
                        break
                if d.key in chosen:
                    break
        unmatched = [f"{d.key}=={d.version}" for d in dists if d.key not in chosen]
        from_source = [
            f"{d.key}=={d.version}" for d in dists
            if d.key not in chosen and "dir_info" in (d.direct_url or {})
        ]  # fmt: skip
        if from_source:
            raise UserError(
                f"{', '.join(from_source)} {'was' if len(from_source) == 1 else 'were'} built from a "
                f"source tree in {final} and no wheel of it was kept in {core.IMAGE_WHEELS}; "
                "nothing was exported",
                hint="rebuild that layer with a Dockerfile that keeps its wheel there "
                "(dockerfiles/pytorch-source.Dockerfile does)",
            )
        if unmatched:
            raise UserError(
                f"no wheel whose files match what {final} installed was found for "
                f"{', '.join(unmatched)}; nothing was exported",
                hint=f"put those wheels in {house} (or pass --wheelhouse) and run it again",
            )
        entries = []
        for d in dists:
            path, source = chosen[d.key]
            shutil.copy2(path, wheels_dir / path.name)
            entries.append(core.wheel_entry(d, wheels_dir / path.name, source))
        kernels = core.kernels_wheel(fetch / "src", wheels_dir)
        entries.append({
            "name": core.KERNELS_DIST, "version": kernels.name.split("-")[1],
            "local": core.local_label(kernels.name.split("-")[1]), "filename": kernels.name,
            "sha256": core.sha256_file(kernels), "source": f"built by attnforge from {final}:/opt/attnforge/src",
        })  # fmt: skip
        shutil.rmtree(fetch)
        manifest = {
            "kind": core.EXPORT_KIND, "version": core.EXPORT_VERSION, "arch": arch, "stack": stack,
            "image": final, "image_id": final_id, "python": probe["python"],
            "env": probe["env"], "validation": record,
            "verdict": "passed" if record.get("passed") else "failed",
            "wheels": entries,
        }  # fmt: skip
        (tmp / core.MANIFEST).write_text(jsonlib.dumps(manifest, indent=2) + "\n")
        (tmp / core.REQUIREMENTS).write_text(core.requirements_text(manifest))
        (tmp / core.PYLOCK).write_text(core.pylock_text(manifest))
        (tmp / core.ENV_FILE).write_text(core.env_text(manifest))
        (tmp / "README.md").write_text(_readme(manifest, target.resolve()))
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    out.print(
        _readme(manifest, target.resolve()).split("## Install", 1)[1].strip(),
        markup=False,
        highlight=False,
    )
    out.print(f"[green]exported[/] {len(entries)} wheels of the validated {final} to {target}")


def stack_indexes(recipes, arch: str, stack: str) -> list[str]:
    """The package indexes the stack's layers name (*_INDEX_URL args and hints)."""
    from ..plan import resolve

    plan = resolve(recipes, arch, stack)
    return sorted({
        str(v) for s in plan.steps for k, v in {**s.args, **s.hint_args}.items()
        if k.endswith("INDEX_URL") and v
    })  # fmt: skip


def _ca_cert(value: str | None) -> Path | None:
    if value == "none":
        return None
    path = Path(value or "/etc/ssl/certs/ca-certificates.crt")
    if value and not path.is_file():
        raise UserError(f"--ca-cert {value}: no such file (pass a CA bundle, or 'none')")
    return path if path.is_file() else None


def _report_urls(report: Path) -> dict[str, str]:
    """wheel file name -> the URL pip resolved it from, out of `pip install --report`."""
    if not report.is_file():
        return {}
    found = {}
    for item in jsonlib.loads(report.read_text()).get("install", []):
        url = (item.get("download_info") or {}).get("url", "")
        if url:
            found[url.rsplit("/", 1)[-1].split("#")[0].replace("%2B", "+")] = url.split("#")[0]
    return found


def _readme(m: dict, where: Path) -> str:
    from .. import export as core

    py = m["python"]
    env = ", ".join(f"{k}={v}" for k, v in m["env"].items() if v) or "none"
    return f"""# {m["stack"]} for {m["arch"]}, as validated

Image {m["image"]} ({m["image_id"]}), validation {m["verdict"]} (exit {m["validation"].get("exit")}).
Its wheels are built for Python {py["version"]} ({py["tag"]}, {py["platform"]}): use a Python of
that version.

## Install

python{py["version"].rsplit(".", 1)[0]} -m venv ~/attn-venv
{core.install_command(m, "~/attn-venv/bin/python", f"{where}/")}
. {where}/{core.ENV_FILE}     # the environment the image sets: {env}
invoke verify-env --python ~/attn-venv/bin/python --against {where}

{_built_here(m)}pip 26.3 also installs from the PEP 751 lock ({core.PYLOCK}; experimental in pip): run
`~/attn-venv/bin/python -m pip install --no-index -r {core.PYLOCK}` inside {where}.
"""


def _built_here(m: dict) -> str:
    """The wheels a source-built layer compiled in the image: each for one Python and platform."""
    from packaging.utils import parse_wheel_filename

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


def verdict_text(code: int) -> str:
    from .. import export as core

    return {
        core.SAME: "same as validated",
        core.DIFFERS: "differs from the validated stack",
        core.FAILS: "differs from the validated stack and fails validation",
    }[code]


def load_against(ws: Workspace, against: str, engine: str) -> tuple[dict, Path | None]:
    """(manifest, export folder or None) for --against: an export folder or its export.json, a
    report.json (the image its validated.json names), or an image reference."""
    from .. import export as core

    path = Path(against)
    if path.is_dir() and (path / core.MANIFEST).is_file():
        path = path / core.MANIFEST
    if path.is_file() and path.name == core.MANIFEST:
        manifest = jsonlib.loads(path.read_text())
        if manifest.get("kind") != core.EXPORT_KIND:
            raise UserError(f"--against {against}: not an attnforge export")
        return manifest, path.parent
    if path.is_file() and path.suffix == ".json":
        stamp = path.with_name(VALIDATED)
        if not stamp.is_file():
            raise UserError(
                f"--against {against}: no {VALIDATED} beside that report, so which image it "
                "validated is unknown"
            )
        record = jsonlib.loads(stamp.read_text())
        manifest = _image_manifest(engine, record.get("image_id") or record.get("image"), record)
        manifest["image"] = f"{record.get('image')} as validated ({against})"
        return manifest, None
    if path.exists():
        raise UserError(
            f"--against {against}: expected an export folder, its {core.MANIFEST}, a report.json "
            "or an image"
        )
    return _image_manifest(engine, against, None), None


def _image_manifest(engine: str, image: str, record: dict | None) -> dict:
    from .. import export as core

    eng = connect(engine)
    image_id = eng.image_id(image)
    if image_id is None:
        raise UserError(f"--against {image}: no such image, export folder or report")
    probe = probe_image(eng, image)
    meta = {"image": image, "image_id": image_id, "env": probe["env"], "validation": record or {}}
    return core.manifest_from_image_probe(probe, meta)


@command(
    name="verify-env",
    options={
        "python": Opt("PYTHON", _existing("file"), kind="in_file"),
        "against": text("EXPORT|REPORT|IMAGE"),
        "engine": ENGINE,
    },
    help={
        "python": "the interpreter of the environment to check (default: the one running invoke)",
        "against": "an export folder (invoke export), a report.json, or an image (required)",
        "validate": "also run the validation suite (`python -m validate all --quick`) with that interpreter",
        "json": "print the differences and the verdict as JSON",
        "engine": "container engine, for --against IMAGE: docker (default) or podman",
        "debug": "show tracebacks",
    },
)
@user_errors
def verify_env(c, against=None, python=None, validate=False, json=False, engine="docker",
               debug=False):  # fmt: skip
    """Compare a Python environment with a validated stack; exit 0 same, 1 differs, 3 differs and fails validation."""
    from .. import export as core

    if not against:
        raise UserError("--against is required: an export folder, a report.json or an image")
    ws = Workspace.discover()
    python = python or sys.executable
    if not (Path(python).is_file() and os.access(python, os.X_OK)):
        raise UserError(f"--python {python}: no such interpreter")
    manifest, export_dir = load_against(ws, against, engine)
    proc = subprocess.run(
        [python, "-", "--verify"], input=probe_source(), capture_output=True, text=True,
        cwd=tempfile.gettempdir(),  # not the tree: its packages would shadow the environment's
    )  # fmt: skip
    if proc.returncode != 0:
        raise UserError(f"probing {python} failed: {proc.stderr.strip()[-500:]}")
    probe = jsonlib.loads(proc.stdout)
    diffs = core.compare(manifest, probe, export_dir.resolve() if export_dir else None)
    verdict_doc = None
    if validate:
        verdict_doc = _validate_with(ws, python, _expect(ws, manifest))
    code = core.SAME
    if diffs:
        code = core.FAILS if verdict_doc and not verdict_doc["passed"] else core.DIFFERS
    text = verdict_text(code)
    if diffs == [] and verdict_doc and not verdict_doc["passed"]:
        text = "same as validated, but validation fails here"
        code = core.FAILS
    doc = {
        "against": manifest.get("image"), "image_id": manifest.get("image_id"), "python": python,
        "verdict": text, "exit": code, "differences": [d.to_dict() for d in diffs],
        "validation": verdict_doc,
    }  # fmt: skip
    if json:
        print(jsonlib.dumps(doc, indent=2))
    else:
        for d in diffs:
            out.print(f"- {d.sentence}", markup=False, highlight=False)
        if verdict_doc:
            out.print(f"python -m validate all: {'passed' if verdict_doc['passed'] else 'failed'} "
                      f"(exit {verdict_doc['exit']}); report {verdict_doc['report']}", markup=False)  # fmt: skip
        out.print(f"{python}: {text} ({manifest.get('image')})", markup=False)
    if code:
        raise Exit(code=code)


def _expect(ws: Workspace, manifest: dict) -> dict | None:
    """The stack's expectations, when the manifest names a stack the recipes still have."""
    arch, stack = manifest.get("arch"), manifest.get("stack")
    if not arch or not stack:
        return None
    from ..plan import resolve
    from ..recipes import load_recipes
    from ..validation import expect_document

    try:
        recipes = load_recipes(ws.root)
        return expect_document(recipes, resolve(recipes, arch, stack))
    except UserError:
        return None


def _validate_with(ws: Workspace, python: str, expect: dict | None) -> dict:
    """`python -m validate all` with the environment's interpreter: its own kernels and
    validate packages when installed (the export's wheel), else the tree's."""
    report = Path(tempfile.mkdtemp(prefix="attnforge-verify-env-")) / "report.json"
    has_own = subprocess.run([python, "-c", "import validate, kernels"], capture_output=True,
                             cwd=tempfile.gettempdir()).returncode == 0  # fmt: skip
    argv = [python, "-m", "validate", "all", "--quick", "--json", str(report)]
    if expect:
        (report.parent / "expect.json").write_text(jsonlib.dumps(expect))
        argv += ["--expect", str(report.parent / "expect.json")]
    proc = subprocess.run(
        argv,
        cwd=tempfile.gettempdir() if has_own else ws.root, capture_output=True, text=True,
    )  # fmt: skip
    return {"passed": proc.returncode == 0, "exit": proc.returncode, "report": str(report),
            "suite": "installed" if has_own else f"{ws.root}"}  # fmt: skip
