"""The SBOM and provenance of a published image, and the checks `invoke verify` makes of them."""

from __future__ import annotations

import base64
import json

import pytest

from attnforge.publish import attest
from attnforge.publish.ociregistry import Ref, sha256_digest

DIGEST = "sha256:" + "c" * 64
STATUS = """Package: libc6
Status: install ok installed
Architecture: amd64
Version: 2.36-9+deb12u10
Description: GNU C Library
 more text: with a colon

Package: removed-one
Status: deinstall ok config-files
Version: 1.0

Package: python3
Status: install ok installed
Architecture: amd64
Version: 3.11.2-1+b1
"""
PROBE = {"dists": [
    {"name": "torch", "version": "2.13.0+cpu", "dist_info": "/opt/venv/x/torch-2.13.0+cpu.dist-info"},
    {"name": "pip", "version": "23.0.1", "dist_info": "/opt/venv/x/pip-23.0.1.dist-info"},
]}  # fmt: skip


def test_dpkg_status_gives_the_installed_packages_only():
    assert attest.dpkg_packages(STATUS) == [
        ("libc6", "2.36-9+deb12u10", "amd64"),
        ("python3", "3.11.2-1+b1", "amd64"),
    ]


def test_the_sbom_names_the_image_digest_and_every_component():
    doc = attest.sbom("127.0.0.1:5000/ns/cpu:cpu", DIGEST, PROBE, STATUS,
                      [["torch-cpu", "b7175c242cf1"]], {"torch": "d" * 64})  # fmt: skip
    assert doc["metadata"]["component"]["version"] == DIGEST
    by_purl = {c.get("purl"): c for c in doc["components"]}
    assert by_purl["pkg:pypi/torch@2.13.0%2Bcpu"]["hashes"] == [
        {"alg": "SHA-256", "content": "d" * 64}
    ]
    assert "hashes" not in by_purl["pkg:pypi/pip@23.0.1"]  # no wheel file known: no hash claimed
    assert "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=amd64" in by_purl
    assert any(c["name"] == "attnforge-layer-torch-cpu" for c in doc["components"])
    assert doc["specVersion"] == "1.6"


def test_the_provenance_is_slsa_v1_about_the_digest_with_every_input():
    inputs = [
        {"layer": "base", "parent": {"image": "debian:bookworm-slim", "digest": "sha256:" + "e" * 64},
         "args": {}, "context": {}},
        {"layer": "fa", "parent": "k", "args": {"SOURCE_REPO": "https://github.com/ROCm/flash-attention.git",
         "SOURCE_REF": "a" * 40}, "context": {"patches/x.patch": "f" * 64}},
    ]  # fmt: skip
    st = attest.provenance(
        "r/ns/cpu:cpu", DIGEST, inputs, "builder-1", {"arch": "cpu"}, "9" * 64, {"passed": True}
    )
    assert st["_type"] == attest.STATEMENT and st["predicateType"] == attest.SLSA_V1
    assert st["subject"] == [{"name": "r/ns/cpu", "digest": {"sha256": "c" * 64}}]
    deps = {
        d["uri"]: d["digest"] for d in st["predicate"]["buildDefinition"]["resolvedDependencies"]
    }
    assert deps["docker-image:debian:bookworm-slim"] == {"sha256": "e" * 64}
    assert deps[f"git+https://github.com/ROCm/flash-attention.git@{'a' * 40}"] == {
        "gitCommit": "a" * 40
    }
    assert deps["attnforge:patches/x.patch"] == {"sha256": "f" * 64}
    assert st["predicate"]["runDetails"]["byproducts"][0]["digest"] == {"sha256": "9" * 64}


def attachment(payload: bytes, subject: str = DIGEST, layer_digest: str | None = None) -> dict:
    return {"manifest": {"subject": {"digest": subject}}, "digest": "sha256:" + "0" * 64,
            "payload": payload, "layer_digest": layer_digest or sha256_digest(payload)}  # fmt: skip


SBOM = json.dumps({"metadata": {"component": {"version": DIGEST}}}).encode()
PROV = json.dumps(attest.dsse(attest.provenance("r/n/c:c", DIGEST, [], "b", {}, None, {}))).encode()
OTHER = "sha256:" + "1" * 64


@pytest.mark.parametrize(
    "sbom, prov, problem",
    [
        (attachment(SBOM), attachment(PROV), None),
        (None, attachment(PROV), f"no SBOM is attached to {DIGEST}"),
        (attachment(SBOM), None, f"no provenance is attached to {DIGEST}"),
        (attachment(SBOM, subject=OTHER), attachment(PROV), f"the SBOM attachment's subject is {OTHER}"),
        (attachment(SBOM, layer_digest=OTHER), attachment(PROV), "the SBOM attachment's content does not match its digest"),
        (attachment(SBOM.replace(DIGEST.encode(), OTHER.encode())), attachment(PROV), f"the SBOM describes {OTHER}"),
        (attachment(SBOM), attachment(PROV.replace(base64.b64encode(b'{').decode().encode()[:1], b'!')),
         "the provenance is not a DSSE envelope"),
    ],
)  # fmt: skip
def test_verify_names_what_is_missing_or_tampered(sbom, prov, problem):
    problems = attest.check(DIGEST, sbom, prov)
    if problem is None:
        assert problems == []
    else:
        assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("127.0.0.1:5000/ns/cpu:cpu", ("127.0.0.1:5000", "ns/cpu", "cpu")),
        ("127.0.0.1:5000/ns/cpu@" + DIGEST, ("127.0.0.1:5000", "ns/cpu", DIGEST)),
        ("ghcr.io/you/attnforge/default", ("ghcr.io", "you/attnforge/default", "latest")),
    ],
)
def test_image_references_parse(text, parsed):
    ref = Ref.parse(text)
    assert (ref.registry, ref.repo, ref.reference) == parsed
