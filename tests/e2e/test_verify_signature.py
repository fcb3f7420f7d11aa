"""`invoke verify --key`: a key-based cosign signature read back from a real registry.

A tiny image (the local base image plus a label) is pushed with `docker push` to the local
registry (ATTNFORGE_E2E_REGISTRY, started by tools/setup.sh). The test then writes, through
attnforge.publish.ociregistry, a signature in cosign's layout (specs/SIGNATURE_SPEC.md of
github.com/sigstore/cosign: a manifest tagged sha256-<hex>.sig whose layer is a simple-signing
payload with the base64 signature in the `dev.cosignproject.cosign/signature` annotation), signed
with an ECDSA P-256 key that openssl makes in a tmp dir (tests/conftest.py's signing_key). So this
tests our reader against the spec's layout, not against signatures cosign itself made (cosign is
not installed here).

The registry may not allow deletes (docker-registry's default): the test deletes the manifests it
pushed where the registry lets it and removes its local image tag in any case.
"""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
import uuid

import pytest

from attnforge.publish import attest, ociregistry, signature
from attnforge.publish.ociregistry import Ref
from tests.conftest import REPO, openssl_sign, run_invoke
from tests.e2e.test_cpu_stack import BASE, REGISTRY, _need_registry, require_engine

pytestmark = pytest.mark.e2e

CONFIG = b'{"architecture":"","os":"","config":{}}'


def write_signature(ref: Ref, signed_digest: str, about: str, private) -> None:
    """Tag sha256-<hex of signed_digest>.sig with one cosign signature layer whose payload names
    `about` (normally the same digest), signed with `private`."""
    payload = signature.simple_signing(about, str(ref))
    manifest = {
        "schemaVersion": 2, "mediaType": ociregistry.OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": ociregistry.put_blob(ref, CONFIG), "size": len(CONFIG)},
        "layers": [{"mediaType": signature.SIMPLE_SIGNING, "size": len(payload),
                    "digest": ociregistry.put_blob(ref, payload),
                    "annotations": {signature.SIG_ANNOTATION: openssl_sign(private, payload)}}],
    }  # fmt: skip
    tag = f"{signed_digest.replace(':', '-')}.{signature.SIG_SUFFIX}"
    ociregistry.put_manifest(ref.with_reference(tag), json.dumps(manifest).encode(),
                             ociregistry.OCI_MANIFEST)  # fmt: skip


def _delete(ref: Ref, tag: str) -> None:
    found = ociregistry.get_manifest(ref.with_reference(tag))
    if found is None:
        return
    req = urllib.request.Request(f"http://{ref.registry}/v2/{ref.repo}/manifests/{found[2]}",
                                 method="DELETE")  # fmt: skip
    try:
        urllib.request.urlopen(req, timeout=30).close()
    except urllib.error.HTTPError:
        pass  # 405: this registry keeps what was pushed (deletes are off)


@pytest.fixture
def pushed(tmp_path):
    require_engine()
    _need_registry()
    name = f"{REGISTRY}/attnforge-sig-{uuid.uuid4().hex[:8]}/x:1"
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {BASE}\nLABEL org.attnforge.test={name}\n")
    tags = ["1"]
    try:
        subprocess.run(["docker", "build", "-q", "-t", name, str(tmp_path / "ctx")], check=True,
                       capture_output=True, timeout=300)  # fmt: skip
        subprocess.run(["docker", "push", "-q", name], check=True, capture_output=True, timeout=600)
        ref = Ref.parse(name)
        yield ref, ociregistry.get_manifest(ref)[2], tags
    finally:
        subprocess.run(["docker", "rmi", "-f", name], capture_output=True)
        for tag in reversed(tags):
            _delete(Ref.parse(name), tag)


def verify(*args):
    return run_invoke(REPO, "verify", *args, timeout=300)


def test_verify_key_reads_a_cosign_layout_signature_from_the_registry(pushed, signing_key):
    ref, digest, tags = pushed
    private, public = signing_key("k")
    _, other_public = signing_key("other")
    image = str(ref.with_reference(digest))
    sig_tag = f"{digest.replace(':', '-')}.sig"

    # no signature yet; no SBOM or provenance on this image either: all named, exit 1
    proc = verify("--image", str(ref), "--key", str(public))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"no SBOM is attached to {digest}" in proc.stdout
    assert f"no provenance is attached to {digest}" in proc.stdout
    assert f"the image {digest} has no cosign signature" in proc.stdout

    # signed: the signature is reported beside the attachments still missing
    tags.append(sig_tag)
    write_signature(ref, digest, digest, private)
    proc = verify("--image", str(ref), "--key", str(public))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "signed by the given key: the image" in proc.stdout
    assert "no SBOM is attached" in proc.stdout and "cosign signature" not in proc.stdout

    # with an SBOM and provenance about the digest (the SBOM signed too): verified, exit 0
    sbom = {"bomFormat": "CycloneDX", "metadata": {"component": {"version": digest}}}
    statement = {"_type": attest.STATEMENT, "predicateType": attest.SLSA_V1, "predicate": {},
                 "subject": [{"name": ref.repo, "digest": {"sha256": digest[7:]}}]}  # fmt: skip
    for suffix, kind, media, doc in (
        ("sbom", attest.SBOM_MEDIA, attest.SBOM_MEDIA, sbom),
        ("att", attest.INTOTO_PAYLOAD, attest.DSSE_MEDIA, attest.dsse(statement)),
    ):
        tags.append(f"{digest.replace(':', '-')}.{suffix}")
        _, att_digest = ociregistry.attach(ref, digest, suffix, kind, media,
                                           json.dumps(doc).encode())  # fmt: skip
        if suffix == "sbom":
            tags.append(f"{att_digest.replace(':', '-')}.sig")
            write_signature(ref, att_digest, att_digest, private)
    proc = verify("--image", str(ref), "--key", str(public))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"verified {image}" in proc.stdout
    assert "signed by the given key: the image, the SBOM (key-based" in proc.stdout

    # without --key: the same image verifies, and says its signature was not checked
    proc = verify("--image", str(ref))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "signatures not checked: give --key" in proc.stdout

    # another key
    proc = verify("--image", str(ref), "--key", str(other_public))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        f"the image's signature 1 of 1: the signature does not verify with the key {other_public}"
        in proc.stdout
    )
    assert f"not verified: {image}" in proc.stdout

    # a good signature, by the key, over another digest, put where this image's signature goes
    other = "sha256:" + "0" * 64
    write_signature(ref, digest, other, private)
    proc = verify("--image", str(ref), "--key", str(public))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"a signature payload names {other}, not {digest}" in proc.stdout
    assert "signed by the given key: the SBOM" in proc.stdout
