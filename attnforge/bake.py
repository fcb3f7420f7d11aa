"""A Plan as a `docker buildx bake` file: for teams whose CI already drives bake.

Pure: the plan and a few paths in, a JSON document out (`docker-bake.json`, a format buildx reads
as it is). One target per layer that makes an image, named after the layer; a layer's parent is a
named context, `target:<parent>`, keyed by the very image reference its Dockerfile's
`FROM ${BASE_IMAGE}` names, so bake builds the parent first and hands its result over instead of
pulling. Args, tags and labels are the ones `invoke build` gives the same layer (labels through
`build.labels_for`), so bake and `invoke build` make images under the same content tags.

Bake's file format: github.com/docker/buildx, docs/bake-reference.md (JSON files; target fields
`context`, `contexts`, `dockerfile`, `args`, `tags`, `labels`, `secret`, `cache-from`,
`cache-to`) and https://docs.docker.com/build/bake/contexts/ ("Using a target as a build
context": `target:<name>`), read 2026-11-24; checked against buildx 0.13.1's `bake --print` in
tests/e2e/test_bake_buildx.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: `invoke bake --help` shows BAKE_FILE, nothing more
    from .plan import Plan, Step

BAKE_FILE = "docker-bake.json"
CACHE_SUFFIX = "buildcache"  # tag of a layer's BuildKit cache in the cache namespace


def target_name(step: Step) -> str:
    """Bake target names allow letters, digits, '-' and '_': layer names already are."""
    return step.layer


def build_cache_ref(step: Step, cache_ns: str) -> str:
    """Where a layer's BuildKit cache (cache-to, mode=max) lives: one moving tag per layer and arch."""
    return f"{cache_ns.rstrip('/')}/{step.layer}:{step.arch}-{CACHE_SUFFIX}"


def bake_target(
    step: Step,
    context: str,
    *,
    extra_labels: Mapping[str, str] | None = None,
    ca_cert: str | None = None,
    cache_from: str | None = None,
    push_cache: bool = False,
) -> dict[str, Any]:
    """One layer as a bake target; `context` is the folder its context was staged into."""
    from .build import labels_for
    from .plan import cache_ref

    target: dict[str, Any] = {
        "context": context,
        "dockerfile": "Dockerfile",
        "args": {"BASE_IMAGE": step.base_ref, **step.args, **step.hint_args},
        "tags": [step.hash_tag, *step.moving_tags],
        "labels": labels_for(step, extra_labels),
    }
    if step.parent is not None:
        target["contexts"] = {step.base_ref: f"target:{step.parent}"}
    if ca_cert:
        target["secret"] = [f"id=ca,src={ca_cert}"]
    if cache_from:
        target["cache-from"] = [
            f"type=registry,ref={cache_ref(step, cache_from)}",
            f"type=registry,ref={build_cache_ref(step, cache_from)}",
        ]
        if push_cache:
            target["cache-to"] = [f"type=registry,ref={build_cache_ref(step, cache_from)},mode=max"]
    return target


def bake_document(
    plan: Plan,
    contexts: Mapping[str, str],
    *,
    extra_labels: Mapping[str, str] | None = None,
    ca_cert: str | None = None,
    cache_from: str | None = None,
    push_cache: bool = False,
) -> dict[str, Any]:
    """The plan's image chain as a bake document; `contexts` maps each layer to its staged folder.

    The default group holds every layer, so one `docker buildx bake -f FILE` builds and tags them
    all; a layer's name as the target (`bake ... triton`) builds it and what it sits on.
    """
    chain = plan.chain
    targets = {
        target_name(s): bake_target(
            s,
            contexts[s.layer],
            extra_labels=extra_labels,
            ca_cert=ca_cert,
            cache_from=cache_from,
            push_cache=push_cache,
        )  # fmt: skip
        for s in chain
    }
    return {"group": {"default": {"targets": list(targets)}}, "target": targets}


def context_folder(root: Path, step: Step) -> Path:
    """Where the bake task stages a layer's context under its output folder."""
    return root / f"{step.layer}-{step.short_hash}" / "context"
