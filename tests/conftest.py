"""Shared fixtures: the repository root, disposable copies of it, and `invoke` as a user runs it.

No test writes into the checkout: `run_invoke` points attnforge's build and report folders at a
temporary directory, and a session guard fails the run if anything appeared in the checkout's
own output folders anyway.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def repo_files(*patterns: str) -> dict[str, str]:
    """The checkout's own files that match git pathspecs (``"*.py"``): tracked ones and untracked
    ones git does not ignore, relative path -> text (build outputs, venvs and caches are not
    among them)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return {
        rel: (REPO / rel).read_text(encoding="utf-8") for rel in listed if (REPO / rel).is_file()
    }


# Where `tools/setup.sh tritons` puts the Tritons the stacks ship besides the venv's (a folder each
# for PYTHONPATH) and every one's wheel (wheels/, which the rehearsals relabel).
TRITONS_DIR = Path(os.environ.get("ATTNFORGE_TRITONS_DIR", REPO / "build" / "tritons"))


def installed_triton(version: str) -> Path | None:
    """The folder that holds Triton ``version`` for PYTHONPATH, or None where it is the venv's
    own; where neither has it, a failure under CI or ATTNFORGE_REQUIRE_E2E=1, else a skip."""
    from importlib.metadata import version as venv_version

    folder = TRITONS_DIR / f"triton-{version}"
    if (folder / "triton" / "__init__.py").is_file():
        return folder
    if venv_version("triton") == version:
        return None
    why = f"triton {version} is not installed in {folder}; run tools/setup.sh tritons"
    if os.environ.get("ATTNFORGE_REQUIRE_E2E") == "1" or os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


# A tree copy keeps the checkout's bytecode (`make test` compiles it first; copytree keeps the
# sources' modification times, which the bytecode is checked against, and a test that edits a
# source makes Python compile that one again): on a machine with PYTHONDONTWRITEBYTECODE=1 every
# invoke in a copy would otherwise compile what it imports. attnforge's plan leaves __pycache__
# out of every layer's inputs and context.
COPY_IGNORE = shutil.ignore_patterns(".venv", ".git", "build", "reports", ".pytest_cache")
# The checkout's output folders (build/wheelhouse is set-up's input, not a test's output).
GUARDED = ("reports", "build/state", "build/logs", "build/staging")
_OUTPUTS: list[Path] = []  # the process's output folder, made when a test first asks for it


def _outputs() -> Path:
    """A temporary folder for the build and report folders of this process's tests, removed when
    the process exits. Made on first use, not at import: every process that imports this file
    (xdist's controller among them) would otherwise make one. The removal is the process's, not
    a session fixture's: pytest imports this file as `conftest` and the test modules import it
    again as `tests.conftest` (tests/ has no __init__.py), two modules with a list each."""
    if not _OUTPUTS:
        folder = Path(tempfile.mkdtemp(prefix="attnforge-test-outputs-"))
        atexit.register(shutil.rmtree, folder, True)
        _OUTPUTS.append(folder)
    return _OUTPUTS[0]


# The image namespaces that tests/e2e/conftest.py's `shared_cpu_stack` built this session, one a
# line, in the session's shared temporary folder; the session's end removes their images.
SHARED_NAMESPACES = "e2e-shared-namespaces.txt"


def _snapshot() -> set[str]:
    found = set()
    for rel in GUARDED:
        base = REPO / rel
        if base.exists():
            found |= {
                str(p.relative_to(REPO)) + f"@{p.stat().st_mtime_ns}" for p in base.rglob("*")
            }
    return found


@pytest.fixture(scope="session", autouse=True)
def checkout_is_not_written():
    before = _snapshot()
    yield
    changed = sorted(_snapshot() ^ before)
    assert not changed, f"tests wrote into the checkout: {changed[:10]}"


# How `make test` (`pytest -n N --dist loadfile`) hands out the test files. xdist's loadfile gives
# each worker whole files, the files with the most tests first; the engine's modules have few
# tests but take minutes each, so they came last and ended the run on one worker while the
# other idled. Here the engine's modules go first, the longest chains at the head, and the
# modules that share the session's validated cpu stack (tests/e2e/conftest.py) are one unit, run
# in order on one worker: the first validates, the rest reuse it, and no second worker waits on
# the validation's lock. Everything else follows, most tests first, as before.
E2E_CHAINS = {
    "tests/e2e (the validated cpu stack)": (
        "tests/e2e/test_cpu_stack_publish.py",
        "tests/e2e/test_export_venv.py",
        "tests/e2e/test_stress_in_image.py",
        "tests/e2e/test_validate_bench.py",
    ),
}
E2E_FIRST = ("tests/e2e (the validated cpu stack)", "tests/e2e/test_podman.py")
# After the engine's modules, the longest non-engine module (three `invoke validate --local
# --bench` runs, about two minutes), which otherwise came last and ended the run alone.
HEAVY_NEXT = ("tests/unit/test_baseline_gate.py",)


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    unit_of = {path: unit for unit, paths in E2E_CHAINS.items() for path in paths}
    first, after = len(E2E_FIRST), len(E2E_FIRST) + 1

    def priority(scope: str) -> int:
        """E2E_FIRST in order, the other engine modules, HEAVY_NEXT in order, then the rest."""
        if scope in E2E_FIRST:
            return E2E_FIRST.index(scope)
        if scope.startswith("tests/e2e/"):
            return first
        if scope in HEAVY_NEXT:
            return after + HEAVY_NEXT.index(scope)
        return after + len(HEAVY_NEXT)

    class EngineFirst(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return unit_of.get(path, path)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the queue is complete before the first unit goes out
                self.ordered = True
                # stable: within a priority, xdist's order (most tests first) stays
                units = sorted(self.workqueue.items(), key=lambda u: priority(u[0]))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return EngineFirst(config, log)


def pytest_sessionfinish(session):
    """Remove the shared end-to-end images, in the process that started the xdist workers (or the
    only one), after every worker is done with them."""
    if hasattr(session.config, "workerinput"):
        return
    listed = session.config._tmp_path_factory.getbasetemp() / SHARED_NAMESPACES
    for namespace in set(listed.read_text().split()) if listed.exists() else ():
        tags = subprocess.run(
            ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
            capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        mine = [t for t in tags if t.startswith(f"{namespace}/")]
        if mine:
            subprocess.run(["docker", "rmi", "-f", *mine], capture_output=True)


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A copy of the tree (recipes, Dockerfiles, packages) that a test may change freely."""
    dest = tmp_path / "tree"
    shutil.copytree(REPO, dest, ignore=COPY_IGNORE)
    return dest


def outputs_env(base: Path | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with attnforge's build and report folders under `base` (a temporary
    directory unless given), and TMPDIR in this process's temporary folder: `invoke verify-env
    --validate` keeps its report in a folder of its own under TMPDIR for the user to read, which a
    test run would otherwise leave in /tmp."""
    tmp = _outputs() / "tmp"
    tmp.mkdir(exist_ok=True)
    base = base or _outputs()
    return {
        **(env if env is not None else os.environ),
        "ATTNFORGE_BUILD_DIR": str(base / "build"),
        "ATTNFORGE_REPORTS_DIR": str(base / "reports"),
        "TMPDIR": str(tmp),
    }


def no_engine_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment with no reachable engine. A dry run then plans every layer as `build`, with
    its engine command, whatever this machine's engine holds: after `make demo` it holds the cpu
    stack's images, and a plan read through it would call those layers `cached`."""
    return {**(env if env is not None else os.environ), "DOCKER_HOST": "unix:///nonexistent.sock"}


def run_invoke(
    cwd: Path, *args: str, env=None, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m invoke ARGS` in cwd, as a user runs it: its own process, output captured. Unless
    `env` names them, the build and report folders are temporary."""
    env = dict(env if env is not None else os.environ)
    env.pop("TRITON_INTERPRET", None)  # the kernels tests set it for their own process only
    if "ATTNFORGE_BUILD_DIR" not in env or "ATTNFORGE_REPORTS_DIR" not in env:
        env = outputs_env(env=env)
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout,
    )  # fmt: skip


# --- Signing keys: the cosign key-based signature tests (tests/unit/test_signature.py and
# tests/e2e/test_verify_signature.py) sign with ECDSA P-256 keys that the host's openssl makes.
# One pair per name per session, in a temporary folder.


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory):
    """``signing_key(name) -> (private PEM, public PEM)`` paths, made by openssl on first use."""
    folder = tmp_path_factory.mktemp("signing-keys")
    made: dict[str, tuple[Path, Path]] = {}

    def pair(name: str) -> tuple[Path, Path]:
        if name not in made:
            private, public = folder / f"{name}.key", folder / f"{name}.pub"
            subprocess.run(["openssl", "ecparam", "-genkey", "-name", "prime256v1", "-noout",
                            "-out", str(private)], check=True, capture_output=True)  # fmt: skip
            subprocess.run(["openssl", "ec", "-in", str(private), "-pubout", "-out", str(public)],
                           check=True, capture_output=True)  # fmt: skip
            made[name] = (private, public)
        return made[name]

    return pair


def openssl_sign(private: Path, payload: bytes) -> str:
    """The base64 DER ECDSA signature of ``payload``'s SHA-256, as cosign stores it."""
    der = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(private)], input=payload,
                         check=True, capture_output=True).stdout  # fmt: skip
    return base64.b64encode(der).decode()
