"""Registry logins: WWW-Authenticate parsing, the Docker client config and credential helpers,
and the Bearer token flow of attnforge/publish/ociregistry.py."""

from __future__ import annotations

import base64
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from attnforge.errors import UserError
from attnforge.publish import ociregistry, registry_auth
from attnforge.publish.ociregistry import Ref
from attnforge.publish.registry_auth import (
    Challenge,
    Credentials,
    find_credentials,
    parse_challenges,
)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (
            'Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:o/r:pull"',
            [
                Challenge(
                    "bearer",
                    {
                        "realm": "https://ghcr.io/token",
                        "service": "ghcr.io",
                        "scope": "repository:o/r:pull",
                    },
                )
            ],  # fmt: skip
        ),
        ('Basic realm="attnforge-test"', [Challenge("basic", {"realm": "attnforge-test"})]),
        (  # a comma inside a quoted value does not end the parameter
            'Bearer realm="https://r/t", scope="repository:a/b:pull,push"',
            [Challenge("bearer", {"realm": "https://r/t", "scope": "repository:a/b:pull,push"})],
        ),
        (  # two challenges in one header; unquoted values; escaped quote
            'Bearer realm=https://r/t,service=r, Basic realm="say \\"hi\\""',
            [
                Challenge("bearer", {"realm": "https://r/t", "service": "r"}),
                Challenge("basic", {"realm": 'say "hi"'}),
            ],  # fmt: skip
        ),
        ("", []),
    ],
    ids=["bearer", "basic", "comma-in-quotes", "two-challenges", "empty"],
)
def test_parse_challenges(header, expected):
    assert parse_challenges(header) == expected


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Write a Docker client config under a temporary DOCKER_CONFIG."""
    folder = tmp_path / "docker-config"
    folder.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))

    def write(doc: dict) -> Path:
        (folder / "config.json").write_text(json.dumps(doc))
        return folder / "config.json"

    return write


@pytest.mark.parametrize(
    ("doc", "host", "expected"),
    [
        ({"auths": {"r.example:5000": {"auth": b64("u:p:w")}}}, "r.example:5000", ("u", "p:w", False)),
        ({"auths": {"https://r.example/v1/": {"auth": b64("u:p")}}}, "r.example", ("u", "p", False)),
        ({"auths": {"https://index.docker.io/v1/": {"auth": b64("hub:p")}}}, "docker.io", ("hub", "p", False)),
        ({"auths": {"https://index.docker.io/v1/": {"auth": b64("hub:p")}}}, "index.docker.io", ("hub", "p", False)),
        ({"auths": {"ghcr.io": {"identitytoken": "refresh-me"}}}, "ghcr.io", ("<token>", "refresh-me", True)),
        ({"auths": {"ghcr.io": {"auth": b64("u:p")}}}, "quay.io", None),
        ({"auths": {"ghcr.io": {}}}, "ghcr.io", None),
        ({}, "ghcr.io", None),
    ],
    ids=["auth", "url-key", "hub-docker.io", "hub-index", "identitytoken", "other-host", "empty-entry", "empty"],
)  # fmt: skip
def test_credentials_from_auths(config, doc, host, expected):
    config(doc)
    creds = find_credentials(host)
    got = None if creds is None else (creds.username, creds.secret, creds.identity_token)
    assert got == expected


def test_no_config_file_is_anonymous(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "nowhere"))
    assert find_credentials("ghcr.io") is None


def test_damaged_auth_is_a_sentence(config):
    path = config({"auths": {"ghcr.io": {"auth": "not base64!"}}})
    with pytest.raises(UserError, match=rf"^{path} \(auths.ghcr.io\): `auth` is not base64"):
        find_credentials("ghcr.io")


def test_repr_hides_the_secret():
    assert "hunter2" not in repr(Credentials("u", "hunter2", "here"))


@pytest.fixture
def helper_bin(tmp_path, monkeypatch):
    """A planted docker-credential-x on PATH that logs its stdin and answers per server."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker-credential-x"
    script.write_text(
        "#!/bin/sh\n"
        'read -r server\necho "$1 $server" >> "$(dirname "$0")/calls"\n'
        'case "$server" in\n'
        '  r.example) echo \'{"ServerURL":"r.example","Username":"ci","Secret":"s3"}\' ;;\n'
        '  https://index.docker.io/v1/) echo \'{"ServerURL":"hub","Username":"<token>","Secret":"t"}\' ;;\n'
        '  broken.example) echo "keychain locked" >&2; exit 3 ;;\n'
        '  *) echo "credentials not found in native keychain"; exit 1 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_cred_helpers_entry_runs_the_helper_with_the_server_on_stdin(config, helper_bin):
    config({"credHelpers": {"r.example": "x"}, "auths": {"r.example": {"auth": b64("no:no")}}})
    creds = find_credentials("r.example")
    assert (creds.username, creds.secret, creds.source) == ("ci", "s3", "docker-credential-x")
    assert (helper_bin / "calls").read_text() == "get r.example\n"


def test_creds_store_serves_docker_hub_under_its_legacy_key(config, helper_bin):
    config({"credsStore": "x"})
    creds = find_credentials("docker.io")
    assert (creds.username, creds.secret, creds.identity_token) == ("<token>", "t", True)
    assert (helper_bin / "calls").read_text() == "get https://index.docker.io/v1/\n"


def test_helper_without_a_login_for_the_server_is_anonymous(config, helper_bin):
    config({"credsStore": "x"})
    assert find_credentials("elsewhere.example") is None


def test_helper_failure_is_a_sentence(config, helper_bin):
    config({"credsStore": "x"})
    with pytest.raises(UserError, match=r"docker-credential-x get \(for broken.example\) failed "
                       r"with exit 3: keychain locked$"):  # fmt: skip
        find_credentials("broken.example")


def test_missing_helper_is_one_sentence(config, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    path = config({"credHelpers": {"ghcr.io": "gone"}})
    with pytest.raises(UserError) as caught:
        find_credentials("ghcr.io")
    assert str(caught.value) == (
        f"{path} names the credential helper 'gone' for ghcr.io, but docker-credential-gone "
        "is not on PATH; install it or remove that entry"
    )


class StandIn(BaseHTTPRequestHandler):
    """A registry that answers 401 with a Bearer challenge, and its token server."""

    tokens_issued: list[dict]
    logins: dict[str, str]  # user -> password the token server accepts; {} = anonymous only
    manifest = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}'

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None):
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _token(self):
        from urllib.parse import parse_qs, urlparse

        query = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
        auth = self.headers.get("Authorization")
        user = None
        if auth:
            user, _, password = base64.b64decode(auth.split()[1]).decode().partition(":")
            if self.logins.get(user) != password:
                return self._send(401)
        elif "push" in query.get("scope", ""):
            return self._send(401)  # anonymous pull only
        token = f"tok-{len(self.tokens_issued)}"
        self.tokens_issued.append({"user": user, "token": token, **query})
        self._send(200, json.dumps({"token": token}).encode())

    def _registry(self):
        port = self.server.server_address[1]
        granted = {t["token"]: t["scope"] for t in self.tokens_issued}
        auth = self.headers.get("Authorization", "")
        scope = granted.get(auth.removeprefix("Bearer "))
        wanted = "pull" if self.command == "GET" else "pull,push"
        if scope is None or not scope.endswith(f":{wanted}"):
            challenge = (f'Bearer realm="http://127.0.0.1:{port}/token",service="stand-in",'
                         f'scope="repository:ns/r:{wanted}"')  # fmt: skip
            return self._send(401, b"{}", {"WWW-Authenticate": challenge})
        if self.command == "GET":
            return self._send(200, self.manifest, {"Content-Type": ociregistry.OCI_MANIFEST})
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send(201)

    def do_GET(self):
        return self._token() if self.path.startswith("/token") else self._registry()

    do_PUT = _registry


@pytest.fixture
def stand_in(monkeypatch):
    """The Bearer flow against an in-process stand-in: no token server (docker/distribution's
    `auth: token` needs one, e.g. a separate auth service) is available on this machine, so this
    http.server plays both the registry's 401 challenge and the realm that issues tokens."""
    monkeypatch.setattr(ociregistry, "_AUTH", {})
    handler = type("Handler", (StandIn,), {"tokens_issued": [], "logins": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


def test_bearer_login_fetches_one_token_per_scope_and_reuses_it(stand_in, config):
    host, handler = stand_in
    handler.logins = {"ci": "pw"}
    config({"auths": {host: {"auth": b64("ci:pw")}}})
    ref = Ref(host, "ns/r", "v1")
    for _ in range(2):
        assert ociregistry.get_manifest(ref)[0] == StandIn.manifest
    ociregistry.put_manifest(ref, b"{}", ociregistry.OCI_MANIFEST)
    ociregistry.put_manifest(ref, b"{}", ociregistry.OCI_MANIFEST)
    assert [(t["user"], t["scope"], t["service"]) for t in handler.tokens_issued] == [
        ("ci", "repository:ns/r:pull", "stand-in"),
        ("ci", "repository:ns/r:pull,push", "stand-in"),
    ]


def test_bearer_without_a_login_gets_an_anonymous_pull_token(stand_in, config):
    host, handler = stand_in
    config({})
    assert ociregistry.get_manifest(Ref(host, "ns/r", "v1")) is not None
    assert handler.tokens_issued[0]["user"] is None


def test_bearer_push_refused_is_one_sentence_without_the_secret(stand_in, config):
    host, handler = stand_in
    handler.logins = {"ci": "right"}
    path = config({"auths": {host: {"auth": b64("ci:wrong-secret")}}})
    with pytest.raises(UserError) as caught:
        ociregistry.put_manifest(Ref(host, "ns/r", "t"), b"{}", ociregistry.OCI_MANIFEST)
    assert str(caught.value) == (
        f"{host} refused the login from {path} (auths.{host}) (user ci) to push to ns/r (its "
        f"token server answered 401 Unauthorized); run `docker login {host}` with an account "
        "that may push to ns/r"
    )


def test_docker_hub_is_asked_at_its_api_host():
    assert ociregistry._base(Ref("docker.io", "library/x", "1")).startswith(
        "https://registry-1.docker.io/v2/library/x"
    )
    assert registry_auth.config_key("docker.io") == registry_auth.DOCKER_HUB_KEY
