"""cosign key-based signatures as `invoke verify --key` reads them: the payload check, and the
ECDSA P-256 signature checked by the host's openssl with keys it makes in a tmp dir (the
signing_key fixture of tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

from attnforge.errors import UserError
from attnforge.publish import signature
from tests.conftest import openssl_sign as sign

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


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


def test_a_signature_made_with_the_key_verifies(signing_key):
    private, public = signing_key("k")
    payload = signature.simple_signing(DIGEST, "r/x")
    assert signature.verifies(public, payload, sign(private, payload))
    assert signature.check("the image", DIGEST, [layer(payload, sign(private, payload))],
                           public) == []  # fmt: skip


def test_a_tampered_payload_does_not_verify(signing_key):
    private, public = signing_key("k")
    payload = signature.simple_signing(DIGEST, "r/x")
    sig = sign(private, payload)
    tampered = payload.replace(b"r/x", b"r/y")
    assert not signature.verifies(public, tampered, sig)
    assert signature.check("the image", DIGEST, [layer(tampered, sig)], public) == [
        f"the image's signature 1 of 1: the signature does not verify with the key {public}"
    ]


def test_another_key_does_not_verify(signing_key):
    private, _ = signing_key("k")
    _, other_public = signing_key("other")
    payload = signature.simple_signing(DIGEST, "r/x")
    sig = sign(private, payload)
    assert not signature.verifies(other_public, payload, sig)
    assert not signature.verifies(other_public, payload, "%%% not base64")
    [problem] = signature.check("the image", DIGEST, [layer(payload, sig)], other_public)
    assert problem.endswith(f"does not verify with the key {other_public}")


def test_a_valid_signature_over_another_digest_is_refused(signing_key):
    private, public = signing_key("k")
    payload = signature.simple_signing(OTHER, "r/x")
    assert signature.verifies(public, payload, sign(private, payload))
    assert signature.check("the image", DIGEST, [layer(payload, sign(private, payload))],
                           public) == [f"the image's signature 1 of 1: a signature payload names "
                                       f"{OTHER}, not {DIGEST}"]  # fmt: skip


def test_no_signature_a_broken_blob_and_a_missing_annotation_are_each_a_sentence(signing_key):
    _, public = signing_key("k")
    payload = signature.simple_signing(DIGEST, "r/x")
    assert "has no cosign signature" in signature.check("the image", DIGEST, None, public)[0]
    assert signature.check(
        "the SBOM", DIGEST, [{"payload": None}, {"payload": payload}], public
    ) == [
        "the SBOM's signature 1 of 2: its payload does not match its digest",
        f"the SBOM's signature 2 of 2: the layer has no {signature.SIG_ANNOTATION} annotation",
    ]


def test_one_good_signature_among_several_is_enough_as_for_cosign(signing_key):
    private, public = signing_key("k")
    other, _ = signing_key("other")
    payload = signature.simple_signing(DIGEST, "r/x")
    layers = [
        layer(payload, sign(other, payload)),
        layer(payload, sign(private, payload)),
    ]
    assert signature.check("the image", DIGEST, layers, public) == []


def test_an_unreadable_or_private_key_is_a_user_error(signing_key, tmp_path):
    private, public = signing_key("k")
    signature.check_key(public)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key\n")
    for bad in (junk, private):
        with pytest.raises(UserError, match=f"--key {bad}: not a PEM public key"):
            signature.check_key(bad)
