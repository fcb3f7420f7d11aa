"""The folder tree of attnforge/ shows its architecture (README.md, "Layout"): the pipeline and the
plumbing at the top, each feature of several modules in its own subpackage, and the scripts that
run inside images in attnforge/image/, standard library only."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.plan import PATCH_TOOL
from attnforge.recipes import load_recipes

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "attnforge"

# each wing and the modules it holds
WINGS = {
    "pins": {"upstream", "update", "quartz"},
    "bisection": {"search", "probe"},
    "baseline": {"gate", "store"},
    "publish": {"ociregistry", "registry_auth", "signature", "attest"},
    "image": {"smoke_runner", "envprobe"},
}


def flat_modules() -> set[str]:
    return {p.stem for p in PKG.glob("*.py")} - {"__init__"}


def subpackages() -> set[str]:
    return {p.parent.name for p in PKG.glob("*/__init__.py")}


def non_stdlib_imports(source: str) -> list[str]:
    """The imports of a module that are neither the standard library nor __future__, relative
    ones included (an in-image script has no package around it). An import inside a `try` that
    catches ImportError is optional and not counted."""
    tree = ast.parse(source)
    optional = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.Try)
        and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in node.handlers)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        else:
            continue
        found += [
            n for n in names
            if n.startswith(".") or n.split(".")[0] not in {*sys.stdlib_module_names, "__future__"}
        ]  # fmt: skip
    return found


def test_every_wing_is_a_subpackage_holding_its_modules():
    assert set(WINGS) <= subpackages()
    for wing, modules in WINGS.items():
        assert modules <= {p.stem for p in (PKG / wing).glob("*.py")}, wing


def test_no_flat_module_belongs_to_a_wing():
    """A new pins_*.py, bisect_*.py ... or a wing module back at the top goes into its wing."""
    flat = flat_modules()
    members = set().union(*WINGS.values())
    prefixes = subpackages() | {"bisect"}  # bisect*.py: the bisection wing's old names
    strays = sorted(
        name for name in flat
        if name in members or any(name == w or name.startswith(f"{w}_") for w in prefixes)
    )  # fmt: skip
    assert strays == []


def test_no_name_at_the_top_shadows_the_standard_library():
    """`python3 attnforge/patches.py` (docs/patches.md) puts attnforge/ first on sys.path: a
    subpackage or module named bisect, say, would replace the standard library's for it (random,
    which tempfile imports, needs bisect)."""
    names = flat_modules() | subpackages()
    assert sorted(names & set(sys.stdlib_module_names)) == []


def test_the_patch_tool_runs_as_a_script_from_a_checkout():
    done = subprocess.run([sys.executable, str(REPO / PATCH_TOOL), "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "apply" in done.stdout


def test_wing_packages_import_nothing_when_imported():
    """Importing one module of a wing does not load the others (baseline/gate.py stays usable
    with only Python: `python -m attnforge.baseline`); __init__.py holds a docstring only."""
    for wing in WINGS:
        body = ast.parse((PKG / wing / "__init__.py").read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), wing
        assert isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)


def test_in_image_scripts_import_only_the_standard_library():
    """They are sent to an image's Python on stdin (or copied into a build context as one file):
    no attnforge around them, and the image may have nothing but the standard library."""
    scripts = [p for p in (PKG / "image").glob("*.py") if p.name != "__init__.py"]
    scripts += [REPO / PATCH_TOOL, PKG / "aotriton_pin.py"]
    assert len(scripts) >= 4
    found = {str(p.relative_to(REPO)): non_stdlib_imports(p.read_text()) for p in scripts}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_import_check_catches_what_it_is_for():
    source = "import json\nimport torch\nfrom . import files\nfrom attnforge.errors import X\n"
    assert non_stdlib_imports(source) == ["torch", ".", "attnforge.errors"]
    optional = "try:\n    import zstandard\nexcept ImportError:\n    import numpy\n"
    assert non_stdlib_imports(optional) == ["numpy"]


def test_modules_sent_as_build_context_stay_at_the_paths_the_cache_keys_name():
    """A context file's repository path is part of its layer's cache key: moving one rebuilds
    every layer that sends it (pytorch-source takes hours), so they stay at the top."""
    named = {PATCH_TOOL}
    for layer in load_recipes(REPO).layers.values():
        named |= {c for c in layer.context if c.startswith("attnforge/")}
    assert "attnforge/aotriton_pin.py" in named
    assert sorted(c for c in named if not (REPO / c).is_file()) == []
    assert all(c.count("/") == 1 for c in named), named


def test_the_readme_layout_names_every_subpackage():
    readme = (REPO / "README.md").read_text()
    layout = readme[readme.index("## Layout") :]
    layout = layout[: layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout
    named = set(re.findall(r"^  ([a-z_]+)/ ", layout, flags=re.M))
    assert sorted(subpackages() - named) == []


def private_imports(root: Path, package: str) -> set[tuple[str, str]]:
    """(file, name) of each `from X import _name` of a project module: reaching into another
    module's private names."""
    found = set()
    for path in (root / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                found |= {
                    (str(path.relative_to(root)), a.name)
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                }
    return found


@pytest.mark.parametrize("package", ["attnforge", "validate", "contract"])
def test_no_module_imports_another_modules_private_name(package):
    """attnforge_kernels/ and tools/ have the same rule in test_kernels_layout."""
    assert private_imports(REPO, package) == set()
