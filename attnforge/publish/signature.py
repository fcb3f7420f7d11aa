"""cosign key-based signatures of a published image, read and checked without cosign.

The layout is cosign's specs/SIGNATURE_SPEC.md (github.com/sigstore/cosign, read 2026-11-25 at
commit 04c191d1c134a59fbfacb87fe3c7444c7bbbfb1f): the signatures of the object with digest
`sha256:<hex>` are the layers of one OCI image manifest tagged `sha256-<hex>.sig` beside it; each
layer is a "simple signing" JSON payload (media type
application/vnd.dev.cosign.simplesigning.v1+json) whose `critical.image.docker-manifest-digest`
names the signed digest and whose `critical.type` is "cosign container image signature"; the
base64 signature over the payload bytes is the layer's annotation
`dev.cosignproject.cosign/signature`. The scheme (ECDSA P-256 with SHA-256 for cosign's keys) is
not recorded in the object: the verifier knows it from the key. The host's `openssl` checks the
signature, so no cryptography library is needed.

Keyless signatures (a Fulcio certificate in the layer's annotations, a Rekor entry) are not
checked here: that needs the Sigstore trust root and transparency log; `cosign verify` does it.
"""

from __future__ import annotations

import base64
import binascii
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import UserError

SIG_SUFFIX = "sig"
SIG_ANNOTATION = "dev.cosignproject.cosign/signature"
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIG_TYPE = "cosign container image signature"


def simple_signing(digest: str, reference: str) -> bytes:
    """The payload cosign signs for the image `digest` (`reference` is informational only)."""
    doc = {"critical": {"identity": {"docker-reference": reference},
                        "image": {"docker-manifest-digest": digest}, "type": SIG_TYPE},
           "optional": None}  # fmt: skip
    return json.dumps(doc, separators=(",", ":")).encode()


def _get(mapping: object, key: str) -> object:
    """mapping[key], matching the key's case loosely as cosign's Go JSON decoder does (the spec's
    example spells it Docker-manifest-digest, cosign writes docker-manifest-digest)."""
    if not isinstance(mapping, dict):
        return None
    for k, v in mapping.items():
        if k.lower() == key:
            return v
    return None


def payload_problem(payload: bytes, digest: str) -> str | None:
    """Why a simple-signing payload is not a cosign signature payload about `digest`; None if it is."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return "a signature payload is not JSON"
    critical = _get(doc, "critical")
    kind = _get(critical, "type")
    named = _get(_get(critical, "image"), "docker-manifest-digest")
    if kind != SIG_TYPE:
        return f"a signature payload's critical.type is {kind!r}, not {SIG_TYPE!r}"
    if named != digest:
        return f"a signature payload names {named}, not {digest}"
    return None


def _openssl() -> str:
    found = shutil.which("openssl")
    if not found:
        raise UserError(
            "checking a signature with --key needs `openssl` on PATH, and there is none"
        )
    return found


def check_key(key: Path) -> None:
    """UserError unless `key` is a PEM public key openssl can read."""
    proc = subprocess.run([_openssl(), "pkey", "-pubin", "-in", str(key), "-noout"],
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise UserError(f"--key {key}: not a PEM public key openssl can read "
                        "(cosign's cosign.pub is one; a private key is not)")  # fmt: skip


def verifies(key: Path, payload: bytes, signature_b64: str) -> bool:
    """Does the base64 DER signature verify over the payload bytes with `key` (SHA-256)?"""
    try:
        der = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    with tempfile.TemporaryDirectory(prefix="attnforge-sig-") as tmp:
        (Path(tmp) / "payload").write_bytes(payload)
        (Path(tmp) / "sig.der").write_bytes(der)
        proc = subprocess.run([_openssl(), "dgst", "-sha256", "-verify", str(key),
                               "-signature", str(Path(tmp) / "sig.der"), str(Path(tmp) / "payload")],
                              capture_output=True, text=True)  # fmt: skip
    return proc.returncode == 0


def check(what: str, digest: str, signatures: list[dict] | None, key: Path) -> list[str]:
    """Why `what` (the image, the SBOM ...) with `digest` is not signed by `key`: one sentence per
    problem, empty when at least one signature layer is a payload about that digest that verifies.

    `signatures` is what ociregistry.fetch_signatures read (None: no .sig manifest); each entry
    has the layer's `payload` bytes (None when the blob did not match its digest) and
    `annotations`."""
    if not signatures:
        return [f"{what} {digest} has no cosign signature (no sha256-<hex>.sig manifest beside it)"]
    problems = []
    for n, sig in enumerate(signatures, 1):
        at = f"{what}'s signature {n} of {len(signatures)}"
        if sig["payload"] is None:
            problems.append(f"{at}: its payload does not match its digest")
            continue
        wrong = payload_problem(sig["payload"], digest)
        if wrong:
            problems.append(f"{at}: {wrong}")
            continue
        b64 = (sig.get("annotations") or {}).get(SIG_ANNOTATION)
        if not b64:
            problems.append(f"{at}: the layer has no {SIG_ANNOTATION} annotation")
        elif verifies(key, sig["payload"], b64):
            return []
        else:
            problems.append(f"{at}: the signature does not verify with the key {key}")
    return problems
