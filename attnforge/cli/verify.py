"""invoke verify: is a published image what its attachments say, and are they there?"""

from __future__ import annotations

from pathlib import Path

from invoke.exceptions import Exit

from ..console import out, user_errors
from ..errors import UserError
from . import IN_FILE, Opt, command, nonempty

NOT_CHECKED = ("signatures not checked: give --key cosign.pub for key-based ones, or run "
               "`cosign verify` for the keyless ones CI makes (docs/ci.md)")  # fmt: skip


def _public_key(flag: str, value: str) -> str:
    """A PEM public key openssl can read (the signature check's own test)."""
    from ..publish import signature

    IN_FILE.check(flag, value)
    signature.check_key(Path(value))
    return value


@command(
    options={
        "image": Opt(
            "REGISTRY/REPOSITORY:TAG",
            nonempty,
            required=True,
            needs=(
                "--image is required: the published image, e.g. invoke verify --image "
                "registry/repository:tag"
            ),
        ),
        "key": Opt("FILE", _public_key, kind="in_file"),
    },  # fmt: skip
    help={
        "image": "the published image: registry/repository:tag or @sha256:... (required)",
        "key": "a PEM public key (cosign.pub): also check the image's cosign signature with it",
        "debug": "show tracebacks",
    },
)
@user_errors
def verify(c, image=None, key=None, debug=False):
    """Check a published image's SBOM, provenance and, with --key, its cosign signature.

    The SBOM and provenance must be present, intact and about this very digest; with --key the
    image's key-based cosign signature must verify (and its attachments', where they have one).

    Keyless signatures (Fulcio certificate, Rekor entry) are checked by cosign (docs/ci.md)."""
    from ..publish import attest, ociregistry, signature
    from ..publish.ociregistry import Ref

    ref = Ref.parse(image)
    found = ociregistry.get_manifest(ref)
    if found is None:
        raise UserError(f"{image}: no such image in the registry")
    digest = ref.reference if ref.reference.startswith("sha256:") else found[2]
    if found[2] != digest:
        raise UserError(f"{image}: the registry serves {found[2]} for that digest")
    sbom = ociregistry.fetch_attachment(ref, digest, "sbom")
    prov = ociregistry.fetch_attachment(ref, digest, "att")
    problems = attest.check(digest, sbom, prov)
    signed = []
    if key:
        sig_problems = signature.check("the image", digest,
                                       ociregistry.fetch_signatures(ref, digest), Path(key))  # fmt: skip
        problems += sig_problems
        if not sig_problems:
            signed.append("the image")
        for what, att in (("the SBOM", sbom), ("the provenance", prov)):
            sigs = ociregistry.fetch_signatures(ref, att["digest"]) if att else None
            if sigs is not None:  # attachments need not be signed; a signature there must hold
                att_problems = signature.check(what, att["digest"], sigs, Path(key))
                problems += att_problems
                if not att_problems:
                    signed.append(what)
    for p in problems:
        out.print(f"- {p}", markup=False, soft_wrap=True)
    if signed and problems:
        out.print(f"signed by the given key: {', '.join(signed)}", markup=False, soft_wrap=True)
    if problems:
        out.print(f"[red]not verified:[/] {ref.with_reference(digest)}")
        if not key:
            out.print(NOT_CHECKED, markup=False, soft_wrap=True)
        raise Exit(code=1)
    out.print(f"[green]verified[/] {ref.with_reference(digest)}: SBOM ({sbom['digest']}) and "
              f"SLSA provenance ({prov['digest']}) attached, intact, about this digest")  # fmt: skip
    if key:
        out.print(f"signed by the given key: {', '.join(signed)} (key-based cosign signature; "
                  "keyless signatures and the Rekor log are not checked here)", markup=False, soft_wrap=True)  # fmt: skip
    else:
        out.print(NOT_CHECKED, markup=False, soft_wrap=True)
