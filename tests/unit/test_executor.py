"""The executor's promises, against a recording engine: requests in, scripted results out.

Tags move only after the build and the smoke checks passed; a failure or an interrupt is recorded
in the state file; a cache hit retags without building; what the engine receives is exactly the
request the plan made before anything ran. The same promises run on a real Docker engine in
tests/e2e; here each one is pinned down without one.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from attnforge.build import (
    BuildState,
    InputsStore,
    Invocation,
    LayerFailed,
    build_requests,
    execute,
    plan_build,
    staging_for,
    sweep_staging,
)
from attnforge.errors import UserError
from attnforge.plan import UNCHANGED
from attnforge.workspace import Workspace
from tests.unit.conftest import RecordingEngine


def run(ws: Workspace, recipes, engine: RecordingEngine, notes=None, **inv):
    invocation = Invocation(arch="cpu", stack="cpu", namespace="t", **inv)
    plan, _ = plan_build(invocation, recipes, ws, engine, notes)
    state = BuildState(invocation)
    requests = build_requests(plan, ws)
    try:
        return plan, requests, execute(plan, engine, ws=ws, state=state, requests=requests)
    finally:
        engine.state = BuildState.load(ws) if BuildState.path(ws).exists() else None


def test_a_full_build_tags_every_layer_after_its_smoke_checks(ws, recipes):
    engine = RecordingEngine()
    plan, _, outcomes = run(ws, recipes, engine)
    assert [o.status for o in outcomes] == ["built"] * 6
    kinds = [c[0] for c in engine.calls]
    # per layer: build, then smoke run, then tags; never a tag before its layer's smoke run
    for layer in ("base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"):
        b = next(i for i, c in enumerate(engine.calls) if c[:2] == ("build", layer))
        assert kinds[b + 1] == "run" and kinds[b + 2] == "tag"
    assert engine.images["t/cpu:cpu"] == "sha256:validate-image"
    assert engine.state.in_progress is None and engine.state.failed is None


def test_the_engine_receives_exactly_the_requests_made_from_the_plan(ws, recipes):
    engine = RecordingEngine()
    _, requests, _ = run(ws, recipes, engine)
    received = {c[1]: c[2] for c in engine.calls if c[0] == "build"}
    assert received == requests
    triton = requests["triton"]
    assert triton.build_args["PATCH_SERIES"] == "patches/selftest/cpu-demo"
    assert triton.build_args["BASE_IMAGE"].startswith("t/apps:cpu-")
    # staged under the build folder, and cleaned up after the layer
    assert triton.context.is_relative_to(ws.staging_dir)
    assert not triton.context.exists()


def test_a_failed_build_moves_no_tag_and_records_the_layer(ws, recipes):
    engine = RecordingEngine(fail_build={"triton"})
    with pytest.raises(LayerFailed, match="layer 'triton' failed to build") as err:
        run(ws, recipes, engine)
    assert "no matching distribution" in err.value.message  # the failing step's own output
    assert engine.built() == ["base", "torch-cpu", "cpp-extension", "apps", "triton"]
    assert not any(
        "triton" in ref or "validate" in ref or ref == "t/cpu:cpu" for ref in engine.tags_moved()
    )
    assert engine.state.failed == "triton" and engine.state.interrupted is False


def test_a_failed_smoke_check_moves_no_tag(ws, recipes):
    engine = RecordingEngine(fail_smoke={"torch-cpu"})
    with pytest.raises(LayerFailed, match="built but failed 3 smoke check"):
        run(ws, recipes, engine)
    assert not any("torch-cpu" in ref for ref in engine.tags_moved())
    assert engine.state.failed == "torch-cpu"


def test_an_interrupt_mid_build_is_recorded_and_moves_no_tag(ws, recipes):
    engine = RecordingEngine(interrupt={"triton"})
    with pytest.raises(KeyboardInterrupt):
        run(ws, recipes, engine)
    assert engine.state.failed == "triton" and engine.state.interrupted is True
    assert engine.state.stopped_at == "triton"
    assert not any("triton" in ref for ref in engine.tags_moved())


def test_a_layer_in_progress_is_on_disk_before_the_engine_is_called(ws, recipes):
    """What `--continue` reads after a SIGKILL, when no handler ran."""
    seen = {}

    class Spy(RecordingEngine):
        def build(self, req, log, on_line=None):
            seen[req.labels["org.attnforge.layer"]] = BuildState.load(ws).in_progress
            return super().build(req, log, on_line)

    run(ws, recipes, Spy())
    assert seen == {
        layer: layer
        for layer in ("base", "torch-cpu", "cpp-extension", "apps", "triton", "validate")
    }


def test_a_cache_hit_retags_without_building(ws, recipes):
    first = RecordingEngine()
    plan, _, _ = run(ws, recipes, first)
    images = {s.hash_tag: first.images[s.hash_tag] for s in plan.chain}  # moving tags gone
    second = RecordingEngine(images=dict(images))
    _, requests, outcomes = run(ws, recipes, second)
    assert [o.status for o in outcomes] == ["cached"] * 6
    assert requests == {} and second.built() == []
    assert second.images["t/cpu:cpu"] == "sha256:validate-image"


def test_the_inputs_of_each_build_are_kept_and_explain_the_next_plan(ws, recipes):
    run(ws, recipes, RecordingEngine())
    kept = InputsStore(ws).load("cpu")
    assert set(kept) == {"base", "torch-cpu", "cpp-extension", "apps", "triton", "validate"}
    invocation = Invocation(
        arch="cpu", stack="cpu", namespace="t", sets=["triton.NUMPY_VERSION=2.3.5"]
    )
    plan, _ = plan_build(invocation, recipes, ws, RecordingEngine())
    why = {s.layer: s.changes for s in plan.steps}
    assert why["triton"] == ("arg NUMPY_VERSION 2.4.6 -> 2.3.5",)
    assert why["validate"] == ("parent triton rebuilt",)
    assert why["apps"] == (UNCHANGED,)  # below triton: a triton pin does not rebuild it
    assert why["base"] == why["torch-cpu"] == (UNCHANGED,)  # the recording engine forgot them


def test_staging_left_by_a_dead_build_is_swept_and_a_live_one_is_kept(ws, recipes):
    plan, _ = plan_build(Invocation(arch="cpu", stack="cpu"), recipes, ws, None)
    dead, live = (staging_for(ws, s) for s in plan.chain[:2])
    child = subprocess.Popen(["true"])
    child.wait()  # a pid that no longer runs
    for folder, pid in ((dead, child.pid), (live, os.getppid())):
        folder.mkdir(parents=True)
        (folder / ".owner").write_text(f"{pid}\n")
        (folder / "big.whl").write_bytes(b"x" * 1024)
    assert sweep_staging(ws) == [dead]
    assert not dead.exists() and live.exists()


def _cache_of(ws, recipes) -> dict[str, str]:
    """What a first build pushed to reg/ns: each layer's content tag -> its image id."""
    first = RecordingEngine()
    plan, _, _ = run(ws, recipes, first)
    return {f"reg/ns/{s.layer}:cpu-{s.short_hash}": first.images[s.hash_tag] for s in plan.chain}


def test_a_layer_in_the_registry_cache_is_pulled_smoke_checked_and_tagged_not_built(ws, recipes):
    engine = RecordingEngine(registry=_cache_of(ws, recipes))
    plan, requests, outcomes = run(ws, recipes, engine, cache_from="reg/ns")
    assert [o.status for o in outcomes] == ["pulled"] * 6 and engine.built() == []
    assert requests == {}
    for s in plan.chain:
        pulled = next(i for i, c in enumerate(engine.calls) if c == ("pull", s.pull_ref))
        kinds = [c[0] for c in engine.calls[pulled : pulled + 3]]
        assert kinds == ["pull", "run", "tag"]  # smoke-checked before any tag moves
        assert engine.images[s.hash_tag] == engine.registry[s.pull_ref]
    assert engine.images["t/cpu:cpu"] == "sha256:validate-image"


def test_a_pulled_layer_that_fails_its_smoke_checks_moves_no_tag(ws, recipes):
    engine = RecordingEngine(registry=_cache_of(ws, recipes), fail_smoke={"torch-cpu"})
    with pytest.raises(LayerFailed, match="pulled but failed 3 smoke check"):
        run(ws, recipes, engine, cache_from="reg/ns")
    assert not any("torch-cpu" in ref for ref in engine.tags_moved())


def test_a_registry_that_does_not_answer_falls_back_to_building_and_says_so_once(ws, recipes):
    engine, notes = RecordingEngine(registry=None), []
    _, _, outcomes = run(ws, recipes, engine, notes, cache_from="reg/ns")
    assert [o.status for o in outcomes] == ["built"] * 6
    assert len(notes) == 1 and "did not answer" in notes[0] and "building instead" in notes[0]
    assert sum(c[0] == "lookup" for c in engine.calls) == 1  # not asked again for every layer


def test_require_cache_makes_an_unanswering_registry_an_error(ws, recipes):
    with pytest.raises(UserError, match="did not answer"):
        run(ws, recipes, RecordingEngine(registry=None), cache_from="reg/ns", require_cache=True)
