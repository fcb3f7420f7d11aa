"""`invoke publish` against a real Docker engine when the registry or the name fails: one sentence,
the tags it made removed, no publish.json (issue 28). The image is a labelled copy of the local
base image, stamped as validated, so no stack is built; port 9 on this host refuses connections,
a registry that does not answer."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from tests.conftest import REPO, run_invoke
from tests.e2e.test_cpu_stack import BASE, remove_images, require_engine

pytestmark = [pytest.mark.e2e]

NAMESPACE = f"attnforge-pubfail-{uuid.uuid4().hex[:8]}"
DOWN = "127.0.0.1:9/team"  # nothing listens on port 9


def _tags() -> set[str]:
    """The engine's tags under the registries these tests publish to (other tags come and go
    with whatever else runs on this engine)."""
    out = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return {t for t in out.split() if t.startswith("127.0.0.1:9/")}


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """A final image `NAMESPACE/cpu:cpu` with a one-layer lineage, stamped as validated."""
    require_engine()
    image = f"{NAMESPACE}/cpu:cpu-bbbb"
    subprocess.run(
        ["docker", "build", "-q", "-t", image, "--label",
         'org.attnforge.lineage=[["cpu", "bbbb"]]', "-"],
        input=f"FROM {BASE}\n", text=True, capture_output=True, check=True,
    )  # fmt: skip
    subprocess.run(["docker", "tag", image, f"{NAMESPACE}/cpu:cpu"], check=True)
    image_id = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", image],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    base = tmp_path_factory.mktemp("publish")
    stamp = base / "reports" / "cpu" / "cpu" / "validated.json"
    stamp.parent.mkdir(parents=True)
    stamp.write_text(json.dumps({"image_id": image_id, "passed": True}))
    # What a build records of each layer it built (attnforge/build.py InputStore): publish
    # gathers the provenance from it before pushing anything, and refuses without it.
    inputs = base / "build" / "state" / "inputs" / "cpu" / "cpu.json"
    inputs.parent.mkdir(parents=True)
    inputs.write_text(json.dumps({"key": "bbbb" + "0" * 60, "tag": image,
                                  "input": {"layer": "cpu", "arch": "cpu", "args": {}}}))  # fmt: skip
    env = {
        "ATTNFORGE_BUILD_DIR": str(base / "build"),
        "ATTNFORGE_REPORTS_DIR": str(base / "reports"),
    }
    yield env, stamp.parent
    remove_images(NAMESPACE)


def _publish(env, to):
    import os

    proc = run_invoke(REPO, "publish", "--arch", "cpu", "--stack", "cpu", "--namespace",
                      NAMESPACE, "--to", to, env={**os.environ, **env}, timeout=300)  # fmt: skip
    return proc.returncode, " ".join((proc.stdout + proc.stderr).split())


def test_an_unreachable_registry_is_one_sentence_and_leaves_no_tags(validated):
    env, folder = validated
    code, said = _publish(env, DOWN)
    assert code == 2 and "Traceback" not in said, said
    assert f"publishing to {DOWN} failed: pushing {DOWN}/cpu:cpu-bbbb failed" in said
    assert not _tags() and not (folder / "publish.json").exists()


def test_a_name_the_engine_refuses_is_one_sentence_and_leaves_no_tags(validated):
    env, folder = validated
    code, said = _publish(env, "127.0.0.1:9/" + "a" * 260)  # Docker: at most 255 characters
    assert code == 2 and "Traceback" not in said, said
    assert "must not be more than 255 characters" in said
    assert not _tags() and not (folder / "publish.json").exists()
