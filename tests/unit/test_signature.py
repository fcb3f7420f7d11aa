"""cosign key-based signatures as `invoke verify --key` reads them: the payload check, and the
ECDSA P-256 signature checked by the host's openssl with keys made here in a tmp dir."""

from __future__ import annotations

import base64
import json
import subprocess

import pytest

from attnforge import signature
from attnforge.errors import UserError

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


def keypair(tmp_path, name):
    private, public = tmp_path / f"{name}.key", tmp_path / f"{name}.pub"
    subprocess.run(["openssl", "ecparam", "-genkey", "-name", "prime256v1", "-noout", "-out",
                    str(private)], check=True, capture_output=True)  # fmt: skip
    subprocess.run(["openssl", "ec", "-in", str(private), "-pubout", "-out", str(public)],
                   check=True, capture_output=True)  # fmt: skip
    return private, public


def sign(private, payload, tmp_path):
    (tmp_path / "payload").write_bytes(payload)
    der = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(private),
                          str(tmp_path / "payload")], check=True, capture_output=True).stdout  # fmt: skip
    return base64.b64encode(der).decode()


def layer(payload, sig):
    return {"payload": payload, "annotations": {signature.SIG_ANNOTATION: sig}}


def test_a_payload_about_the_digest_passes_and_another_digest_is_named():
    assert signature.payload_problem(signature.simple_signing(DIGEST, "r/x"), DIGEST) is None
    assert signature.payload_problem(signature.simple_signing(OTHER, "r/x"), DIGEST) == (
        f"a signature payload names {OTHER}, not {DIGEST}"
    )


def test_the_spec_example_spelling_of_the_digest_key_is_read():
    doc = {"critical": {"image": {"Docker-manifest-digest": DIGEST}, "type": signature.SIG_TYPE}}
    assert signature.payload_problem(json.dumps(doc).encode(), DIGEST) is None


@pytest.mark.parametrize("payload, problem", [
    (b"not json", "not JSON"),
    (json.dumps({"critical": {"image": {"docker-manifest-digest": DIGEST},
                              "type": "atomic container signature"}}).encode(), "critical.type"),
    (json.dumps({"critical": {"type": signature.SIG_TYPE}}).encode(), "names None"),
])  # fmt: skip
def test_payloads_that_are_not_cosign_signatures_of_the_digest_say_why(payload, problem):
    assert problem in signature.payload_problem(payload, DIGEST)


def test_a_signature_made_with_the_key_verifies(tmp_path):
    private, public = keypair(tmp_path, "k")
    payload = signature.simple_signing(DIGEST, "r/x")
    assert signature.verifies(public, payload, sign(private, payload, tmp_path))
    assert signature.check("the image", DIGEST, [layer(payload, sign(private, payload, tmp_path))],
                           public) == []  # fmt: skip


def test_a_tampered_payload_does_not_verify(tmp_path):
    private, public = keypair(tmp_path, "k")
    payload = signature.simple_signing(DIGEST, "r/x")
    sig = sign(private, payload, tmp_path)
    tampered = payload.replace(b"r/x", b"r/y")
    assert not signature.verifies(public, tampered, sig)
    assert signature.check("the image", DIGEST, [layer(tampered, sig)], public) == [
        f"the image's signature 1 of 1: the signature does not verify with the key {public}"
    ]


def test_another_key_does_not_verify(tmp_path):
    private, _ = keypair(tmp_path, "k")
    _, other_public = keypair(tmp_path, "other")
    payload = signature.simple_signing(DIGEST, "r/x")
    sig = sign(private, payload, tmp_path)
    assert not signature.verifies(other_public, payload, sig)
    assert not signature.verifies(other_public, payload, "%%% not base64")
    [problem] = signature.check("the image", DIGEST, [layer(payload, sig)], other_public)
    assert problem.endswith(f"does not verify with the key {other_public}")


def test_a_valid_signature_over_another_digest_is_refused(tmp_path):
    private, public = keypair(tmp_path, "k")
    payload = signature.simple_signing(OTHER, "r/x")
    assert signature.verifies(public, payload, sign(private, payload, tmp_path))
    assert signature.check("the image", DIGEST, [layer(payload, sign(private, payload, tmp_path))],
                           public) == [f"the image's signature 1 of 1: a signature payload names "
                                       f"{OTHER}, not {DIGEST}"]  # fmt: skip


def test_no_signature_a_broken_blob_and_a_missing_annotation_are_each_a_sentence(tmp_path):
    _, public = keypair(tmp_path, "k")
    payload = signature.simple_signing(DIGEST, "r/x")
    assert "has no cosign signature" in signature.check("the image", DIGEST, None, public)[0]
    assert signature.check(
        "the SBOM", DIGEST, [{"payload": None}, {"payload": payload}], public
    ) == [
        "the SBOM's signature 1 of 2: its payload does not match its digest",
        f"the SBOM's signature 2 of 2: the layer has no {signature.SIG_ANNOTATION} annotation",
    ]


def test_one_good_signature_among_several_is_enough_as_for_cosign(tmp_path):
    private, public = keypair(tmp_path, "k")
    other, _ = keypair(tmp_path, "other")
    payload = signature.simple_signing(DIGEST, "r/x")
    layers = [
        layer(payload, sign(other, payload, tmp_path)),
        layer(payload, sign(private, payload, tmp_path)),
    ]
    assert signature.check("the image", DIGEST, layers, public) == []


def test_an_unreadable_or_private_key_is_a_user_error(tmp_path):
    private, public = keypair(tmp_path, "k")
    signature.check_key(public)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    for bad in (junk, private):
        with pytest.raises(UserError, match=f"--key {bad}: not a PEM public key"):
            signature.check_key(bad)
