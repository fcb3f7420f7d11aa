"""End to end on a real Docker engine: the validated cpu stack, exported and installed without
containers, and a venv held against it.

The stack is the session's one build, tagged into this module's namespace (tests/e2e/conftest.py);
`invoke export` refuses it until it is validated, which it then is by the session's one
validation copied into this module's tree (its stamp names the same image id); the export is
installed offline into a fresh venv (pip with no index and no configuration, only the export's
wheels and hashes); `invoke verify-env` calls that venv the same as validated, with the suite
passing in it; then a removed wheel, a changed version and a corrupted RECORD are planted and
each is named. Publishing it, its SBOM and provenance are test_cpu_stack_publish.py's. The tests
in this module run in order and share one tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from attnforge import export as core
from tests.e2e.conftest import copy_validated, cpu_stack_tree
from tests.e2e.test_cpu_stack import invoke

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


def test_export_writes_the_validated_wheels_with_their_hashes(tree, validated_cpu_stack):
    copy_validated(validated_cpu_stack, tree)  # a passing `invoke validate` of the same image id
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
