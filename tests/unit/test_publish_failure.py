"""invoke publish when the engine or the registry fails: one sentence, and nothing of its own left.

The engine is a recording fake (the real one is exercised by tests/e2e/test_cpu_stack_publish.py);
what is checked here is the command's promise: tags it made are removed again, no publish.json is
written, and the message is a sentence, not a traceback. The SBOM and provenance steps are stood
in for (they read the image and talk to a registry: tests/e2e/test_cpu_stack_publish.py runs them
for real); a stand-in that fails shows an attachment failing after the pushes is cleaned up too."""

from __future__ import annotations

import json

import pytest
from invoke import Program

import tasks
from attnforge.cli import publish as cli
from attnforge.errors import UserError


class FakeEngine:
    def __init__(self, fail_push_at: int | None = None, refuse_tag: bool = False):
        self.images = {}  # ref -> image id
        self.untagged: list[str] = []
        self.pushes = 0
        self.fail_push_at, self.refuse_tag = fail_push_at, refuse_tag

    def image_id(self, ref):
        return self.images.get(ref)

    def labels(self, ref):
        return {"org.attnforge.lineage": json.dumps([["base", "aaaa"], ["cpu", "bbbb"]])}

    def tag(self, image, ref):
        if self.refuse_tag:
            raise RuntimeError(
                f'invalid reference format: repository name "{ref}" must be lowercase'
            )
        self.images[ref] = image

    def push(self, ref, log):
        self.pushes += 1
        if self.pushes == self.fail_push_at:
            raise UserError(f"pushing {ref} failed (exit 1); is the registry reachable?")

    def untag(self, ref):
        self.untagged.append(ref)
        self.images.pop(ref, None)

    def registry_digest(self, ref):
        return "sha256:" + "0" * 64


@pytest.fixture
def published(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ATTNFORGE_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("ATTNFORGE_REPORTS_DIR", str(tmp_path / "reports"))
    monkeypatch.chdir(tmp_path)

    def run(engine: FakeEngine, to: str = "127.0.0.1:5000/team", attach_fails: bool = False):
        final = "attnforge/cpu:cpu"
        engine.images.update({final: "sha256:final", "attnforge/base:cpu-aaaa": "sha256:a",
                              "attnforge/cpu:cpu-bbbb": "sha256:final"})  # fmt: skip
        stamp = tmp_path / "reports" / "cpu" / "cpu" / "validated.json"
        stamp.parent.mkdir(parents=True)
        stamp.write_text(json.dumps({"image_id": "sha256:final", "passed": True}))
        monkeypatch.setattr(cli, "connect", lambda name: engine)
        monkeypatch.setattr(cli, "attestation_facts", lambda *args: {"facts": "gathered"})

        def attach(final_ref, refs, facts, record):
            assert facts == {"facts": "gathered"} and refs[-1]["ref"] == final_ref
            if attach_fails:
                raise UserError(f"PUT {final_ref}: the registry answered 500 Internal Server Error")
            return {"sbom": {"digest": "sha256:" + "1" * 64},
                    "provenance": {"digest": "sha256:" + "2" * 64}}  # fmt: skip

        monkeypatch.setattr(cli, "attach_attestations", attach)
        try:
            Program(namespace=tasks.ns, binary="invoke").run(
                ["invoke", "publish", "--arch", "cpu", "--stack", "cpu", "--to", to]
            )
            code = 0
        except SystemExit as exc:
            code = exc.code
        captured = capsys.readouterr()
        return code, " ".join((captured.out + captured.err).split()), stamp.parent

    return run


def test_a_registry_that_fails_mid_publish_leaves_no_tags_and_no_manifest(published):
    engine = FakeEngine(fail_push_at=2)
    code, said, folder = published(engine)
    assert code == 2 and "Traceback" not in said
    assert "publishing to 127.0.0.1:5000/team failed: pushing" in said
    assert "1 tag(s) reached the registry" in said
    assert engine.untagged == ["127.0.0.1:5000/team/base:cpu-aaaa", "127.0.0.1:5000/team/base:cpu"]
    assert not any(ref.startswith("127.0.0.1:5000/") for ref in engine.images)
    assert not (folder / "publish.json").exists()


def test_a_name_the_engine_refuses_is_one_sentence(published):
    engine = FakeEngine(refuse_tag=True)
    code, said, folder = published(engine)
    assert code == 2 and "Traceback" not in said
    assert "must be lowercase" in said and not (folder / "publish.json").exists()


@pytest.mark.parametrize("to", ["BAD NAME", "ghcr.io/Org/x", "host:port:1/x", "a//b"])
def test_a_malformed_namespace_is_refused_before_anything_is_tagged(published, to):
    engine = FakeEngine()
    code, said, _ = published(engine, to=to)
    assert code == 2 and f"--to {to!r}: not a registry namespace" in said
    assert engine.pushes == 0 and engine.untagged == []


def test_a_publish_that_passes_writes_its_manifest(published):
    code, said, folder = published(FakeEngine())
    assert code == 0, said
    refs = [r["ref"] for r in json.loads((folder / "publish.json").read_text())["refs"]]
    assert refs[-1] == "127.0.0.1:5000/team/cpu:cpu"


def test_an_attachment_that_fails_after_the_pushes_leaves_no_tags_and_no_manifest(published):
    engine = FakeEngine()
    code, said, folder = published(engine, attach_fails=True)
    assert code == 2 and "Traceback" not in said
    assert "publishing to 127.0.0.1:5000/team failed: PUT" in said and "500" in said
    assert not any(ref.startswith("127.0.0.1:5000/") for ref in engine.images)
    assert engine.untagged == [  # the layer tag cpu:cpu is also the stack's tag: made once
        "127.0.0.1:5000/team/base:cpu-aaaa", "127.0.0.1:5000/team/base:cpu",
        "127.0.0.1:5000/team/cpu:cpu-bbbb", "127.0.0.1:5000/team/cpu:cpu",
    ]  # fmt: skip
    assert not (folder / "publish.json").exists()


def test_the_manifest_lists_the_attachments_digests(published):
    code, said, folder = published(FakeEngine())
    assert code == 0, said
    doc = json.loads((folder / "publish.json").read_text())
    assert doc["attestations"]["sbom"]["digest"] == "sha256:" + "1" * 64
