"""Opt-in autotuning: off by default, picks among candidates, caches the choice on disk."""

import json

import pytest
import torch

from attnforge_kernels import flash_attn_func
from attnforge_kernels.checks.reference import attention_ref
from attnforge_kernels.device.configs import config_for
from attnforge_kernels.launch import autotune


@pytest.fixture
def tuning(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNFORGE_KERNELS_CACHE", str(tmp_path / "cache.json"))
    autotune._memory.clear()
    autotune.enable()
    yield tmp_path / "cache.json"
    autotune.disable()
    autotune._forced = None
    autotune._memory.clear()


def test_autotuning_is_off_by_default(monkeypatch):
    monkeypatch.delenv("ATTNFORGE_KERNELS_AUTOTUNE", raising=False)
    assert not autotune.enabled()
    assert autotune.choose("", "default-config", lambda c: None) == "default-config"


@pytest.mark.slow
def test_tuned_call_is_correct_and_its_choice_is_cached(tuning):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 20, 2, 32, generator=g).half().requires_grad_() for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True)
    out.sum().backward()
    ref, _ = attention_ref(q.detach(), k.detach(), v.detach(), right=0)
    assert (out.float() - ref.float()).abs().max() < 3e-3
    cached = json.loads(tuning.read_text())
    kinds = sorted(key.split("|")[2] for key in cached)
    assert kinds == ["bwd", "fwd"]
    assert all(key.startswith("cpu|interpreter|") for key in cached)


def test_a_cached_choice_is_reused_without_timing(tuning):
    k = "cpu|interpreter|fwd|d32|float16|R"
    chosen = autotune.candidates(config_for("hopper", 32), "hopper", "fwd")[1]
    autotune._store(k, chosen)
    assert autotune.choose(k, config_for("interpreter", 32), lambda c: 1 / 0) == chosen


def test_candidates_start_with_the_default_and_have_no_duplicates():
    default = config_for("hopper", 128)
    cands = autotune.candidates(default, "hopper", "bwd")
    assert cands[0] == default and len(cands) == len(set(cands))
    # Only the shape is searched: a forward candidate keeps the default's TMA and its stand-in
    # for calls TMA cannot address.
    for c in autotune.candidates(default, "hopper", "fwd")[1:]:
        assert c.fwd.tma and c.fwd.no_tma == default.fwd.no_tma is not None


def test_the_cache_keeps_every_field_of_a_config():
    # The Gluon switches among them: a cached choice that dropped them would silently move
    # Hopper calls off the Gluon kernels.
    for family, d in (("hopper", 64), ("hopper", 128), ("rdna3.5", 128), ("cdna3", 64)):
        cfg = config_for(family, d)
        back = autotune._from_dict(json.loads(json.dumps(autotune.asdict(cfg))))
        assert back == cfg and hash(back) == hash(cfg)  # tuple fields come back as tuples
    old = autotune.asdict(config_for("hopper", 128))
    del old["gluon_fwd"], old["gluon_bwd"]
    old["from_a_newer_version"] = 1
    assert not autotune._from_dict(old).gluon_fwd  # defaults for what an older cache lacks
