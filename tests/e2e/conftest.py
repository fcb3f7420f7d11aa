"""What the end-to-end modules that build and validate the cpu stack share.

`cpu_stack_tree(label, namespace)` makes a module's `tree` fixture: a copy of the checkout (the
module's tests may edit it and write their build and report folders in it) in which the cpu stack
is already built under the module's own image namespace, whose images are removed after the
module. The layers come from BuildKit's cache after the first build of a session, so a module pays
for tagging and its own runs, not for another build.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_cpu_stack import (
    _need_registry,
    build_args,
    copy_tree,
    invoke,
    remove_images,
    require_engine,
)


def cpu_stack_tree(label: str, namespace: str, *, registry: bool = False):
    """A module-scoped fixture: the tree copy ``label`` with the cpu stack built in ``namespace``
    (``registry``: the local registry is required too)."""

    @pytest.fixture(scope="module")
    def tree(tmp_path_factory) -> Path:
        require_engine()
        if registry:
            _need_registry()
        dest = copy_tree(tmp_path_factory, label)
        try:
            built = invoke(dest, *build_args(namespace=namespace))
            assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
            yield dest
        finally:
            remove_images(namespace)

    return tree
