"""Registry credentials found the way Docker's own clients find them, and the registry's
authentication challenges parsed.

Credentials come from the Docker client config, `$DOCKER_CONFIG/config.json`, else
`~/.docker/config.json`: a `credHelpers` entry for the host, else `credsStore`, is run as
`docker-credential-<name> get` with the server address on stdin and answers
`{"ServerURL", "Username", "Secret"}` (a `Username` of `<token>` marks an identity token); without a
helper, `auths.<host>.auth` (base64 `user:password`) or `auths.<host>.identitytoken`. Docker Hub's
key is `https://index.docker.io/v1/`, and an `auths` key such as `https://host/v1/` matches `host`
(docker/cli cli/config/configfile/file.go `GetCredentialsStore`, `getConfiguredCredentialStore`,
`decodeAuth`; cli/config/credentials/file_store.go `ConvertToHostname`; the protocol in
docker/docker-credential-helpers README.md; read 2026-11-25).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError

DOCKER_HUB_KEY = "https://index.docker.io/v1/"
DOCKER_HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class Credentials:
    """A login for one registry; `secret` is a password or, with `identity_token`, a refresh
    token for the token server. Its repr never shows the secret."""

    username: str
    secret: str = field(repr=False)
    source: str  # where it was found, for messages
    identity_token: bool = False


@dataclass(frozen=True)
class Challenge:
    """One challenge of a WWW-Authenticate header: its scheme (lower case) and parameters."""

    scheme: str
    params: dict[str, str]


_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_PARAM = re.compile(rf'\s*({_TOKEN})\s*=\s*("(?:[^"\\]|\\.)*"|[^,\s]*)\s*(?:,|$)')
_SCHEME = re.compile(rf"\s*,?\s*({_TOKEN})(?:\s+|$)")


def parse_challenges(header: str) -> list[Challenge]:
    """The challenges of a WWW-Authenticate header (RFC 9110 §11.6.1), e.g.
    `Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:o/r:pull"`."""
    found: list[Challenge] = []
    pos = 0
    while pos < len(header):
        m = _SCHEME.match(header, pos)
        if not m:
            break
        scheme, pos = m.group(1).lower(), m.end()
        params: dict[str, str] = {}
        while pos < len(header):
            p = _PARAM.match(header, pos)
            if not p:
                break
            value = p.group(2)
            if value.startswith('"'):
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            params[p.group(1).lower()] = value
            pos = p.end()
        found.append(Challenge(scheme, params))
    return found


def config_key(host: str) -> str:
    """The key Docker files a registry's credentials under: the host, or Hub's legacy URL."""
    return DOCKER_HUB_KEY if host in DOCKER_HUB_HOSTS else host


def config_path() -> Path:
    base = os.environ.get("DOCKER_CONFIG")
    return (Path(base) if base else Path.home() / ".docker") / "config.json"


def _hostname(key: str) -> str:
    """docker's ConvertToHostname: `https://host:5000/v1/` -> `host:5000`."""
    for prefix in ("http://", "https://"):
        if key.startswith(prefix):
            key = key[len(prefix) :]
    return key.split("/", 1)[0]


def find_credentials(host: str) -> Credentials | None:
    """The credentials Docker would use for `host`, or None (anonymous)."""
    path = config_path()
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable Docker client config ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a Docker client config (expected a JSON object)")
    key = config_key(host)
    helper = (config.get("credHelpers") or {}).get(key) or config.get("credsStore")
    if helper:
        return _from_helper(helper, key)
    auths = config.get("auths") or {}
    entry = auths.get(key)
    if entry is None:
        entry = next((v for k, v in auths.items() if _hostname(k) == _hostname(key)), None)
    if not isinstance(entry, dict):
        return None
    where = f"{path} (auths.{key})"
    if entry.get("identitytoken"):
        user = _decode_auth(entry["auth"], where)[0] if entry.get("auth") else "<token>"
        return Credentials(user, entry["identitytoken"], where, identity_token=True)
    if entry.get("auth"):
        user, password = _decode_auth(entry["auth"], where)
        return Credentials(user, password, where)
    if entry.get("username") and entry.get("password"):
        return Credentials(entry["username"], entry["password"], where)
    return None


def _decode_auth(auth: str, where: str) -> tuple[str, str]:
    try:
        text = base64.b64decode(auth, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{where}: `auth` is not base64 of user:password") from None
    user, colon, password = text.partition(":")
    if not colon or not user:
        raise UserError(f"{where}: `auth` is not base64 of user:password")
    return user, password.strip("\x00")


def _from_helper(helper: str, key: str) -> Credentials | None:
    program = f"docker-credential-{helper}"
    path = shutil.which(program)
    if path is None:
        raise UserError(
            f"{config_path()} names the credential helper {helper!r} for {key}, but "
            f"{program} is not on PATH; install it or remove that entry"
        )
    try:
        done = subprocess.run([path, "get"], input=key, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"{program} get (for {key}) did not run: {exc}") from None
    if done.returncode != 0:
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        if said and "credentials not found" in said[0].lower():
            return None  # the helper's documented answer for "no login for this server"
        raise UserError(
            f"{program} get (for {key}) failed with exit {done.returncode}: "
            f"{said[0] if said else 'no message'}"
        )
    try:
        doc = json.loads(done.stdout)
        user, secret = doc["Username"], doc["Secret"]
    except (ValueError, KeyError, TypeError):
        raise UserError(
            f"{program} get (for {key}) did not answer the credential helper protocol's JSON"
        ) from None
    if not secret:
        return None
    return Credentials(user, secret, program, identity_token=user == "<token>")


def basic_header(creds: Credentials) -> str:
    raw = f"{creds.username}:{creds.secret}".encode()
    return "Basic " + base64.b64encode(raw).decode()
