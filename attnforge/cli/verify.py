"""invoke verify: is a published image what its attachments say, and are they there?"""

from __future__ import annotations

from invoke.exceptions import Exit

from .. import attest, ociregistry
from ..console import out, user_errors
from ..errors import UserError
from ..ociregistry import Ref
from . import command, text


@command(
    options={"image": text("REGISTRY/REPOSITORY:TAG")},
    help={
        "image": "the published image: registry/repository:tag or @sha256:... (required)",
        "debug": "show tracebacks",
    },
)
@user_errors
def verify(c, image=None, debug=False):
    """Check a published image's SBOM and provenance: present, intact, about this very digest.

    Signatures are checked by cosign in CI (docs/ci.md), not here."""
    if not image:
        raise UserError(
            "--image is required: the published image, e.g. invoke verify --image registry/repository:tag"
        )
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
    for p in problems:
        out.print(f"- {p}", markup=False)
    if problems:
        out.print(f"[red]not verified:[/] {ref.with_reference(digest)}")
        raise Exit(code=1)
    out.print(f"[green]verified[/] {ref.with_reference(digest)}: SBOM ({sbom['digest']}) and "
              f"SLSA provenance ({prov['digest']}) attached, intact, about this digest; "
              "signature not checked here")  # fmt: skip
