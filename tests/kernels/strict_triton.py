"""Triton's deprecation warnings fail the kernel checks, in subprocesses too.

In the test process, pyproject.toml's ``filterwarnings`` turns them into errors. The kernel tests
that run another Triton (test_triton_versions.py, tests/validate/test_newest_torch.py) start a
Python of their own, where that filter does not reach: ``module_args`` runs a module there as
``python -m`` would, after the same filter. Triton 3.9 gives its deprecations as ``UserWarning``s
(triton/_utils.py: unset ``TRITON_DEFAULT_FP_FUSION``, ``tl.cat``/``tl.reshape(can_reorder=True)``;
triton/language/core.py: "... is deprecated"), so they are matched by their words, not only by
category.
"""

from __future__ import annotations

# As pyproject.toml's [tool.pytest.ini_options] filterwarnings says it (the test there checks that
# the two agree).
MESSAGE = r".*(deprecated|will be removed|TRITON_DEFAULT_FP_FUSION is unset)"
PRELUDE = (
    "import warnings; "
    f"warnings.filterwarnings('error', {MESSAGE!r}, module='triton'); "
    "warnings.filterwarnings('error', category=DeprecationWarning, module='triton'); "
    "warnings.filterwarnings('error', category=FutureWarning, module='triton')"
)


def module_args(module: str, *argv: str, first: str = "") -> list[str]:
    """``python`` arguments that run ``module`` with ``argv`` as ``-m`` would, Triton's deprecation
    warnings as errors; ``first``: statements to run before it, in the same process."""
    return [
        "-c",
        f"{PRELUDE}; {first + '; ' if first else ''}import runpy, sys; "
        f"sys.argv = [{module!r}, *{list(argv)!r}]; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)",
    ]
