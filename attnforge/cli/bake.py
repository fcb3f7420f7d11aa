"""invoke bake: the build plan as a `docker buildx bake` file, with every layer's context staged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..bake import BAKE_FILE, bake_document, context_folder
from ..console import out, user_errors
from ..errors import UserError
from ..files import aside, swap_folder, write_aside
from ..workspace import Workspace
from . import HOST_CA_BUNDLE, OUT_FILE, command
from .build import BUILD_OPTIONS, build_invocation, connect_for_plan, local_defaults

if TYPE_CHECKING:  # the library is imported where a task uses it (attnforge/cli/__init__.py)
    from ..plan import Plan


@command(
    options={**{k: v for k, v in BUILD_OPTIONS.items() if k != "engine"}, "output": OUT_FILE},
    writes=("build",),
    help={
        "arch": "GPU arch to plan for (default: the host's AMD GPU, else cpu); see `invoke arches`",
        "stack": "stack from recipes/stacks.yaml (default: 'default', or the arch's only stack)",
        "output": f"where to write the bake file (default: build/bake/<arch>/<stack>/{BAKE_FILE})",
        "only": "only this layer and the layers it sits on",
        "set_": "override a recipe value: LAYER.KEY=VALUE (repeatable)",
        "base_image": "base image for the first layer (default: as invoke build chooses it)",
        "wheelhouse": "folder of local wheels staged into the contexts (default: build/wheelhouse "
        "when it holds wheels)",
        "ca_cert": f"CA bundle for pip inside builds, a BuildKit secret in the file (default: "
        f"{HOST_CA_BUNDLE} when it exists; 'none' for no bundle)",
        "namespace": "image name prefix, e.g. registry.example.com/team (default: attnforge)",
        "jobs": "MAX_JOBS for the builds (default: from host memory, 4 GiB a job)",
        "cache_from": "registry namespace for cache-from: each layer's content tag and its "
        "BuildKit cache tag (default: attnforge.cache_from in invoke.yaml)",
        "push_cache": "with --cache-from: add cache-to, each layer's BuildKit cache (mode=max) "
        "under <layer>:<arch>-buildcache in that namespace",
        "debug": "show tracebacks",
    },
)
@user_errors
def bake(
    c, arch=None, stack=None, output=None, only=None, set_=None, base_image=None, wheelhouse=None,
    ca_cert=None, namespace="attnforge", jobs=None, cache_from=None, push_cache=False, debug=False,
):  # fmt: skip
    """Write a `docker buildx bake` file equivalent to the build plan: one target per layer."""
    from ..build import plan_build, provenance
    from ..recipes import load_recipes

    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    inv = build_invocation(
        recipes, ws, arch, stack, only, set_, base_image, wheelhouse, ca_cert,
        "docker", jobs, namespace,
    )  # fmt: skip
    cache_from = cache_from or (c.config.get("attnforge") or {}).get("cache_from")
    if push_cache and not cache_from:
        raise UserError("--push-cache goes with --cache-from (or attnforge.cache_from)")
    # The engine gives the base image's digest, part of the first layer's key: without it the
    # content tags would differ from those `invoke build` makes on this machine.
    eng = connect_for_plan(inv.engine, quiet=False)
    if eng is not None:
        inv = local_defaults(inv, recipes, ws, eng, given_base=base_image is not None)
    plan, _ = plan_build(inv, recipes, ws, eng)
    if plan.blocked_by:
        first = plan.blocked_by[0]
        raise UserError(
            f"stack {plan.stack} cannot be built for {plan.arch}: layer {first.layer} is "
            f"unsupported: {first.reason}"
        )
    folder = ws.build_dir / "bake" / plan.arch / plan.stack
    target = Path(output).resolve() if output else folder / BAKE_FILE
    dest = folder / "contexts"
    fresh = aside(dest)
    try:
        contexts = _stage(plan, ws, fresh, dest, Path(inv.wheelhouse) if inv.wheelhouse else None)
        doc = bake_document(
            plan, contexts, extra_labels=provenance(ws), ca_cert=inv.ca_cert,
            cache_from=cache_from, push_cache=push_cache,
        )  # fmt: skip
        # Everything is complete aside before the earlier file and contexts are replaced.
        text = json.dumps(doc, indent=2) + "\n"
        swap_folder(fresh, dest)
        write_aside(target, text)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)  # a failed bake leaves no half-staged folder
    out.print(f"wrote {target}: {len(doc['target'])} targets ({', '.join(doc['target'])})")
    out.print(
        f"build them: docker buildx bake -f {target} --load   (or --push; its BuildKit must "
        "support named contexts: BuildKit 0.10 or newer)",
        markup=False, soft_wrap=True,
    )  # fmt: skip


def _stage(
    plan: Plan, ws: Workspace, fresh: Path, dest: Path, wheelhouse: Path | None
) -> dict[str, str]:
    """Stage every layer's context into `fresh`, beside dest (swapped in once complete); the
    paths the bake file names are under dest."""
    from ..build import stage_context

    shutil.rmtree(fresh, ignore_errors=True)
    found = {}
    for step in plan.chain:
        ctx = context_folder(fresh, step)
        stage_context(step, ws.root, ctx.parent, wheelhouse)
        (ctx.parent / ".owner").unlink(missing_ok=True)  # no build owns these: nothing sweeps them
        found[step.layer] = str(context_folder(dest, step))
    return found
