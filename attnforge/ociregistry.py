"""A small client of the OCI distribution API (v2): enough to attach an SBOM and a provenance
statement to a pushed image and to read them back, without a tool this environment lacks.

Attachments follow cosign's tag scheme, which registries without the OCI 1.1 referrers API (such
as distribution 2.8, Debian's docker-registry) serve: the SBOM of the image `repo@sha256:<hex>` is
the manifest tagged `sha256-<hex>.sbom`, its attestations `sha256-<hex>.att` (sigstore/cosign
specs/SIGNATURE_SPEC.md and doc/cosign_download.md, read 2026-11-25). Each attachment manifest also
carries the OCI 1.1 `subject` and `artifactType` fields, so a registry with the referrers API lists
it under the image too. Anonymous access only (a local registry, or a public read): credentials for
ghcr.io and others are the engine's and are not read here (unverified against them).
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from .errors import UserError

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
    scheme = "http" if host.startswith(("127.", "localhost")) else "https"
    return f"{scheme}://{host}/v2/{ref.repo}"


def _request(method: str, url: str, data: bytes | None = None, headers: dict | None = None):
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        return urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise UserError(f"{method} {url}: the registry answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise UserError(f"{method} {url}: the registry did not answer ({exc})") from None


def get_manifest(ref: Ref) -> tuple[bytes, str, str] | None:
    """(bytes, media type, digest) of the manifest ref names, or None when there is none."""
    resp = _request("GET", f"{_base(ref)}/manifests/{ref.reference}", headers={"Accept": ACCEPT})
    if resp is None:
        return None
    with resp:
        body = resp.read()
        media = resp.headers.get("Content-Type", "").split(";")[0]
    return body, media, sha256_digest(body)


def get_blob(ref: Ref, digest: str) -> bytes | None:
    resp = _request("GET", f"{_base(ref)}/blobs/{digest}")
    if resp is None:
        return None
    with resp:
        return resp.read()


def put_blob(ref: Ref, data: bytes) -> str:
    digest = sha256_digest(data)
    if _request("HEAD", f"{_base(ref)}/blobs/{digest}") is not None:
        return digest
    resp = _request("POST", f"{_base(ref)}/blobs/uploads/", data=b"")
    if resp is None:
        raise UserError(f"{ref}: the registry refused an upload")
    location = resp.headers["Location"]
    if location.startswith("/"):
        location = f"{_base(ref).split('/v2/')[0]}{location}"
    sep = "&" if "?" in location else "?"
    _request("PUT", f"{location}{sep}digest={digest}", data=data,
             headers={"Content-Type": "application/octet-stream"})  # fmt: skip
    return digest


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
    _request("PUT", f"{_base(subject)}/manifests/{tag}", data=data,
             headers={"Content-Type": OCI_MANIFEST})  # fmt: skip
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
