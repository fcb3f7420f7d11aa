"""A small client of the OCI distribution API (v2): enough to attach an SBOM and a provenance
statement to a pushed image and to read them back, without a tool this environment lacks.

Attachments follow cosign's tag scheme, which registries without the OCI 1.1 referrers API (such
as distribution 2.8, Debian's docker-registry) serve: the SBOM of the image `repo@sha256:<hex>` is
the manifest tagged `sha256-<hex>.sbom`, its attestations `sha256-<hex>.att` (sigstore/cosign
specs/SIGNATURE_SPEC.md and doc/cosign_download.md, read 2026-11-25). Each attachment manifest also
carries the OCI 1.1 `subject` and `artifactType` fields, so a registry with the referrers API lists
it under the image too.

A registry that wants a login is answered as Docker's clients answer it, with the credentials of
the Docker client config (attnforge/publish/registry_auth.py): a `Basic` challenge with those credentials,
a `Bearer` challenge with a token from its realm (fetched with them, or anonymously without), one
token per registry and scope for the process (the token flow: distribution/distribution
docs/spec/auth/token.md and oauth.md, read 2026-11-25).
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from ..errors import UserError
from . import registry_auth

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
EMPTY_CONFIG = b"{}"
EMPTY_MEDIA = "application/vnd.oci.empty.v1+json"


@dataclass(frozen=True)
class Ref:
    registry: str
    repo: str
    reference: str  # a tag or a digest

    @classmethod
    def parse(cls, text: str) -> Ref:
        name, at, digest = text.partition("@")
        registry, _, rest = name.partition("/")
        if not rest or not ("." in registry or ":" in registry or registry == "localhost"):
            raise UserError(
                f"{text}: expected registry/repository[:tag|@digest], e.g. 127.0.0.1:5000/ns/cpu:cpu"
            )
        if at:
            return cls(registry, rest, digest)
        repo, colon, tag = rest.rpartition(":")
        return (
            cls(registry, repo, tag) if colon and "/" not in tag else cls(registry, rest, "latest")
        )

    def with_reference(self, reference: str) -> Ref:
        return Ref(self.registry, self.repo, reference)

    def __str__(self) -> str:
        sep = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.registry}/{self.repo}{sep}{self.reference}"


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _base(ref: Ref) -> str:
    host = ref.registry
    if host in registry_auth.DOCKER_HUB_HOSTS:
        host = "registry-1.docker.io"  # where Docker Hub serves the API (as docker's clients do)
    scheme = "http" if host.startswith(("127.", "localhost")) else "https"
    return f"{scheme}://{host}/v2/{ref.repo}"


# Authorization header values for (registry, scope), for the life of the process: a token is
# fetched once per repository and access, not once per blob.
_AUTH: dict[tuple[str, str], str] = {}


def _scope(ref: Ref, push: bool) -> str:
    return f"repository:{ref.repo}:{'pull,push' if push else 'pull'}"


def _open(method: str, url: str, data: bytes | None, headers: dict, auth: str | None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    if auth:
        # Unredirected: a blob GET that the registry redirects to a CDN or object store must
        # not carry the registry's credentials there.
        req.add_unredirected_header("Authorization", auth)
    return urllib.request.urlopen(req, timeout=60)


def _request(ref: Ref, method: str, url: str, data: bytes | None = None,
             headers: dict | None = None, *, push: bool = False):  # fmt: skip
    """The response, None for a 404, or a UserError sentence; logs in when challenged."""
    headers = headers or {}
    key = (ref.registry, _scope(ref, push))
    try:
        try:
            return _open(method, url, data, headers, _AUTH.get(key))
        except urllib.error.HTTPError as exc:
            if exc.code != 401:
                raise
            challenge = exc.headers.get("WWW-Authenticate", "")
            exc.close()
            _AUTH[key] = _answer(ref, push, challenge)
            return _open(method, url, data, headers, _AUTH[key])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        if exc.code in (401, 403):
            _AUTH.pop(key, None)
            raise _refused(ref, push, f"{exc.code} {exc.reason}") from None
        raise UserError(f"{method} {url}: the registry answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise UserError(f"{method} {url}: the registry did not answer ({exc})") from None


def _answer(ref: Ref, push: bool, header: str) -> str:
    """The Authorization header that answers the registry's 401 challenge."""
    challenges = {c.scheme: c for c in registry_auth.parse_challenges(header)}
    creds = registry_auth.find_credentials(ref.registry)
    if "bearer" in challenges and challenges["bearer"].params.get("realm"):
        return "Bearer " + _token(ref, push, challenges["bearer"].params, creds)
    if "basic" in challenges and creds is not None and not creds.identity_token:
        return registry_auth.basic_header(creds)
    raise _refused(ref, push, "401 Unauthorized")


def _token(ref: Ref, push: bool, params: dict[str, str], creds) -> str:
    """A token from the Bearer challenge's realm: an OAuth2 refresh-token grant for an identity
    token, else GET with Basic credentials (or none, for an anonymous pull token)."""
    query = {"scope": _scope(ref, push)}
    if params.get("service"):
        query["service"] = params["service"]
    realm = params["realm"]
    if creds is not None and creds.identity_token:
        form = {**query, "grant_type": "refresh_token", "refresh_token": creds.secret,
                "client_id": "attnforge"}  # fmt: skip
        req = urllib.request.Request(realm, data=urllib.parse.urlencode(form).encode(),
                                     method="POST")  # fmt: skip
    else:
        sep = "&" if "?" in realm else "?"
        req = urllib.request.Request(f"{realm}{sep}{urllib.parse.urlencode(query)}")
        if creds is not None:
            req.add_unredirected_header("Authorization", registry_auth.basic_header(creds))
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            raise _refused(
                ref, push, f"its token server answered {exc.code} {exc.reason}"
            ) from None
        raise UserError(
            f"{ref.registry}'s token server {realm} answered {exc.code} {exc.reason}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise UserError(f"{ref.registry}'s token server {realm} gave no token ({exc})") from None
    token = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
    if not token:
        raise UserError(f"{ref.registry}'s token server {realm} answered without a token")
    return token


def _refused(ref: Ref, push: bool, status: str) -> UserError:
    """The one sentence for a registry that will not let us in: which registry, why, the fix."""
    what = f"{'push to' if push else 'read'} {ref.repo}"
    host = ref.registry
    login = "docker login" if host in registry_auth.DOCKER_HUB_HOSTS else f"docker login {host}"
    try:
        creds = registry_auth.find_credentials(host)
    except UserError:
        creds = None
    if creds is None:
        return UserError(
            f"{host} refused to let us {what} ({status}) and the Docker client config "
            f"({registry_auth.config_path()}) has no login for it; run `{login}`"
        )
    return UserError(
        f"{host} refused the login from {creds.source} (user {creds.username}) to {what} "
        f"({status}); run `{login}` with an account that may {what}"
    )


def get_manifest(ref: Ref) -> tuple[bytes, str, str] | None:
    """(bytes, media type, digest) of the manifest ref names, or None when there is none."""
    resp = _request(ref, "GET", f"{_base(ref)}/manifests/{ref.reference}",
                    headers={"Accept": ACCEPT})  # fmt: skip
    if resp is None:
        return None
    with resp:
        body = resp.read()
        media = resp.headers.get("Content-Type", "").split(";")[0]
    return body, media, sha256_digest(body)


def get_blob(ref: Ref, digest: str) -> bytes | None:
    resp = _request(ref, "GET", f"{_base(ref)}/blobs/{digest}")
    if resp is None:
        return None
    with resp:
        return resp.read()


def put_blob(ref: Ref, data: bytes) -> str:
    digest = sha256_digest(data)
    if _request(ref, "HEAD", f"{_base(ref)}/blobs/{digest}", push=True) is not None:
        return digest
    resp = _request(ref, "POST", f"{_base(ref)}/blobs/uploads/", data=b"", push=True)
    if resp is None:
        raise UserError(f"{ref}: the registry refused an upload")
    location = resp.headers["Location"]
    if location.startswith("/"):
        location = f"{_base(ref).split('/v2/')[0]}{location}"
    sep = "&" if "?" in location else "?"
    _request(ref, "PUT", f"{location}{sep}digest={digest}", data=data,
             headers={"Content-Type": "application/octet-stream"}, push=True)  # fmt: skip
    return digest


def put_manifest(ref: Ref, data: bytes, media: str) -> str:
    """Push a manifest under ref's tag (or digest); its digest."""
    _request(ref, "PUT", f"{_base(ref)}/manifests/{ref.reference}", data=data,
             headers={"Content-Type": media}, push=True)  # fmt: skip
    return sha256_digest(data)


def attach(subject: Ref, subject_digest: str, suffix: str, artifact_type: str,
           layer_media: str, payload: bytes) -> tuple[str, str]:  # fmt: skip
    """Push `payload` as a one-layer OCI artifact tagged sha256-<hex>.<suffix> beside the
    subject image; (the attachment's tag ref, its manifest digest)."""
    found = get_manifest(subject.with_reference(subject_digest))
    if found is None:
        raise UserError(f"{subject.with_reference(subject_digest)}: no such image in the registry")
    body, media, _ = found
    config = put_blob(subject, EMPTY_CONFIG)
    layer = put_blob(subject, payload)
    manifest = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
        "config": {"mediaType": EMPTY_MEDIA, "digest": config, "size": len(EMPTY_CONFIG)},
        "layers": [{"mediaType": layer_media, "digest": layer, "size": len(payload)}],
        "subject": {"mediaType": media, "digest": subject_digest, "size": len(body)},
    }  # fmt: skip
    data = json.dumps(manifest, separators=(",", ":")).encode()
    tag = f"{subject_digest.replace(':', '-')}.{suffix}"
    put_manifest(subject.with_reference(tag), data, OCI_MANIFEST)
    return str(subject.with_reference(tag)), sha256_digest(data)


def fetch_attachment(subject: Ref, subject_digest: str, suffix: str) -> dict | None:
    """The attachment tagged sha256-<hex>.<suffix>: its manifest (parsed), manifest digest and
    the bytes of its one layer; None when there is none."""
    tag = f"{subject_digest.replace(':', '-')}.{suffix}"
    found = get_manifest(subject.with_reference(tag))
    if found is None:
        return None
    body, _, digest = found
    manifest = json.loads(body)
    layers = manifest.get("layers") or []
    blob = get_blob(subject, layers[0]["digest"]) if layers else None
    return {"manifest": manifest, "digest": digest, "payload": blob,
            "layer_digest": layers[0]["digest"] if layers else None}  # fmt: skip


def fetch_signatures(subject: Ref, subject_digest: str) -> list[dict] | None:
    """cosign's signatures of subject_digest: the layers of the manifest tagged
    sha256-<hex>.sig (cosign specs/SIGNATURE_SPEC.md), each as its `payload` bytes (None when the
    blob is missing or does not match its digest), `annotations` and `media`; None when there is
    no such manifest."""
    found = get_manifest(subject.with_reference(f"{subject_digest.replace(':', '-')}.sig"))
    if found is None:
        return None
    out = []
    for layer in json.loads(found[0]).get("layers") or []:
        blob = get_blob(subject, layer["digest"])
        if blob is not None and sha256_digest(blob) != layer["digest"]:
            blob = None
        out.append({"payload": blob, "annotations": layer.get("annotations") or {},
                    "media": layer.get("mediaType")})  # fmt: skip
    return out
