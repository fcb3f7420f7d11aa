"""invoke publish: push a stack's images to a registry, only when its final image passed validation."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import TYPE_CHECKING

from ..console import out, user_errors
from ..engine import RunRequest, connect
from ..errors import UserError
from ..files import write_aside
from ..workspace import VALIDATED, Workspace
from . import ARCH, ENGINE, NAMESPACE, STACK, Opt, choose_target, command
from .export import probe_image

if TYPE_CHECKING:  # the library is imported where a task uses it (attnforge/cli/__init__.py)
    from .. import multiarch


def publish_refs(
    lineage: list[list[str]], arch: str, stack: str, namespace: str
) -> list[tuple[str, list[str]]]:
    """(local content tag, [tags to push]) for each layer of a final image, root first."""
    refs = []
    for i, (layer, short) in enumerate(lineage):
        tags = [f"{layer}:{arch}-{short}", f"{layer}:{arch}"]
        if i == len(lineage) - 1:
            tags.append(f"{stack}:{arch}")
        refs.append((f"{namespace}/{layer}:{arch}-{short}", tags))
    return refs


@command(
    options={
        "to": Opt("REGISTRY/NAMESPACE", NAMESPACE.check, kind="namespace"),
        "arch": ARCH,
        "stack": STACK,
        "namespace": NAMESPACE,
        "engine": ENGINE,
    },  # fmt: skip
    writes=("build", "reports"),
    help={
        "to": "registry namespace to push to, e.g. ghcr.io/org/attnforge (required)",
        "arch": "arch of the stack to publish (default: the host's AMD GPU, else cpu)",
        "stack": "stack to publish (default: as for build)",
        "namespace": "local image name prefix the stack was built under (default: attnforge)",
        "engine": "container engine: docker (default) or podman",
        "debug": "show tracebacks",
    },
)
@user_errors
def publish(c, to=None, arch=None, stack=None, namespace="attnforge", engine="docker", debug=False):
    """Push every layer of a validated stack (content and moving tags); refuse an unvalidated one."""
    from .. import multiarch
    from ..baseline.store import snapshot_published
    from ..mirror.use import refuse_rehearsal
    from ..plan import Options, resolve
    from ..recipes import load_recipes

    if not to:
        raise UserError(
            "--to is required: the registry namespace to push to (e.g. ghcr.io/org/attnforge)"
        )
    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    arch, stack = choose_target(recipes, arch, stack)
    final = resolve(recipes, arch, stack, Options(namespace=namespace)).final_tag
    eng = connect(engine)
    final_id = eng.image_id(final) if final else None
    if final_id is None:
        raise UserError(f"no image {final}", hint=f"invoke build --arch {arch} --stack {stack}")
    refuse_rehearsal(eng.labels(final), final, "published")
    if isinstance(recipes.arches[arch], multiarch.ArchSet):
        record = set_validation(ws, recipes.arches[arch], stack, final, final_id)
    else:
        record = single_validation(ws, arch, stack, final, final_id)
    lineage = json.loads(eng.labels(final).get("org.attnforge.lineage", "[]"))
    if not lineage:
        raise UserError(f"{final} has no org.attnforge.lineage label: was it built by attnforge?")
    # Everything the SBOM and the provenance need, gathered before anything is pushed: an image
    # whose SBOM or provenance cannot be produced is not published.
    facts = attestation_facts(ws, eng, recipes, arch, stack, namespace, final, final_id, lineage)

    log_path = ws.logs_for(arch) / "publish.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    refs: list[dict] = []
    made: list[str] = []  # tags this publish added to the engine: removed again if it fails
    try:
        with log_path.open("w") as log:
            _push_all(eng, lineage, arch, stack, namespace, to, final, log, refs, made)
        final_ref = f"{to.rstrip('/')}/{stack}:{arch}"
        attestations = attach_attestations(final_ref, refs, facts, record)
    except BaseException as exc:  # the engine's own errors (a refused name, a registry down)
        for ref in made:
            eng.untag(ref)
        if not isinstance(exc, Exception):
            raise  # Ctrl-C: the tags are gone again; user_errors says "interrupted"
        said = exc.message if isinstance(exc, UserError) else _first_line(exc)
        pushed = f"{len(refs)} tag(s) reached the registry before it; " if refs else ""
        raise UserError(
            f"publishing to {to} failed: {said}; {pushed}the tags this publish made here were "
            f"removed and no publish.json was written (log: {log_path})",
            hint="fix the cause and run the same command again",
        ) from exc
    manifest = {
        "arch": arch, "stack": stack, "to": to, "image": final, "image_id": final_id,
        "versions": json.loads(eng.labels(final).get("org.attnforge.versions", "{}")),
        "validation": record, "refs": refs, "attestations": attestations,
    }  # fmt: skip
    where = ws.reports_for(arch, stack)
    write_aside(where / "publish.json", json.dumps(manifest, indent=2) + "\n")
    write_aside(where / "publish.md", pull_lines(manifest))
    # The report published with this image, kept by its digest: `invoke validate --bench
    # --baseline IMAGE` reads it (attnforge/baseline/store.py says why it is kept here).
    final_digest = next((r["digest"] for r in refs if r["ref"].endswith(f"/{stack}:{arch}")), "")
    kept = snapshot_published(where, manifest, final_digest)
    out.print(pull_lines(manifest), markup=False, highlight=False)
    out.print(f"the published report and benchmark are kept in {kept}", markup=False)
    out.print(f"[green]published[/] {len(refs)} tags of the validated {final} to {to}; "
              f"digests in {where / 'publish.json'}")  # fmt: skip


def _push_all(eng, lineage, arch, stack, namespace, to, final, log, refs, made) -> None:
    """Tag and push every layer of `final`, root first, recording each pushed ref in `refs` and
    each tag that was new to the engine in `made`."""
    for local, tags in publish_refs(lineage, arch, stack, namespace):
        image = eng.image_id(local)
        if image is None:
            raise UserError(f"{local} (a layer of {final}) is missing locally")
        labels = eng.labels(local)
        for tag in tags:
            target = f"{to.rstrip('/')}/{tag}"
            if eng.image_id(target) is None:
                made.append(target)
            eng.tag(image, target)
            out.print(f"pushing {target}")
            eng.push(target, log)
            refs.append({
                "ref": target,
                "digest": eng.registry_digest(target),  # what the registry now serves
                "layer": labels.get("org.attnforge.layer"),
                "content_hash": labels.get("org.attnforge.hash"),
                "image_id": image,
            })  # fmt: skip


def _first_line(exc: Exception) -> str:
    text = getattr(exc, "explanation", None) or getattr(exc, "stderr", None) or str(exc)
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def attestation_facts(ws, eng, recipes, arch, stack, namespace, final, final_id, lineage) -> dict:
    """What the image holds (its Python distributions and Debian packages) and what it was built
    from (each layer's BuildInput, matched to the image's lineage by cache key)."""
    from ..baseline.store import sha256_file
    from ..plan import Options, resolve

    probe = probe_image(eng, final)
    dpkg = eng.run(RunRequest(image=final, command=["cat", "/var/lib/dpkg/status"], network="none"),
                   timeout=300)  # fmt: skip
    if dpkg.returncode != 0:
        raise UserError(
            f"no SBOM: reading /var/lib/dpkg/status in {final} failed; nothing was published"
        )
    plan = resolve(recipes, arch, stack, Options(namespace=namespace))
    by_key = {s.hash: s.input.to_json() for s in plan.steps if s.input is not None}
    kept = {}
    for path in (ws.state_dir / "inputs" / arch).glob("*.json"):
        with contextlib.suppress(ValueError, KeyError, OSError):
            doc = json.loads(path.read_text())
            kept[doc["key"]] = doc["input"]
    inputs = []
    for layer, short in lineage:
        found = next((v for k, v in {**kept, **by_key}.items() if k.startswith(short)), None)
        if found is None:
            raise UserError(
                f"no provenance: the inputs of layer {layer} ({short}) of {final} are neither "
                "in this tree's plan nor in the build state; nothing was published",
                hint=f"invoke build --arch {arch} --stack {stack} (a cached build records them)",
            )
        inputs.append(found)
    wheel_hashes = {}
    export_json = ws.build_dir / "export" / arch / stack / "export.json"
    if export_json.is_file():  # an export of this very image knows the wheel files' sha256
        doc = json.loads(export_json.read_text())
        if doc.get("image_id") == final_id:
            wheel_hashes = {w["name"]: w["sha256"] for w in doc["wheels"]}
    report = ws.reports_for(arch, stack) / "report.json"
    return {"probe": probe, "dpkg": dpkg.stdout, "inputs": inputs, "lineage": lineage,
            "wheel_hashes": wheel_hashes, "invocation": {"arch": arch, "stack": stack},
            "report_sha256": sha256_file(report) if report.is_file() else None}  # fmt: skip


def attach_attestations(final_ref: str, refs: list[dict], facts: dict, record: dict) -> dict:
    """Attach the SBOM and the provenance to the pushed final image, by its digest."""
    from ..publish import attest, ociregistry
    from ..publish.ociregistry import Ref

    digest = next(r["digest"] for r in refs if r["ref"] == final_ref)
    subject = Ref.parse(final_ref)
    builder = os.environ.get("ATTNFORGE_BUILDER_ID") or f"attnforge@{socket.gethostname()}"
    sbom_doc = attest.sbom(final_ref, digest, facts["probe"], facts["dpkg"], facts["lineage"],
                           facts["wheel_hashes"])  # fmt: skip
    statement = attest.provenance(final_ref, digest, facts["inputs"], builder, facts["invocation"],
                                  facts["report_sha256"], record)  # fmt: skip
    found = {}
    for key, suffix, kind, media, doc in (
        ("sbom", "sbom", attest.SBOM_MEDIA, attest.SBOM_MEDIA, sbom_doc),
        ("provenance", "att", attest.INTOTO_PAYLOAD, attest.DSSE_MEDIA, attest.dsse(statement)),
    ):
        payload = json.dumps(doc, indent=1).encode()
        ref, manifest_digest = ociregistry.attach(subject, digest, suffix, kind, media, payload)
        out.print(f"attached the {key} to {subject.with_reference(digest)}: {ref}", markup=False)
        found[key] = {"ref": ref, "digest": manifest_digest,
                      "content_sha256": ociregistry.sha256_digest(payload)}  # fmt: skip
    return found


def single_validation(
    ws: Workspace, arch: str, stack: str, final: str, final_id: str, done: str = "published"
) -> dict:
    """The stamp `invoke validate` left for this very image, or a UserError saying why not and
    that the image is not `done` with (published, exported)."""
    stamp = ws.validated_stamp(arch, stack)
    if not stamp.exists():
        raise UserError(
            f"{final} was never validated here; it is not {done}",
            hint=f"invoke validate --arch {arch} --stack {stack}",
        )
    record = json.loads(stamp.read_text())
    if record.get("image_id") != final_id:
        raise UserError(
            f"{final} changed since it was validated (validated {str(record.get('image_id'))[:19]}, now {final_id[:19]}); it is not {done}",
            hint=f"invoke validate --arch {arch} --stack {stack}",
        )
    if not record.get("passed"):
        raise UserError(
            f"{final} failed validation (exit {record.get('exit')}); it is not {done}",
            hint=f"see {ws.reports_for(arch, stack) / 'report.md'}",
        )
    return record


def set_validation(
    ws: Workspace, arch: multiarch.ArchSet, stack: str, final: str, final_id: str
) -> dict:
    """One image for several arches is published only when every member passed on it."""
    from .. import multiarch

    reports = ws.reports_for(arch.name, stack)
    stamps = {}
    for m in arch.members:
        path = multiarch.member_reports(reports, m.name) / VALIDATED
        stamps[m.name] = json.loads(path.read_text()) if path.is_file() else None
    why = multiarch.publish_refusals(final_id, stamps)
    if why:
        raise UserError(
            f"{final} is not published: {'; '.join(why)}",
            hint=f"run `invoke validate --arch {arch.name} --stack {stack}` on a GPU of each "
            "arch it lists",
        )
    return {"image": final, "image_id": final_id, "passed": True, "members": stamps}


def pull_lines(manifest: dict) -> str:
    """Markdown for consumers: pin the published stack by digest, never by a moving tag."""
    final = [
        r for r in manifest["refs"] if r["ref"].endswith(f"/{manifest['stack']}:{manifest['arch']}")
    ]
    lines = [f"### Published {manifest['stack']} for {manifest['arch']}", "", "```"]
    for r in final or manifest["refs"][-1:]:
        name = r["ref"].rsplit(":", 1)[0]
        lines.append(f"docker pull {name}@{r['digest']}")
    lines += ["```", "", "| layer | ref | digest |", "|---|---|---|"]
    lines += [f"| {r['layer']} | `{r['ref']}` | `{r['digest']}` |" for r in manifest["refs"]]
    return "\n".join(lines) + "\n"
