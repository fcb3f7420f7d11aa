"""Every AMD arch x every stack: `invoke build --dry-run` plans it or refuses with a reason.

The whole matrix goes through the planner in-process (what --dry-run prints); the stacks on
torch 2.15 (pytorch.org's channel and the source stack) also go through the command itself,
on every AMD arch, without an engine."""

from __future__ import annotations

import json
import os

import pytest

from attnforge.plan import resolve, stack_fits
from attnforge.recipes import load_recipes
from tests.conftest import REPO, run_invoke

RECIPES = load_recipes(REPO)
AMD = sorted(a for a, spec in RECIPES.arches.items() if spec.vendor == "amd")
TORCH_2_15 = {
    "pytorch-org2.15": ("pytorch-org", "TORCH_VERSION", "2.15.0+rocm10.0"),
    "pytorch-org2.15-rocm7.14": ("pytorch-org", "TORCH_VERSION", "2.15.0+rocm7.14"),
    "source": ("pytorch-source", "PYTORCH_BUILD_VERSION", "2.15.0"),
}
PLANNED = {"build"}
REFUSED = {"unsupported", "blocked", "skipped"}


def _judge(steps) -> str | None:
    """None when every step is planned or refused with a reason; else what is wrong."""
    for s in steps:
        if s["status"] in PLANNED:
            continue
        if s["status"] not in REFUSED:
            return f"{s['layer']}: status {s['status']!r}"
        if not s["reason"].strip():
            return f"{s['layer']}: {s['status']} without a reason"
    return None


def test_the_matrix_covers_the_new_stacks_and_every_amd_arch():
    assert set(TORCH_2_15) <= set(RECIPES.stacks)
    assert {"gfx1151", "gfx942", "gfx950", "gfx1201"} <= set(AMD)


@pytest.mark.parametrize("stack", sorted(RECIPES.stacks))
def test_every_amd_arch_plans_or_refuses_with_a_reason(stack):
    spec = RECIPES.stacks[stack]
    for arch in AMD:
        if not stack_fits(spec, RECIPES.arches[arch]):
            continue  # the stack is for other arches (cpu); stack_options says so
        plan = resolve(RECIPES, arch, stack)
        steps = [{"layer": s.layer, "status": s.status, "reason": s.reason} for s in plan.steps]
        assert _judge(steps) is None, (arch, stack, _judge(steps))


@pytest.mark.parametrize("stack", sorted(TORCH_2_15))
def test_the_torch_2_15_stacks_dry_run_on_every_amd_arch(stack, tmp_path):
    env = dict(
        os.environ,
        DOCKER_HOST="unix:///nonexistent.sock",  # no engine: nothing is cached
        ATTNFORGE_BUILD_DIR=str(tmp_path / "build"),
        ATTNFORGE_REPORTS_DIR=str(tmp_path / "reports"),
    )
    layer, key, version = TORCH_2_15[stack]
    planned = []
    for arch in AMD:
        proc = run_invoke(
            REPO, "build", "--arch", arch, "--stack", stack, "--dry-run", "--json", env=env
        )
        assert proc.returncode == 0, (arch, proc.stderr)
        steps = json.loads(proc.stdout)["steps"]
        assert _judge(steps) is None, (arch, _judge(steps))
        torch = next(s for s in steps if s["layer"] == layer)
        if torch["status"] == "build":
            planned.append(arch)
            assert torch["input"]["args"].get(key, torch["args"].get(key)) == version
    assert planned == AMD  # torch 2.15 itself plans on every AMD arch
