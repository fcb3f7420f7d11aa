"""The kernels on every Triton a stack ships (recipes/tritons.yaml; docs/kernels.md, "On every
Triton a stack ships").

Each Triton besides the venv's own is installed by `tools/setup.sh tritons` under
build/tritons/triton-<version> and goes first on PYTHONPATH over the venv's torch. On each, the
AOT check compiles every kernel at its default config for one RDNA and one CDNA arch (and the
Hopper Gluon kernels), and the CPU interpreter runs the kernels' correctness cases. The venv's
Triton gets the full sweep (test_aot.py) and the whole kernels suite instead.

The AOT results go to the compile cache the kernels tests keep across runs (conftest.py; keyed
by Triton version among the rest), so an unchanged kernel compiles once per machine and Triton
line; two kernels on one arch are compiled cold on each line every run (COLD).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.recipes import load_recipes
from attnforge.tritons import load_table, stack_tritons, versions_to_check
from attnforge_kernels.device import configs
from tests.conftest import installed_triton
from tests.kernels.strict_triton import module_args

REPO = Path(__file__).resolve().parents[2]
# One RDNA and one CDNA arch: Strix Halo (RDNA3.5, wave32 WMMA) and MI300X (CDNA3, wave64 MFMA).
SUBSET = ("gfx1151", "gfx942")


def _versions() -> list[str]:
    table = load_table(REPO)
    return versions_to_check(stack_tritons(load_recipes(REPO), table), table.newest)


def _venv_triton() -> str:
    from importlib.metadata import version

    return version("triton")


OTHERS = [v for v in _versions() if v != _venv_triton()]


def _run(version: str, args: list[str], interpret: bool, tmp: Path) -> subprocess.CompletedProcess:
    """``python ARGS`` on Triton ``version``; ARGS from strict_triton.module_args, so Triton's
    deprecation warnings fail the run."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join(str(f) for f in (installed_triton(version), REPO) if f)
    env["TRITON_CACHE_DIR"] = str(tmp / "triton-cache")
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run(
        [sys.executable, *args], cwd=tmp, env=env, capture_output=True, text=True, timeout=900
    )


# Compiled cold on every line every run (no compile cache, an empty Triton cache): a Triton that
# no longer compiles the kernels fails even when the other results come from the cache.
COLD = ["--arch", "gfx1151", "--head-dims", "64", "--kernel", "fwd", "--kernel", "kv_decode"]


@pytest.fixture(scope="module", params=OTHERS)
def aot_subset(request, tmp_path_factory, aot_cache):
    """(triton version, reports, cold reports) of the AOT check on SUBSET plus the Gluon kernels
    on one Triton (through the kept compile cache), and of COLD compiled without it."""
    version = request.param
    tmp = tmp_path_factory.mktemp(f"triton-{version}")
    cache = ["--cache-dir", str(aot_cache), "--json"]
    arches = [a for arch in SUBSET for a in ("--arch", arch)]
    cold = _run(
        version, module_args("attnforge_kernels.aot", *COLD, "--no-cache", "--json"), False, tmp
    )
    runs = [
        _run(version, module_args("attnforge_kernels.aot", *arches, *cache), False, tmp),
        _run(version, module_args("attnforge_kernels.aot", "--arch", "sm90", "--head-dims", "64,128",
                                  "--kernel", "fwd_gluon", "--kernel", "bwd_dkdv_gluon", *cache),
             False, tmp),
    ]  # fmt: skip
    reports = []
    for proc in [cold, *runs]:
        assert proc.stdout.startswith("["), proc.stderr[-3000:]
    for proc in runs:
        reports += json.loads(proc.stdout)
    assert "2 kernel(s), 0 from the cache" in cold.stderr, cold.stderr[-3000:]
    return version, reports, json.loads(cold.stdout)


def test_the_venv_triton_is_one_a_stack_ships():
    """The dev extra's Triton is the cpu stack's, so test_aot.py's full sweep covers one of them."""
    assert _venv_triton() in _versions()


@pytest.mark.slow
def test_every_kernel_compiles_on_the_arches(aot_subset):
    version, reports, _ = aot_subset
    failed = [(r["arch"], r["head_dim"], r["kernel"], r["problems"]) for r in reports
              if any("compile failed" in p for p in r["problems"])]  # fmt: skip
    assert not failed, f"triton {version}: {failed}"
    seen = {(r["arch"], r["kernel"]) for r in reports}
    for arch in SUBSET:
        assert {(arch, "fwd"), (arch, "bwd_dkdv"), (arch, "kv_decode")} <= seen
    assert {("sm90", "fwd_gluon"), ("sm90", "bwd_dkdv_gluon")} <= seen


@pytest.mark.slow
def test_the_only_problems_are_the_known_ones_and_the_matrix_unit_is_used(aot_subset):
    """Spills beyond ACCEPTED_SPILLS (or LDS overflows) are exactly recipes/tritons.yaml's
    ``known:`` rows for that Triton line on these arches: a fix must remove its row."""
    version, reports, _ = aot_subset
    compiled = {(r["arch"], r["kernel"]) for r in reports}
    known = {(k.arch, k.head_dim, k.kernel) for k in load_table(REPO).known_on(version)
             if (k.arch, k.kernel) in compiled}  # fmt: skip
    problems = {(r["arch"], r["head_dim"], r["kernel"]) for r in reports if r["problems"]}
    assert problems == known, f"triton {version}: {[r for r in reports if r['problems']]}"
    for r in reports:
        if r["kernel"] == "kv_append":  # the cache update copies and rotates rows
            assert not r["matrix_instrs"], (version, r)
            continue
        assert any(k.startswith(("v_wmma_", "v_mfma_", "wgmma", "mma.sync"))
                   for k in r["matrix_instrs"]), (version, r["arch"], r["kernel"])  # fmt: skip


@pytest.mark.slow
def test_a_cold_compile_gives_the_reports_the_cache_holds(aot_subset):
    """What the cached run judged is what this Triton compiles from these sources now."""
    version, reports, cold = aot_subset
    assert len(cold) == 2, (version, cold)
    by = {(r["arch"], r["head_dim"], r["kernel"]): r for r in reports}
    for r in cold:
        assert by[r["arch"], r["head_dim"], r["kernel"]] == r, version


@pytest.mark.slow
@pytest.mark.parametrize("version", OTHERS)
def test_the_interpreter_cases_pass(version, tmp_path):
    """`python -m attnforge_kernels.check`: the correctness cases (fwd+bwd against the fp32
    reference, with varlen, a window, ALiBi, softcap, GQA) and the SDPA shim's routing, in Triton's
    interpreter."""
    # The module run as `python -m attnforge_kernels.check` would, after printing the Triton it
    # imported: one process (one torch and Triton import) instead of a second one to ask for the
    # version.
    first = "import triton; print('triton', triton.__version__, flush=True)"
    proc = _run(version, module_args("attnforge_kernels.check", "--json", "cases.json", first=first), True,
                tmp_path)  # fmt: skip
    results = json.loads((tmp_path / "cases.json").read_text())
    assert proc.returncode == 0 and results, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {r["status"] for r in results.values()} == {"pass"}, (version, results)
    # the cases ran on that Triton, not the venv's
    assert proc.stdout.splitlines()[0] == f"triton {version}", proc.stdout[:300]


@pytest.mark.parametrize(
    "version, release",
    [("3.6.0", (3, 6)), ("3.8.0+rocm10.1.0", (3, 8)), ("3.10.0+git12345678", (3, 10))],
)
def test_triton_release(version, release):
    assert configs.triton_release(version) == release


def test_the_dev_triton_keeps_the_tiles_docs_kernels_md_measured():
    for family in configs.FAMILIES:
        for d in (16, 32, 64, 128, 256):
            assert configs.newer_triton_tiles(family, d, (3, 6)) == {}


@pytest.fixture
def on_triton(monkeypatch):
    """config_for/kv_config as on another Triton release."""

    def use(release):
        from attnforge_kernels.api.kvcache import kv_config

        monkeypatch.setattr(configs, "triton_release", lambda version=None: release)
        configs._config_for.cache_clear()
        configs.gluon_bwd_loader_regs.cache_clear()
        kv_config.cache_clear()  # cached per process, where the Triton release cannot change

    yield use
    configs._config_for.cache_clear()
    configs.gluon_bwd_loader_regs.cache_clear()


def test_each_triton_line_gets_its_own_rows(on_triton):
    from attnforge_kernels.api.kvcache import kv_config

    on_triton((3, 6))
    old = {(f, d): configs.config_for(f, d) for f in ("rdna3.5", "cdna3") for d in (64, 128)}
    old_prefill = kv_config("rdna3", 128).prefill
    on_triton((3, 8))
    assert configs.config_for("rdna3.5", 64).bwd_q == configs.Tile(32, 16, 4, 1, 1)
    # the dropout dK/dV tile alone where 3.8 spilled it (gfx1150 d=64, gfx90a d=128)
    assert configs.config_for("rdna3.5", 64, dropout=True).bwd_kv == configs.Tile(16, 16, 8, 1, 1)
    assert configs.config_for("rdna3.5", 64).bwd_kv == old["rdna3.5", 64].bwd_kv
    assert configs.config_for("cdna2", 128, dropout=True).bwd_kv == configs.Tile(16, 64, 4, 1, 1)
    assert configs.config_for("rdna3", 64, dropout=True).bwd_kv == old["rdna3.5", 64].bwd_kv
    assert configs.config_for("rdna3.5", 128).fwd == configs.Tile(32, 16, 4, 1, 2)
    assert kv_config("rdna3", 128).prefill == configs.Tile(32, 32, 4, 1, 2) != old_prefill
    on_triton((3, 9))
    assert configs.config_for("rdna3.5", 64, dropout=True).bwd_q == configs.Tile(32, 16, 8, 1, 1)
    assert configs.config_for("rdna3.5", 128).fwd == configs.Tile(32, 16, 4, 1, 2)
    assert configs.config_for("rdna3.5", 128).bwd_kv == old["rdna3.5", 128].bwd_kv
    assert {d: configs.config_for("cdna3", d) for d in (64, 128)} == {
        d: old["cdna3", d] for d in (64, 128)
    }
    # the d=128 dropout forward alone gets its own tile on CDNA3/4 (3.9 spilled there)
    assert configs.config_for("cdna3", 128, dropout=True).fwd == configs.Tile(128, 32, 8, 1, 2)
    assert configs.config_for("cdna4", 128, dropout=True).fwd == configs.Tile(128, 32, 8, 1, 2)
    assert configs.config_for("cdna3", 64, dropout=True).fwd == old["cdna3", 64].fwd
    assert (
        configs.gluon_bwd_loader_regs(64, False) == 32
        and configs.gluon_bwd_loader_regs(64, True) == 24
    )
    on_triton((3, 7))  # a row for one line only: 3.7's dK/dV tile is not 3.8's or 3.9's
    assert configs.config_for("cdna3", 128).bwd_kv == configs.Tile(16, 64, 4, 1, 1)
    assert configs.config_for("rdna3.5", 64) == old["rdna3.5", 64]
    on_triton((3, 10))  # a line without rows keeps the tiles 3.6 measured
    assert configs.config_for("rdna3.5", 128) == old["rdna3.5", 128]
    assert configs.config_for("cdna3", 128, dropout=True).fwd == old["cdna3", 128].fwd
    assert configs.gluon_bwd_loader_regs(64, False) == 24


def test_a_newer_line_can_merge_fewer_columns_a_load(on_triton):
    """DECODE_ON_NEWER_TRITON's merge_d: fewer columns a merge load where a line lost a wave."""
    from attnforge_kernels.api.kvcache import kv_config

    on_triton((3, 6))
    measured = {(f, d): kv_config(f, d) for f in ("hopper", "cdna4") for d in (64, 128)}
    assert measured["hopper", 128].merge(128) == dict(MERGE_M=4, MERGE_S=8, MERGE_D=128)
    on_triton((3, 8))
    assert kv_config("hopper", 128).merge(128)["MERGE_D"] == 64
    assert kv_config("cdna4", 64).merge(64)["MERGE_D"] == 32
    assert kv_config("hopper", 64) == measured["hopper", 64]
    on_triton((3, 9))
    assert kv_config("hopper", 64).merge(64)["MERGE_D"] == 16
    assert kv_config("cdna4", 64) == measured["cdna4", 64]  # no 3.9 row for it
    on_triton((3, 10))
    assert {(f, d): kv_config(f, d) for f in ("hopper", "cdna4") for d in (64, 128)} == measured
