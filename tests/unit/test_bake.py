"""`invoke bake`: the plan as a docker-bake.json, held to golden files and to `invoke build`.

The golden files (tests/unit/golden/bake-*.json) pin the document's shape: targets, fields, args,
tags, labels, contexts, secrets and caches. Content hashes are replaced by `<layer:key>`
placeholders so that a change to a layer's inputs (which moves its hash, as it should) does not
churn them; that the tags *are* the plan's content tags is checked apart, against the plan.
After an intended change of the format, regenerate them and read the diff:

    ATTNFORGE_REGENERATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_bake.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from attnforge.bake import bake_document, build_cache_ref
from attnforge.build import build_requests, labels_for
from attnforge.plan import Options, Plan, cache_ref, resolve
from attnforge.workspace import Workspace
from tests.conftest import REPO, run_invoke

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("ATTNFORGE_REGENERATE_GOLDEN") == "1"
# Fixed where the real values vary by machine and moment: the base image's digest, provenance.
BASE_DIGEST = "sha256:" + "0" * 64
PROVENANCE = {
    "org.opencontainers.image.created": "2026-11-24T00:00:00Z",
    "org.opencontainers.image.revision": "0" * 40,
}


def plan_for(recipes, arch: str, stack: str, **opts) -> Plan:
    options = Options(base_digest=BASE_DIGEST, jobs=4, namespace="attnforge", **opts)
    return resolve(recipes, arch, stack, options)


def contexts(plan: Plan) -> dict[str, str]:
    return {s.layer: f"/bake/{s.layer}/context" for s in plan.chain}


def normalized(doc: dict, plan: Plan) -> str:
    text = json.dumps(doc, indent=2) + "\n"
    for step in plan.chain:  # full keys first: a short hash is a prefix of its key
        text = text.replace(step.hash, f"<{step.layer}:key>")
    for step in plan.chain:
        text = text.replace(step.short_hash, f"<{step.layer}:key12>")
    return text


CASES = {
    "cpu": dict(arch="cpu", stack="cpu"),
    "cpu-cache-ca": dict(
        arch="cpu",
        stack="cpu",
        ca_cert="/etc/ssl/certs/ca-certificates.crt",
        cache_from="registry.example.com/team",
        push_cache=True,
    ),  # fmt: skip
    "gfx1151-default": dict(arch="gfx1151", stack="default"),
    "gfx942-source": dict(arch="gfx942", stack="source"),
}


@pytest.mark.parametrize("name", CASES)
def test_the_bake_file_matches_its_golden_file(recipes, name):
    case = dict(CASES[name])
    plan = plan_for(recipes, case.pop("arch"), case.pop("stack"))
    doc = bake_document(plan, contexts(plan), extra_labels=PROVENANCE, **case)
    got = normalized(doc, plan)
    golden = GOLDEN / f"bake-{name}.json"
    if REGENERATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(got)
    assert golden.is_file(), f"no golden file {golden}; make it with ATTNFORGE_REGENERATE_GOLDEN=1"
    assert got == golden.read_text(), (
        f"the bake file for {name} differs from {golden.name}; if the change is intended, "
        "regenerate with ATTNFORGE_REGENERATE_GOLDEN=1 and review the diff"
    )


def test_every_layer_that_makes_an_image_is_a_target_in_the_default_group(recipes):
    plan = plan_for(recipes, "gfx942", "source")
    doc = bake_document(plan, contexts(plan))
    assert doc["group"]["default"]["targets"] == [s.layer for s in plan.chain]
    assert set(doc["target"]) == {s.layer for s in plan.chain}
    # skipped or unsupported layers make no image, so they are no target either
    assert all(s.layer not in doc["target"] for s in plan.steps if not s.runs)


@pytest.mark.parametrize("arch,stack", [("cpu", "cpu"), ("gfx1151", "default")])
def test_each_target_is_what_invoke_build_would_build(recipes, tmp_path, arch, stack):
    """Same args (BASE_IMAGE, pins, hints), same content and moving tags, same labels."""
    plan = plan_for(recipes, arch, stack)
    ws = Workspace(REPO, tmp_path / "build", tmp_path / "reports")
    requests = build_requests(plan, ws)
    doc = bake_document(plan, contexts(plan), extra_labels=PROVENANCE)
    for step in plan.chain:
        target = doc["target"][step.layer]
        assert target["args"] == requests[step.layer].build_args
        assert target["tags"] == [step.hash_tag, *step.moving_tags]
        assert target["labels"] == labels_for(step, PROVENANCE)
        # provenance (when, which commit) is the machine's; every other label is the build's
        assert without(target["labels"], PROVENANCE) == without(
            requests[step.layer].labels, PROVENANCE
        )
    assert doc["target"][plan.chain[-1].layer]["tags"][-1] == plan.final_tag


def without(labels: dict[str, str], keys) -> dict[str, str]:
    return {
        k: v for k, v in labels.items() if k not in keys and k != "org.opencontainers.image.source"
    }


def test_a_parent_is_a_named_context_under_the_reference_its_from_line_names(recipes):
    """FROM ${BASE_IMAGE} resolves to the key of `contexts`, so bake hands the parent target's
    result over (and builds it first) instead of pulling an image of that name."""
    plan = plan_for(recipes, "cpu", "cpu")
    doc = bake_document(plan, contexts(plan))
    root, *rest = plan.chain
    assert "contexts" not in doc["target"][root.layer]
    assert doc["target"][root.layer]["args"]["BASE_IMAGE"] == root.base_ref
    for step in rest:
        target = doc["target"][step.layer]
        parent = plan.step(step.parent)
        assert target["args"]["BASE_IMAGE"] == parent.hash_tag
        assert target["contexts"] == {parent.hash_tag: f"target:{parent.layer}"}


def test_caches_are_the_content_tag_and_a_buildcache_tag_in_the_namespace(recipes):
    plan = plan_for(recipes, "cpu", "cpu")
    ns = "registry.example.com/team"
    read_only = bake_document(plan, contexts(plan), cache_from=ns)
    writing = bake_document(plan, contexts(plan), cache_from=ns, push_cache=True)
    for step in plan.chain:
        assert read_only["target"][step.layer]["cache-from"] == [
            f"type=registry,ref={cache_ref(step, ns)}",
            f"type=registry,ref={ns}/{step.layer}:cpu-buildcache",
        ]
        assert "cache-to" not in read_only["target"][step.layer]
        assert writing["target"][step.layer]["cache-to"] == [
            f"type=registry,ref={build_cache_ref(step, ns)},mode=max"
        ]
    plain = bake_document(plan, contexts(plan))
    assert all("cache-from" not in t and "secret" not in t for t in plain["target"].values())


def test_only_bakes_a_layer_and_what_it_sits_on(recipes):
    plan = plan_for(recipes, "cpu", "cpu", only="torch-cpu")
    doc = bake_document(plan, contexts(plan))
    assert list(doc["target"]) == ["base", "torch-cpu"]
    # not the last layer of the stack: no stack tag
    assert doc["target"]["torch-cpu"]["tags"] == [
        "attnforge/torch-cpu:cpu-" + plan.chain[1].short_hash,
        "attnforge/torch-cpu:cpu",
    ]


def test_invoke_bake_writes_the_file_and_stages_every_context(tmp_path):
    out_file = tmp_path / "ci" / "docker-bake.json"
    env = {
        **os.environ,
        "ATTNFORGE_BUILD_DIR": str(tmp_path / "build"),
        "ATTNFORGE_REPORTS_DIR": str(tmp_path / "reports"),
    }
    args = ["bake", "-a", "cpu", "-o", str(out_file), "--ca-cert", "none",
            "--base-image", "attnforge-local/debian:bookworm"]  # fmt: skip
    proc = run_invoke(REPO, *args, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out_file.read_text())
    assert list(doc["target"]) == [
        "base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"
    ]  # fmt: skip
    for target in doc["target"].values():
        ctx = Path(target["context"])
        assert ctx.is_relative_to(tmp_path / "build" / "bake" / "cpu" / "cpu")
        assert (ctx / "Dockerfile").is_file() and (ctx / "attnforge-manifest.json").is_file()
        assert (ctx / "wheelhouse").is_dir()  # the Dockerfiles bind-mount it
    assert f"wrote {out_file}" in proc.stdout
    # a second run replaces the contexts whole: no leftover folders beside them
    proc = run_invoke(REPO, *args, env=env)
    assert proc.returncode == 0, proc.stderr
    staged = sorted(p.name for p in (tmp_path / "build/bake/cpu/cpu").iterdir())
    assert staged == ["contexts"]
    assert len(list((tmp_path / "build/bake/cpu/cpu/contexts").iterdir())) == 6


def test_push_cache_without_a_cache_namespace_is_a_sentence(tmp_path):
    proc = run_invoke(REPO, "bake", "-a", "cpu", "--push-cache")
    assert proc.returncode == 2
    assert "--push-cache goes with --cache-from" in proc.stderr
    assert "Traceback" not in proc.stderr
