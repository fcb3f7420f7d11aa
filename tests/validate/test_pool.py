"""The worker pool: checks share long-lived workers, and a crash, hang or device fault still
costs only the check it happened in (validate/pool.py, validate/_worker.py --serve)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
import time
import types

import pytest

from tests.validate.conftest import REPO, run_validate
from tests.validate.test_validate_run import _fake_tree
from validate import _worker, suite
from validate.pool import Pool
from validate.runner import triton_cache_dir

CHECKS = REPO / "tests" / "validate" / "pool_checks.py"
WARMED = "POOL_TEST_WARMED"


def _check(cid: str, func: str, key: str = "k", **kw) -> dict:
    return {
        "id": cid,
        "group": "pool",
        "title": cid,
        "target": f"file:{CHECKS}:{func}",
        "params": kw.pop("params", {}),
        "required": True,
        "worker": key,
        **kw,
    }


# One sequence through one pool; the tests below read its records. Every check shares the
# worker key "k", so only a crash, a timeout, a device fault or isolation separates them.
SEQUENCE = [
    _check("a1", "observe_state"),
    _check("a.change", "change_state"),
    _check("a.observe", "observe_state"),
    _check("a.noisy", "noisy_fail", params={"tag": "first"}),
    _check("a.segfault", "segfault"),
    _check("b1", "pid"),
    _check("b.hang", "hang", timeout=2),
    _check("c1", "pid"),
    _check("c.gpu_fault", "gpu_fault_text"),
    _check("d1", "pid"),
    _check("iso", "pid", isolate=True),
    _check("d2", "pid"),
    _check("d.cache", "triton_cache"),
    _check("d.noisy", "noisy_fail", params={"tag": "second"}),
]


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    cache = tmp_path_factory.mktemp("triton-cache")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update({"TRITON_CACHE_DIR": str(cache), "POOL_TEST_PRESET": "kept"})
    env.pop("VALIDATE_PRELUDE", None)
    lines: list[str] = []
    with Pool(workers=1, env=env) as pool:
        records = suite.execute(
            SEQUENCE, 60, runner=pool.run, on_record=lambda r: lines.append(r["id"])
        )
        started = pool.started
    by_id = {r["id"]: r for r in records}
    return by_id, started, str(cache), lines


def _pid(rec: dict) -> int:
    assert rec["status"] == "pass", rec
    return rec["details"]["pid"]


@pytest.mark.slow
def test_checks_with_one_key_share_a_worker(pooled):
    by_id = pooled[0]
    assert _pid(by_id["a1"]) == _pid(by_id["a.change"]) == _pid(by_id["a.observe"])
    assert by_id["a1"]["returncode"] == 0 and by_id["a1"]["signal"] is None


@pytest.mark.slow
def test_state_a_check_changes_does_not_reach_the_next_check(pooled):
    before, after = pooled[0]["a1"]["details"], pooled[0]["a.observe"]["details"]
    assert after == before  # the random state too: each check starts from the worker's seed
    assert after["flag"] is None and after["preset"] == "kept"
    assert after["cwd"] == str(REPO)
    assert after["warnings_error"] is False
    assert after["flash"] is True and after["math"] is True
    assert after["dtype"] == "torch.float32" and after["grad"] is True
    assert after["sdpa"].startswith("torch")  # not the lambda change_state put there


@pytest.mark.slow
def test_a_crash_in_the_middle_keeps_the_results_before_and_reruns_after_in_a_fresh_worker(
    pooled,
):
    by_id = pooled[0]
    seg = by_id["a.segfault"]
    assert seg["status"] == "crash" and seg["signal"] == "SIGSEGV" and seg["returncode"] == -11
    assert seg["message"].startswith("killed by SIGSEGV during dereferencing NULL")
    assert seg["progress"] == ["dereferencing NULL"]
    assert by_id["a.noisy"]["status"] == "fail"  # the check before it kept its result
    assert _pid(by_id["b1"]) != _pid(by_id["a1"])


@pytest.mark.slow
def test_a_hang_is_that_checks_timeout_and_the_next_check_gets_a_fresh_worker(pooled):
    by_id = pooled[0]
    hang = by_id["b.hang"]
    assert hang["status"] == "timeout" and hang["returncode"] is None
    assert 1.5 < hang["duration_s"] < 20  # its own 2 s, not the run's 60 s
    assert "sleeping forever" in hang["message"]
    assert _pid(by_id["c1"]) != _pid(by_id["b1"])


@pytest.mark.slow
def test_a_device_fault_retires_its_worker(pooled):
    by_id = pooled[0]
    fault = by_id["c.gpu_fault"]
    assert fault["status"] == "crash" and fault["message"].startswith("GPU fault: RuntimeError")
    assert _pid(by_id["d1"]) != _pid(by_id["c1"])


@pytest.mark.slow
def test_an_isolated_check_runs_alone_and_the_shared_worker_waits_for_it(pooled):
    by_id = pooled[0]
    assert _pid(by_id["iso"]) not in {_pid(by_id["d1"]), _pid(by_id["d2"])}
    assert _pid(by_id["d1"]) == _pid(by_id["d2"])


@pytest.mark.slow
def test_each_failure_records_its_own_stderr(pooled):
    by_id = pooled[0]
    first, second = by_id["a.noisy"]["stderr_tail"], by_id["d.noisy"]["stderr_tail"]
    assert "noise from first" in first and "noise from second" not in " ".join(first)
    assert "noise from second" in second and "noise from first" not in " ".join(second)


@pytest.mark.slow
def test_workers_started_and_order_of_records(pooled):
    by_id, started, _, lines = pooled
    assert lines == [c["id"] for c in SEQUENCE]
    # a, b (after the segfault), c (after the hang), d (after the fault), iso, plus one spare
    # started ahead each time one was taken.
    assert 5 <= started <= 6


@pytest.mark.slow
def test_a_users_triton_cache_is_the_one_every_worker_uses(pooled):
    by_id, _, cache, _ = pooled
    assert by_id["d.cache"]["details"]["TRITON_CACHE_DIR"] == cache


@pytest.mark.slow
def test_a_worker_that_dies_while_starting_fails_only_the_checks_it_gets(tmp_path):
    prelude = tmp_path / "die.py"
    prelude.write_text("import os\nos._exit(5)\n")
    env = dict(os.environ, VALIDATE_PRELUDE=str(prelude))
    with Pool(env=env, spare=False) as pool:
        rec = pool.run(_check("x", "pid"), timeout=30)
    assert rec["status"] == "crash"
    assert rec["message"].startswith("exited with status 5 without a result during worker start")


@pytest.mark.slow
def test_kernel_cases_share_a_worker_and_a_segfault_mid_batch_costs_one_case(tmp_path):
    src = (
        "import os\n\n"
        "def list_cases(quick):\n"
        "    return ['a', 'b', 'segv', 'c', 'd']\n\n"
        "def run_case(name):\n"
        "    if name == 'segv':\n"
        "        import ctypes\n"
        "        ctypes.string_at(0)\n"
        "    return {'status': 'pass', 'message': name, 'metrics': {'pid': os.getpid()}}\n"
    )
    root = _fake_tree(tmp_path, REPO, check_src=src)
    proc = run_validate("kernels", "--json", "r.json", cwd=root)
    report = json.loads((root / "r.json").read_text())
    by_id = {c["id"].removeprefix("kernels.case."): c for c in report["checks"]}
    pid = {n: by_id[n]["metrics"].get("pid") for n in "abcd"}
    assert [by_id[n]["status"] for n in ("a", "b", "segv", "c", "d")] == [
        "pass",
        "pass",
        "crash",
        "pass",
        "pass",
    ]
    assert by_id["segv"]["signal"] == "SIGSEGV"
    assert pid["a"] == pid["b"] and pid["c"] == pid["d"] and pid["a"] != pid["c"]
    assert "1 check worker" in proc.stdout and proc.returncode == 1


@pytest.mark.slow
def test_isolate_runs_every_check_in_its_own_process(tmp_path):
    src = (
        "import os\n\n"
        "def list_cases(quick):\n"
        "    return ['a', 'b']\n\n"
        "def run_case(name):\n"
        "    return {'status': 'pass', 'message': name, 'metrics': {'pid': os.getpid()}}\n"
    )
    root = _fake_tree(tmp_path, REPO, check_src=src)
    proc = run_validate("kernels", "--isolate", "--json", "r.json", cwd=root)
    report = json.loads((root / "r.json").read_text())
    pids = [c["metrics"]["pid"] for c in report["checks"] if c["id"].startswith("kernels.case.")]
    assert len(pids) == 2 and pids[0] != pids[1]
    assert "one subprocess per check (--isolate)" in proc.stdout and proc.returncode == 0


def test_workers_must_be_a_positive_number():
    proc = run_validate("env", "--workers", "0")
    assert proc.returncode == 2 and "at least 1 worker" in proc.stderr


# --- pure parts -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "writable", "want"),
    [
        ({"TRITON_CACHE_DIR": "/mine", "HOME": "/h"}, set(), "/mine"),  # the user's, untouched
        ({"HOME": "/h"}, {"/h/.triton/cache"}, "/h/.triton/cache"),  # Triton's own default
        ({"TRITON_HOME": "/t", "HOME": "/h"}, {"/t/.triton/cache"}, "/t/.triton/cache"),
        ({"HOME": "/ro"}, {"TMP"}, "TMP"),  # a home it cannot write: the per-user temp folder
        ({"HOME": "/ro"}, set(), None),
    ],
)
def test_triton_cache_dir(environ, writable, want):
    import tempfile

    tmp = os.path.join(tempfile.gettempdir(), f"attnforge-triton-cache-{os.getuid()}")
    writable = {tmp if w == "TMP" else w for w in writable}
    got = triton_cache_dir(environ, writable=lambda p: p in writable)
    assert got == (tmp if want == "TMP" else want)


def test_kernel_cases_that_compile_one_kernel_share_a_batch():
    a = suite.kernel_batch("attn-bf16-b1-sq129-sk129-h2x2-d128-full-bshd")
    b = suite.kernel_batch("attn-bf16-b2-sq17-sk4096-h8x1-d128-full-bshd")
    c = suite.kernel_batch("attn-bf16-b1-sq129-sk129-h2x2-d64-full-bshd")
    assert a == b == "attn-bf16-d128-full-bshd" and c != a


def test_on_rocm_each_sdpa_case_gets_a_worker_of_its_own():
    plan = {s["id"]: s for s in suite.plan("backends", quick=True)}
    case = plan["sdpa.case.fp16-d64-s512"]
    assert case["worker"] == plan["sdpa.config"]["worker"] != plan["env"]["worker"]
    assert plan["sdpa.rocm"]["isolate"] is True and case["isolate"] is False
    assert suite.placement(case, {"torch.hip": True})["isolate"] is True
    assert suite.placement(case, {"torch.hip": False})["isolate"] is False
    assert suite.placement(plan["env"], {"torch.hip": True})["isolate"] is False


@pytest.mark.slow
def test_a_worker_started_early_warms_up_and_serves_its_keys_checks(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", WARMED)}
    env.pop("VALIDATE_PRELUDE", None)
    step = {"target": f"file:{CHECKS}:warm"}
    with Pool(workers=1, env=env, spare=False) as pool:
        pool.start_early("late", [{"target": f"file:{CHECKS}:warm_fails"}, step])
        first = pool.run(_check("first", "warmed", key="k"), timeout=60)
        late = [pool.run(_check(f"late{i}", "warmed", key="late"), timeout=60) for i in (1, 2)]
        started = pool.started
    assert first["status"] == "pass" and first["details"]["warmed"] is None
    # The early worker ran its steps (the failing one did not stop the next) and both checks
    # of its key ran there, the warm-up's state kept as the worker's own.
    assert [r["status"] for r in late] == ["pass", "pass"]
    assert late[0]["details"]["pid"] == late[1]["details"]["pid"] != first["details"]["pid"]
    assert late[0]["details"]["warmed"] == late[1]["details"]["warmed"] == str(_pid(late[0]))
    assert started == 2


def test_early_starts_are_the_later_keys_with_warm_up_steps():
    plan = suite.plan("all", quick=True)
    early = dict(suite.early_starts(plan))
    fa = ["flash_attn"] if importlib.util.find_spec("flash_attn") is not None else []
    assert list(early) == [suite.SDPA, *fa, "kernels", "apps"]
    assert early["apps"] == [
        {"target": "validate.checks.apps:warm_up", "params": {"models": [m]}}
        for m in suite.APP_MODELS_QUICK
    ]
    assert suite.early_starts(suite.plan("env", quick=True)) == []
    # The first check's worker starts anyway; isolated checks get no early worker.
    apps_only = [c for c in plan if c["id"].startswith("apps.")]
    assert suite.early_starts(apps_only) == []
    iso = [plan[0], {**plan[1], "isolate": True}]
    assert suite.early_starts(iso) == []


@pytest.mark.parametrize("installed", [True, False])
def test_flash_attn_info_starts_no_process_only_to_find_flash_attn_missing(monkeypatch, installed):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *a: (real("json") if installed else None) if name == "flash_attn" else real(name, *a),
    )  # fmt: skip
    plan = {c["id"]: c for c in suite.plan("all", quick=True)}
    info = plan["flash_attn.info"]
    # Installed: its own worker (flash_attn reads its environment variables as it loads),
    # started early; missing: the warm SDPA worker answers the ModuleNotFoundError.
    assert info["worker"] == ("flash_attn" if installed else suite.SDPA)
    assert bool(info["warm_up"]) is installed
    assert ("flash_attn" in dict(suite.early_starts(list(plan.values())))) is installed
    kernels_warm_up = plan["kernels.list"]["warm_up"]
    assert kernels_warm_up == [
        {"target": "validate.checks.kernels:warm_up", "params": {"quick": True}}
    ]


def test_several_workers_run_at_once_and_report_in_plan_order():
    lock = threading.Lock()
    now, most, ran = [0], [0], []

    def runner(spec, timeout):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
            ran.append(spec["id"])
        time.sleep(0.05 if spec["id"] != "env" else 0.2)
        with lock:
            now[0] -= 1
        details = {"cases": ["k1", "k2", "k3"]} if spec["id"] == "kernels.list" else {}
        status = "fail" if spec["id"] == "flash_attn.info" else "pass"
        return {"id": spec["id"], "status": status, "message": "m", "details": details}

    shown: list[str] = []
    checks = suite.plan("all", quick=True)
    records = suite.execute(
        checks, 5, runner=runner, workers=3, on_record=lambda r: shown.append(r["id"])
    )
    ids = [r["id"] for r in records]
    planned = [c["id"] for c in checks]
    at = planned.index("kernels.list") + 1
    want = planned[:at] + ["kernels.case.k1", "kernels.case.k2", "kernels.case.k3"] + planned[at:]
    assert ids == shown == want
    assert most[0] == 3
    assert ran.index("env") == 0 and ran[1] != "env"  # others started while env ran
    assert "flash_attn.run" not in ran  # info failed: a skip without running
    assert records[ids.index("flash_attn.run")]["status"] == "skip"


def test_one_worker_runs_checks_one_after_another_in_plan_order():
    ran: list[str] = []

    def runner(spec, timeout):
        assert threading.current_thread() is threading.main_thread()
        ran.append(spec["id"])
        details = {"cases": ["k1"]} if spec["id"] == "kernels.list" else {}
        return {"id": spec["id"], "status": "pass", "message": "m", "details": details}

    checks = suite.plan("all", quick=True)
    records = suite.execute(checks, 5, runner=runner)
    in_parent = {c["id"] for c in checks if c.get("parent")}  # the gate comparison: no worker
    assert in_parent and ran == [r["id"] for r in records if r["id"] not in in_parent]


# --- the worker's end-of-check device synchronize (a stand-in torch: no GPU here) ------------


def _fake_torch(sync_error: str | None, initialized: bool = True) -> types.ModuleType:
    torch = types.ModuleType("torch")

    def synchronize():
        if sync_error:
            raise RuntimeError(sync_error)

    class _One:
        def add_(self, n):
            return self

        def item(self):
            return 2.0

    torch.cuda = types.SimpleNamespace(is_initialized=lambda: initialized, synchronize=synchronize)
    torch.ones = lambda *a, **k: _One()
    return torch


@pytest.mark.parametrize(
    ("sync_error", "initialized", "status"),
    [
        (None, True, "pass"),
        ("CUDA error: an illegal memory access was encountered", True, "crash"),
        ("CUDA error: invalid argument", True, "crash"),  # any error there is the device's
        ("CUDA error: an illegal memory access was encountered", False, "pass"),  # no context
    ],
)
def test_a_fault_found_after_the_check_is_charged_to_it(
    monkeypatch, sync_error, initialized, status
):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(sync_error, initialized))
    result = _worker.settle({"status": "pass", "message": "fine", "details": {"x": 1}})
    assert result["status"] == status
    if status == "crash":
        assert result["message"].startswith("GPU fault after the check returned")
        assert sync_error in result["message"]
        assert result["details"]["result_before_device_check"]["status"] == "pass"
        assert _worker.poisoned(result)


def test_a_result_that_names_a_device_fault_poisons_the_worker():
    assert _worker.poisoned({"status": "fail", "message": "HIP error: hipErrorIllegalAddress"})
    assert not _worker.poisoned({"status": "fail", "message": "wrong output"})
