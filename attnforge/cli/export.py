"""invoke export / invoke verify-env: a validated stack outside containers, and an environment
held against it."""

from __future__ import annotations

import json as jsonlib
import subprocess
import sys
import tempfile
from pathlib import Path

from invoke.exceptions import Exit

from ..console import out, user_errors
from ..engine import connect
from ..errors import UserError
from ..workspace import VALIDATED, Workspace
from . import (
    ARCH,
    CA_CERT,
    ENGINE,
    IN_DIR,
    INTERPRETER,
    NAMESPACE,
    OUT_DIR,
    STACK,
    Opt,
    choose_target,
    command,
    nonempty,
)


@command(
    options={
        "arch": ARCH,
        "stack": STACK,
        "output": OUT_DIR,
        "namespace": NAMESPACE,
        "wheelhouse": IN_DIR,
        "ca_cert": CA_CERT,
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
    from ..plan import resolve
    from ..recipes import load_recipes
    from ..validation import validated_image

    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    arch, stack = choose_target(recipes, arch, stack)
    eng = connect(engine)
    final, final_id, record = validated_image(ws, recipes, eng, arch, stack, namespace, "exported")
    job = core.ExportJob(
        arch=arch, stack=stack, image=final, image_id=final_id, record=record,
        wheelhouse=Path(wheelhouse) if wheelhouse else ws.wheelhouse,
        ca_cert=core.ca_bundle(ca_cert), indexes=core.stack_indexes(resolve(recipes, arch, stack)),
    )  # fmt: skip
    target = Path(output) if output else ws.build_dir / "export" / arch / stack
    out.print(f"exporting the validated {final} ({final_id[:19]})", markup=False)
    manifest = core.write_export(eng, job, target)
    install = core.readme_text(manifest, target.resolve()).split("## Install", 1)[1].strip()
    out.print(install, markup=False, highlight=False)
    out.print(f"[green]exported[/] {len(manifest['wheels'])} wheels of the validated {final} "
              f"to {target}")  # fmt: skip


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
    from ..probing import probe_image

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
        "python": INTERPRETER,
        "against": Opt(
            "EXPORT|REPORT|IMAGE",
            nonempty,
            required=True,
            needs="--against is needed: an export folder, a report.json or an image",
        ),
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
    from ..probing import probe_python

    ws = Workspace.discover()
    python = python or sys.executable
    manifest, export_dir = load_against(ws, against, engine)
    probe = probe_python(python, "--verify")
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
    has_own = subprocess.run([python, "-c", "import validate, attnforge_kernels"], capture_output=True,
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
