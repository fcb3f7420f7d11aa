"""What a published image is made of and who made it: a CycloneDX SBOM and an in-toto statement
with SLSA provenance v1, and the checks `invoke verify` runs on them.

The SBOM is made with cyclonedx-python-lib (CycloneDX's maintained library) from the image's own
filesystem as the image reports it: every Python distribution (envprobe.py), every Debian package
(/var/lib/dpkg/status) and attnforge's own layers. BuildKit's `--sbom` would need a BuildKit
scanner image this environment cannot pull, and syft is not installable here; both read the same
files. Pure: the engine and registry work is in attnforge/cli/publish.py and cli/verify.py.
"""

from __future__ import annotations

import base64
import json
import warnings
from typing import Any

SBOM_MEDIA = "application/vnd.cyclonedx+json"
DSSE_MEDIA = "application/vnd.dsse.envelope.v1+json"
INTOTO_PAYLOAD = "application/vnd.in-toto+json"
STATEMENT = "https://in-toto.io/Statement/v1"
SLSA_V1 = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/attnforge/attnforge/blob/main/docs/ci.md#provenance"


def dpkg_packages(status: str) -> list[tuple[str, str, str]]:
    """(name, version, architecture) of every installed package in a dpkg status file."""
    found = []
    for para in status.split("\n\n"):
        fields: dict[str, str] = {}
        for line in para.splitlines():
            if line[:1] not in (" ", "\t") and ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Package") and "installed" in fields.get("Status", "").split():
            found.append(
                (fields["Package"], fields.get("Version", ""), fields.get("Architecture", ""))
            )
    return sorted(found)


def sbom(image: str, digest: str, probe: dict, dpkg_status: str, lineage: list,
         wheel_hashes: dict[str, str]) -> dict:  # fmt: skip
    """CycloneDX 1.6 JSON for the image `image@digest`."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    from ..export import TOOLING, dists_of

    bom = Bom()
    name = image.rsplit(":", 1)[0] if "@" not in image else image.split("@")[0]
    bom.metadata.component = root = Component(
        name=name, version=digest, type=ComponentType.CONTAINER, bom_ref=f"image:{digest}",
        purl=PackageURL("oci", "", name.rsplit("/", 1)[-1], digest,
                        qualifiers={"repository_url": name}),
    )  # fmt: skip
    parts = []
    dists, _ = dists_of(probe)
    for d in sorted(dists, key=lambda d: d.key):
        sha = wheel_hashes.get(d.key)
        comp = Component(
            name=d.key, version=d.version, type=ComponentType.LIBRARY,
            bom_ref=f"pypi:{d.key}@{d.version}", purl=PackageURL("pypi", "", d.key, d.version),
            hashes=[HashType(alg=HashAlgorithm.SHA_256, content=sha)] if sha else [],
            properties=[Property(name="attnforge:dist-info", value=d.dist_info)]
            + ([Property(name="attnforge:installer-tooling", value="true")] if d.key in TOOLING else []),
        )  # fmt: skip
        parts.append(comp)
    for pkg, version, arch in dpkg_packages(dpkg_status):
        parts.append(Component(
            name=pkg, version=version, type=ComponentType.LIBRARY, bom_ref=f"deb:{pkg}@{version}",
            purl=PackageURL("deb", "debian", pkg, version, qualifiers={"arch": arch} if arch else None),
        ))  # fmt: skip
    for layer, key in lineage:
        parts.append(Component(
            name=f"attnforge-layer-{layer}", version=key, type=ComponentType.CONTAINER,
            bom_ref=f"layer:{layer}@{key}", supplier=None,
            properties=[Property(name="attnforge:cache-key", value=key)],
        ))  # fmt: skip
    for c in parts:
        bom.components.add(c)
    bom.register_dependency(root, parts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return json.loads(JsonV1Dot6(bom).output_as_string())


def provenance(image: str, digest: str, inputs: list[dict], builder: str, invocation: dict,
               report_sha256: str | None, validation: dict) -> dict:  # fmt: skip
    """An in-toto Statement v1 with a SLSA provenance v1 predicate, from each layer's BuildInput."""
    deps: list[dict[str, Any]] = []
    for i in inputs:
        parent = i.get("parent")
        if isinstance(parent, dict) and parent.get("image"):
            dep = {"uri": f"docker-image:{parent['image']}"}
            if parent.get("digest"):
                dep["digest"] = {"sha256": str(parent["digest"]).removeprefix("sha256:")}
            deps.append(dep)
        args = i.get("args", {})
        if args.get("SOURCE_REPO") and args.get("SOURCE_REF"):
            deps.append({"uri": f"git+{args['SOURCE_REPO']}@{args['SOURCE_REF']}",
                         "digest": {"gitCommit": args["SOURCE_REF"]}})  # fmt: skip
        for path, sha in sorted(i.get("context", {}).items()):
            deps.append({"uri": f"attnforge:{path}", "digest": {"sha256": sha}})
    byproducts = []
    if report_sha256:
        byproducts.append({"name": "validation report (report.json)", "digest": {"sha256": report_sha256},
                           "annotations": {"passed": validation.get("passed")}})  # fmt: skip
    name = image.rsplit(":", 1)[0] if "@" not in image else image.split("@")[0]
    return {
        "_type": STATEMENT,
        "subject": [{"name": name, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": SLSA_V1,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": invocation,
                "internalParameters": {"layers": inputs},
                "resolvedDependencies": deps,
            },
            "runDetails": {"builder": {"id": builder}, "byproducts": byproducts},
        },
    }


def dsse(statement: dict) -> dict:
    """An unsigned DSSE envelope around a statement (signing happens in CI: docs/ci.md)."""
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    return {"payloadType": INTOTO_PAYLOAD, "payload": base64.b64encode(payload).decode(),
            "signatures": []}  # fmt: skip


def check(digest: str, sbom_att: dict | None, prov_att: dict | None) -> list[str]:
    """Why the attachments fetched for the image `digest` cannot be trusted; empty when the SBOM
    and the provenance are there, name that digest as their subject, and are intact."""
    from .ociregistry import sha256_digest

    problems = []
    for what, att in (("SBOM", sbom_att), ("provenance", prov_att)):
        if att is None:
            problems.append(f"no {what} is attached to {digest}")
            continue
        subject = (att["manifest"].get("subject") or {}).get("digest")
        if subject != digest:
            problems.append(f"the {what} attachment's subject is {subject}, not {digest}")
        if att["payload"] is None or sha256_digest(att["payload"]) != att["layer_digest"]:
            problems.append(f"the {what} attachment's content does not match its digest")
            att["payload"] = None
    if sbom_att and sbom_att["payload"]:
        try:
            doc = json.loads(sbom_att["payload"])
            named = doc["metadata"]["component"]["version"]
        except (ValueError, KeyError, TypeError):
            problems.append("the SBOM is not CycloneDX JSON with metadata.component")
        else:
            if named != digest:
                problems.append(f"the SBOM describes {named}, not {digest}")
    if prov_att and prov_att["payload"]:
        try:
            env = json.loads(prov_att["payload"])
            statement = json.loads(base64.b64decode(env["payload"]))
            subjects = [s["digest"]["sha256"] for s in statement["subject"]]
            kind = statement["predicateType"]
        except (ValueError, KeyError, TypeError):
            problems.append("the provenance is not a DSSE envelope of an in-toto statement")
        else:
            if digest.removeprefix("sha256:") not in subjects:
                problems.append(f"the provenance statement's subject is {subjects}, not {digest}")
            if kind != SLSA_V1:
                problems.append(f"the provenance predicate is {kind}, not {SLSA_V1}")
    return problems
