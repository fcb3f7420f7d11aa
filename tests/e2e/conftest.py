"""What the end-to-end modules that build and validate the cpu stack share.

The cpu stack is built once per test session, in one shared image namespace named after the
tree's content (`attnforge-e2e-shared-<key>`), by whichever xdist worker asks first: the build
runs under a file lock in the session's shared temporary folder, and the other workers wait for
it and then find it done. No test tags, removes or publishes anything in that namespace.

`shared_cpu_stack_build` is what that build printed: test_cpu_stack checks the build of every
layer there instead of building the stack a second time.

`cpu_stack_tree(label, namespace)` makes a module's `tree` fixture: a copy of the checkout (the
module's tests may edit it and write their build and report folders in it) with the shared stack
copied into the module's own namespace by `docker tag` (the same image ids, no build), so a module
that retags, removes or publishes its images cannot disturb another module or the shared one.
The module's images are removed after the module; the shared namespace is removed when the
session ends (tests/conftest.py's `pytest_sessionfinish`, in the process that started the
workers).

`validated_cpu_stack` validates that build once per session, in the shared tree, as a user
would (`invoke validate --quick --bench --stress llm --stress-iters 2`: the report, the stamp,
bench.json, bench_train.json, stress-llm.json and the kept baseline), under a lock of its own.
`cpu_stack_tree(..., validated=True)` (or `copy_validated`) copies those reports into a module's
tree: the stamp names the shared tag, and `invoke publish`/`invoke export` accept the module's
tag because they check the stamp's image id, which `docker tag` kept. A module that validates
again (a broken image, `--baseline`) writes over its own copy only.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import COPY_IGNORE, REPO, SHARED_NAMESPACES
from tests.e2e.test_cpu_stack import (
    BASE,
    CA_CERT,
    WHEELHOUSE,
    _need_registry,
    build_args,
    copy_tree,
    copy_tree_to,
    invoke,
    remove_images,
    require_engine,
)

SHARED_PREFIX = "attnforge-e2e-shared"


def content_key() -> str:
    """The sha256 of what a build reads: every file `copy_tree` copies (path and bytes) and the
    build's inputs from the environment."""
    digest = hashlib.sha256(f"{BASE}\0{WHEELHOUSE}\0{CA_CERT}\0".encode())
    for top, dirs, files in os.walk(REPO):
        ignored = COPY_IGNORE(top, dirs + files)
        dirs[:] = sorted(d for d in dirs if d not in ignored)
        for name in sorted(f for f in files if f not in ignored):
            path = Path(top) / name
            digest.update(str(path.relative_to(REPO)).encode() + b"\0")
            if path.is_file():
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def shared_folder(tmp_path_factory) -> Path:
    """The session's temporary folder that every xdist worker sees (a worker's own folder is
    inside it), or this process's own without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def locked(path: Path):
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def tags_in(namespace: str) -> list[str]:
    """Every `repository:tag` the engine holds under ``namespace/``."""
    listed = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return sorted(t for t in listed if t.startswith(f"{namespace}/"))


@pytest.fixture(scope="session")
def shared_cpu_stack(tmp_path_factory) -> tuple[str, Path]:
    """The namespace that holds this session's one build of the cpu stack (built here unless
    another worker already built it), and the tree it was built in."""
    require_engine()
    namespace = f"{SHARED_PREFIX}-{content_key()[:12]}"
    folder = shared_folder(tmp_path_factory)
    done = folder / f"{namespace}.tags"
    dest = folder / namespace / "tree"
    with locked(folder / f"{namespace}.lock"):
        if done.exists() and tags_in(namespace) == done.read_text().split():
            return namespace, dest
        shutil.rmtree(folder / namespace, ignore_errors=True)
        copy_tree_to(dest)
        with (folder / SHARED_NAMESPACES).open("a") as listed:
            listed.write(namespace + "\n")  # removed at the session's end even if the build fails
        built = invoke(dest, *build_args(namespace=namespace))
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        tags = tags_in(namespace)
        assert any(t.endswith("/validate:cpu") for t in tags), tags
        (folder / f"{namespace}.build.out").write_text(built.stdout)  # for test_cpu_stack
        done.write_text("\n".join(tags) + "\n")
    return namespace, dest


@pytest.fixture(scope="session")
def shared_cpu_stack_build(tmp_path_factory, shared_cpu_stack) -> str:
    """What the session's one build of the cpu stack printed (`invoke build`'s stdout)."""
    namespace, _ = shared_cpu_stack
    return (shared_folder(tmp_path_factory) / f"{namespace}.build.out").read_text()


VALIDATE = ["--quick", "--bench", "--stress", "llm", "--stress-iters", "2"]


@dataclass(frozen=True)
class Validated:
    """The session's one validation of the shared cpu stack: its namespace and its reports
    folder (reports/cpu/cpu of the shared tree)."""

    namespace: str
    reports: Path


@pytest.fixture(scope="session")
def validated_cpu_stack(tmp_path_factory, shared_cpu_stack) -> Validated:
    """The shared cpu stack after one passing `invoke validate --arch cpu` with `VALIDATE` (run
    here unless another worker already ran it)."""
    namespace, built_in = shared_cpu_stack
    folder = shared_folder(tmp_path_factory)
    done = folder / f"{namespace}.validated"
    reports = built_in / "reports/cpu/cpu"
    with locked(folder / f"{namespace}.validate.lock"):  # not the build's: it is done
        if not done.exists():
            proc = invoke(built_in, "validate", "--arch", "cpu", "--namespace", namespace,
                          *VALIDATE, timeout=1800)  # fmt: skip
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            done.write_text(proc.stdout)  # what it printed, for whoever reads the session's tmp
    return Validated(namespace, reports)


def copy_validated(validated: Validated, dest: Path) -> Path:
    """Give the tree ``dest`` the session's validation reports (reports/cpu/cpu, with the stamp
    and the kept baseline), as if it had run that validation itself; returns that folder."""
    mine = dest / "reports/cpu/cpu"
    shutil.copytree(validated.reports, mine)
    return mine


def copy_stack(shared: tuple[str, Path], namespace: str, dest: Path) -> None:
    """Tag every image of the shared namespace into ``namespace`` as well (the same image ids),
    and give the tree ``dest`` the build's records of each layer's inputs (build/state/inputs,
    what its own cached build would have written; `invoke publish` reads them for provenance)."""
    shared, built_in = shared
    shutil.copytree(built_in / "build/state/inputs", dest / "build/state/inputs")
    tags = tags_in(shared)
    for tag in tags:
        mine = namespace + tag.removeprefix(shared)
        subprocess.run(["docker", "tag", tag, mine], capture_output=True, text=True, check=True)
    assert len(tags_in(namespace)) == len(tags)


@pytest.fixture(scope="session")
def tag_shared_stack(shared_cpu_stack):
    """``tag(namespace, dest)``: `copy_stack` of the session's one build, for a module of
    tests/e2e that this conftest imports helpers from (test_cpu_stack), so that it needs no
    import of this file back."""
    return lambda namespace, dest: copy_stack(shared_cpu_stack, namespace, dest)


def cpu_stack_tree(label: str, namespace: str, *, registry: bool = False, validated: bool = False):
    """A module-scoped fixture: the tree copy ``label`` with the cpu stack in ``namespace``
    (``registry``: the local registry is required too; ``validated``: with the session's
    validation reports, see `copy_validated`)."""

    @pytest.fixture(scope="module")
    def tree(request, tmp_path_factory, shared_cpu_stack) -> Path:
        if registry:
            _need_registry()
        dest = copy_tree(tmp_path_factory, label)
        try:
            copy_stack(shared_cpu_stack, namespace, dest)
            if validated:
                copy_validated(request.getfixturevalue("validated_cpu_stack"), dest)
            yield dest
        finally:
            remove_images(namespace)

    return tree
