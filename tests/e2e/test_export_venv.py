"""End to end on a real Docker engine: the validated cpu stack, exported and installed without
containers, and a venv held against it.

Builds the cpu stack in a copy of the tree under its own namespace; `invoke export` refuses it
until it passed `invoke validate`; the export is installed offline into a fresh venv (pip with no
index and no configuration, only the export's wheels and hashes); `invoke verify-env` calls that
venv the same as validated, with the suite passing in it; then a removed wheel, a changed version
and a corrupted RECORD are planted and each is named. Last, the validated image is published to
the local registry, its SBOM and provenance are fetched back by digest, and a forged SBOM fails
`invoke verify`. The tests in this module run in order and share one tree.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from attnforge import export as core
from attnforge.publish import ociregistry
from attnforge.publish.ociregistry import Ref
from tests.e2e.conftest import cpu_stack_tree
from tests.e2e.test_cpu_stack import CPU_LAYERS, REGISTRY, _need_registry, invoke

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = f"attnforge-e2e-export-{uuid.uuid4().hex[:8]}"


tree = cpu_stack_tree("e2e-export", NAMESPACE)


def said(proc: subprocess.CompletedProcess[str]) -> str:
    return " ".join((proc.stdout + proc.stderr).split())


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The venv's pip with no configuration file (this machine's pip.conf names its own indexes)."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    env = {k: v for k, v in env.items() if not k.startswith("PIP_") or k == "PIP_CONFIG_FILE"}
    return subprocess.run([str(venv / "bin/python"), "-m", "pip", *args], capture_output=True,
                          text=True, env=env, timeout=900)  # fmt: skip


def verify(tree: Path, venv: Path, export: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return invoke(tree, "verify-env", "--python", str(venv / "bin/python"), "--against",
                  str(export), *extra, timeout=1800)  # fmt: skip


def test_export_refuses_an_image_that_was_not_validated(tree):
    refused = invoke(tree, "export", "--arch", "cpu", "--namespace", NAMESPACE)
    assert refused.returncode == 2  # a user's error, as for every task
    assert f"{NAMESPACE}/cpu:cpu was never validated here; it is not exported" in said(refused)
    assert not (tree / "build/export/cpu/cpu").exists()


def test_export_writes_the_validated_wheels_with_their_hashes(tree):
    validated = invoke(tree, "validate", "--arch", "cpu", "--namespace", NAMESPACE, "--quick")
    assert validated.returncode == 0, validated.stdout[-3000:] + validated.stderr[-3000:]
    exported = invoke(tree, "export", "--arch", "cpu", "--namespace", NAMESPACE)
    assert exported.returncode == 0, exported.stdout[-3000:] + exported.stderr[-3000:]
    where = tree / "build/export/cpu/cpu"
    manifest = json.loads((where / "export.json").read_text())
    stamp = json.loads((tree / "reports/cpu/cpu/validated.json").read_text())
    assert manifest["image_id"] == stamp["image_id"] and manifest["verdict"] == "passed"
    wheels = {w["name"]: w for w in manifest["wheels"]}
    assert wheels["torch"]["version"] == "2.13.0+cpu" and wheels["torch"]["local"] == "cpu"
    assert wheels["torch"]["source"].startswith("wheelhouse ")
    assert {"triton", "numpy", "filelock", "sympy", core.KERNELS_DIST} <= set(wheels)
    assert not set(wheels) & core.TOOLING
    for w in manifest["wheels"]:
        data = (where / "wheels" / w["filename"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == w["sha256"], w["name"]
    requirements = (where / "requirements.txt").read_text()
    assert f"torch==2.13.0+cpu \\\n    --hash=sha256:{wheels['torch']['sha256']}" in requirements
    lock = pytest.importorskip("tomllib").loads((where / "pylock.toml").read_text())
    assert {p["name"] for p in lock["packages"]} == set(wheels)


def test_the_export_installs_offline_into_a_fresh_venv_that_verifies_as_validated(
    tree, tmp_path_factory
):
    where = tree / "build/export/cpu/cpu"
    venv = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    installed = pip(venv, "install", "--no-index", "--find-links", str(where / "wheels"),
                    "--require-hashes", "--no-deps", "-r", str(where / "requirements.txt"))  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    same = verify(tree, venv, where, "--validate")
    assert same.returncode == 0, same.stdout[-3000:] + same.stderr[-3000:]
    assert "same as validated" in said(same)
    assert "python -m validate all: passed" in said(same)
    # the report (the image its validated.json names) and the image itself are manifests too
    report = tree / "reports/cpu/cpu/report.json"
    for against in (report, f"{NAMESPACE}/cpu:cpu"):
        proc = invoke(
            tree, "verify-env", "--python", str(venv / "bin/python"), "--against", str(against)
        )
        assert proc.returncode == 0, said(proc)[-3000:]
        assert "same as validated" in said(proc)


def test_a_removed_wheel_a_changed_version_and_a_corrupted_record_are_each_named(
    tree, tmp_path_factory
):
    where = tree / "build/export/cpu/cpu"
    venv = next(tmp_path_factory.getbasetemp().glob("user*/venv"))
    site = Path(next((venv / "lib").glob("python3.*/site-packages")))
    manifest = json.loads((where / "export.json").read_text())
    wheels = {w["name"]: w for w in manifest["wheels"]}

    removed = pip(venv, "uninstall", "-y", "numpy")
    assert removed.returncode == 0, removed.stderr
    # Another build of the kernels wheel: an older version, installed over the exported one.
    older = core.kernels_wheel(site, tmp_path_factory.mktemp("older"), base_version="0.0.9")
    changed = pip(venv, "install", "--no-index", "--no-deps", "--force-reinstall", str(older))
    assert changed.returncode == 0, changed.stderr
    # A recorded hash that no longer matches its file: damaged metadata pip calls satisfied.
    record = next(site.glob("filelock-*.dist-info")) / "RECORD"
    lines = record.read_text().splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("filelock/__init__.py,"))
    path, _, size = lines[i].split(",")
    lines[i] = f"{path},sha256={'A' * 43},{size}"
    record.write_text("\n".join(lines) + "\n")

    differs = verify(tree, venv, where)
    text = said(differs)
    assert differs.returncode == 1, text[-3000:]
    assert f"numpy=={wheels['numpy']['version']} is missing; fix: " in text
    kernels = wheels[core.KERNELS_DIST]["version"]
    assert (
        f"{core.KERNELS_DIST} is {older.name.split('-')[1]} where the validated stack has {kernels}"
        in text
    )
    assert "filelock " in text and "filelock/__init__.py does not match its recorded hash" in text
    assert "differs from the validated stack" in text

    as_json = verify(tree, venv, where, "--json")
    doc = json.loads(as_json.stdout)
    assert doc["exit"] == 1 and {d["kind"] for d in doc["differences"]} == {
        "missing",
        "version",
        "record",
    }


def test_a_differing_venv_that_also_fails_the_suite_exits_3(tree, tmp_path_factory):
    venv = next(tmp_path_factory.getbasetemp().glob("user*/venv"))
    # numpy is gone, so Triton's interpreter cannot run the kernels' cases.
    failing = verify(tree, venv, tree / "build/export/cpu/cpu", "--validate")
    assert failing.returncode == 3, said(failing)[-3000:]
    assert "differs from the validated stack and fails validation" in said(failing)


def test_publish_attaches_an_sbom_and_provenance_that_verify_checks(tree):
    """The validated image, published to the local registry: its SBOM and provenance are fetched
    back by digest, name that digest, and a tampered attachment fails `invoke verify`."""
    _need_registry()
    target = f"{REGISTRY}/{NAMESPACE}"
    published = invoke(tree, "publish", "--arch", "cpu", "--namespace", NAMESPACE, "--to", target)
    assert published.returncode == 0, said(published)[-3000:]
    manifest = json.loads((tree / "reports/cpu/cpu/publish.json").read_text())
    final = f"{target}/cpu:cpu"
    digest = next(r["digest"] for r in manifest["refs"] if r["ref"] == final)
    subject = Ref.parse(final)
    sbom = ociregistry.fetch_attachment(subject, digest, "sbom")
    prov = ociregistry.fetch_attachment(subject, digest, "att")
    assert sbom["digest"] == manifest["attestations"]["sbom"]["digest"]
    assert prov["digest"] == manifest["attestations"]["provenance"]["digest"]
    assert sbom["manifest"]["subject"]["digest"] == digest
    doc = json.loads(sbom["payload"])
    assert doc["metadata"]["component"]["version"] == digest
    purls = {c.get("purl", "") for c in doc["components"]}
    assert any(p.startswith("pkg:pypi/torch@2.13.0") for p in purls)
    assert any(p.startswith("pkg:deb/debian/python3@") for p in purls)
    statement = json.loads(base64.b64decode(json.loads(prov["payload"])["payload"]))
    assert statement["subject"][0]["digest"] == {"sha256": digest.removeprefix("sha256:")}
    layers = [
        i["layer"]
        for i in statement["predicate"]["buildDefinition"]["internalParameters"]["layers"]
    ]
    assert layers == CPU_LAYERS

    for ref in (final, f"{target}/cpu@{digest}"):
        ok = invoke(tree, "verify", "--image", ref)
        assert ok.returncode == 0, said(ok)[-2000:]
        assert "verified" in said(ok)

    # Tampered: an SBOM that claims another image, pushed over the attachment's tag.
    forged = json.dumps({**doc, "metadata": {**doc["metadata"], "component": {
        **doc["metadata"]["component"], "version": "sha256:" + "0" * 64}}}).encode()  # fmt: skip
    ociregistry.attach(subject, digest, "sbom", "application/vnd.cyclonedx+json",
                       "application/vnd.cyclonedx+json", forged)  # fmt: skip
    bad = invoke(tree, "verify", "--image", final)
    assert bad.returncode == 1, said(bad)[-2000:]
    assert f"the SBOM describes sha256:{'0' * 64}, not {digest}" in said(bad)
