"""Attaching to and reading from a registry that wants a login, as `invoke publish` and
`invoke verify` do: a real registry (Debian's docker-registry, distribution 2.8) with `auth:
htpasswd` on a free loopback port, and the credentials in a temporary Docker client config.

Needs /usr/bin/docker-registry and htpasswd (apache2-utils; tools/setup.sh registry installs
both); skips without them, fails instead where ATTNFORGE_REQUIRE_E2E=1.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from attnforge.errors import UserError
from attnforge.publish import ociregistry
from attnforge.publish.ociregistry import Ref
from tests.conftest import REPO, run_invoke
from tests.e2e.test_cpu_stack import unavailable

pytestmark = pytest.mark.e2e

USER, PASSWORD = "publisher", "correct-horse-7"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> str:
    """host:port of a registry that answers 401 `Basic realm=...` without a valid login."""
    missing = [p for p in ("docker-registry", "htpasswd") if shutil.which(p) is None]
    if missing:
        unavailable(
            f"end-to-end tests are required here but {', '.join(missing)} is missing "
            "(tools/setup.sh registry installs it)",
            f"no {', '.join(missing)} for the authenticated-registry test",
        )
    root = tmp_path_factory.mktemp("auth-registry")
    htpasswd = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], capture_output=True,
                              text=True, check=True).stdout  # fmt: skip
    (root / "htpasswd").write_text(htpasswd)
    host = f"127.0.0.1:{_free_port()}"
    (root / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'store'}\n"
        f"http:\n  addr: {host}\n"
        f"auth:\n  htpasswd:\n    realm: attnforge-test\n    path: {root / 'htpasswd'}\n"
    )
    log = (root / "registry.log").open("w")
    proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        for _ in range(60):
            try:
                urllib.request.urlopen(f"http://{host}/v2/", timeout=2)
                pytest.fail(f"the registry on {host} let an anonymous client in")
            except urllib.error.HTTPError as exc:
                assert exc.code == 401, exc
                assert exc.headers["WWW-Authenticate"].startswith("Basic ")
                break
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        else:
            pytest.fail(f"the registry did not come up: {(root / 'registry.log').read_text()}")
        yield host
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def docker_config(tmp_path: Path, monkeypatch, config: dict) -> Path:
    """A Docker client config of its own for this test, and no token cached from another."""
    folder = tmp_path / "docker-config"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    monkeypatch.setattr(ociregistry, "_AUTH", {})
    return folder


def auths(host: str, user: str, password: str) -> dict:
    return {"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}


def push_subject(host: str, repo: str) -> tuple[Ref, str]:
    """A one-layer image pushed by digest-addressed blobs and a tagged manifest."""
    ref = Ref(host, repo, "v1")
    config = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
    layer = b"attnforge registry auth test layer\n"
    manifest = {
        "schemaVersion": 2, "mediaType": ociregistry.OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": ociregistry.put_blob(ref, config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": ociregistry.put_blob(ref, layer), "size": len(layer)}],
    }  # fmt: skip
    digest = ociregistry.put_manifest(ref, json.dumps(manifest).encode(), ociregistry.OCI_MANIFEST)
    return ref, digest


def test_attach_and_fetch_with_the_login_from_the_docker_config(registry, tmp_path, monkeypatch):
    docker_config(tmp_path, monkeypatch, auths(registry, USER, PASSWORD))
    subject, digest = push_subject(registry, "ns/basic")
    payload = b'{"bomFormat":"CycloneDX","note":"auth e2e"}'
    tag_ref, manifest_digest = ociregistry.attach(
        subject, digest, "sbom", "application/vnd.cyclonedx+json",
        "application/vnd.cyclonedx+json", payload,
    )  # fmt: skip
    assert tag_ref == f"{registry}/ns/basic:{digest.replace(':', '-')}.sbom"
    # A fresh process's view: no header cached, the login found again from the config.
    monkeypatch.setattr(ociregistry, "_AUTH", {})
    found = ociregistry.fetch_attachment(subject, digest, "sbom")
    assert found is not None
    assert found["payload"] == payload
    assert found["digest"] == manifest_digest
    assert found["manifest"]["subject"]["digest"] == digest


def test_a_credential_helper_supplies_the_login(registry, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-e2e"
    helper.write_text(
        "#!/bin/sh\nread -r server\n"
        f'[ "$1" = get ] && [ "$server" = "{registry}" ] || exit 1\n'
        f'printf \'{{"ServerURL":"%s","Username":"{USER}","Secret":"{PASSWORD}"}}\' "$server"\n'
    )
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    docker_config(tmp_path, monkeypatch, {"credHelpers": {registry: "e2e"}})
    subject, digest = push_subject(registry, "ns/helper")
    ociregistry.attach(subject, digest, "att", "application/vnd.in-toto+json",
                       "application/vnd.dsse.envelope.v1+json", b"{}")  # fmt: skip
    assert ociregistry.fetch_attachment(subject, digest, "att")["payload"] == b"{}"


def test_wrong_credentials_are_one_sentence_naming_the_registry_and_the_fix(
    registry, tmp_path, monkeypatch
):
    docker_config(tmp_path, monkeypatch, auths(registry, USER, PASSWORD))
    subject, digest = push_subject(registry, "ns/wrong")
    docker_config(tmp_path / "other", monkeypatch, auths(registry, USER, "not-the-password"))
    with pytest.raises(UserError) as caught:
        ociregistry.attach(subject, digest, "sbom", "a/b", "a/b", b"x")
    said = str(caught.value)
    assert "\n" not in said
    assert said.startswith(f"{registry} refused the login")
    assert f"(user {USER})" in said
    assert f"run `docker login {registry}`" in said
    assert "not-the-password" not in said
    assert base64.b64encode(f"{USER}:not-the-password".encode()).decode() not in said


def test_no_login_at_all_says_the_config_has_none(registry, tmp_path, monkeypatch):
    docker_config(tmp_path, monkeypatch, {})
    with pytest.raises(UserError, match=r"has no login for it; run `docker login 127\.0\.0\.1:"):
        ociregistry.fetch_attachment(Ref(registry, "ns/any", "v1"), "sha256:" + "0" * 64, "sbom")


def test_invoke_verify_says_the_refusal_as_a_sentence(registry, tmp_path, monkeypatch):
    docker_config(tmp_path, monkeypatch, auths(registry, USER, PASSWORD))
    subject, digest = push_subject(registry, "ns/verify")
    folder = docker_config(tmp_path / "wrong", monkeypatch, auths(registry, USER, "nope-nope"))
    env = {**os.environ, "DOCKER_CONFIG": str(folder)}
    done = run_invoke(REPO, "verify", "--image", f"{registry}/ns/verify@{digest}", env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert "Traceback" not in text
    assert f"refused the login from {folder / 'config.json'}" in text
    assert f"docker login {registry}" in text
    assert "nope-nope" not in text
