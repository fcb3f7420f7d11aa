"""The folder tree of attnforge_kernels/ shows its architecture (docs/kernels.md, the module table):
wings whose names say their job, each importing only the wings before it; public names at the root
that hold no code; no module reaching for another's private name; no two modules named alike."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.unit.test_import_graph import graph

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "attnforge_kernels"

# Each wing, in the order they may import each other: a module imports its own wing and the
# wings before it only, inside functions too.
WINGS = ("device", "launch", "api", "checks", "tools")
# The root's modules: the package (the public API) and the public names of the commands and the
# shim, each an import of the code that lives in a wing.
ROOT = {"__init__", "aot", "bench", "check", "native", "sdpa_shim"}
PROJECT = ("attnforge_kernels", "contract")


def kernels_files() -> dict[str, str]:
    return {
        str(p.relative_to(REPO)): p.read_text(encoding="utf-8")
        for p in sorted(PKG.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def wing_of(module: str) -> str | None:
    """The wing of ``attnforge_kernels.<wing>.x``; None for the root's modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in WINGS) else None


def test_the_root_holds_the_wings_and_the_public_names_only():
    assert {p.stem for p in PKG.glob("*.py")} == ROOT
    assert {p.parent.name for p in PKG.glob("*/__init__.py")} == set(WINGS)


def test_a_wing_imports_only_itself_and_the_wings_before_it():
    edges = graph(kernels_files())
    wrong = []
    for module, targets in edges.items():
        wing = wing_of(module)
        if wing is None:
            continue
        allowed = set(WINGS[: WINGS.index(wing) + 1])
        for target in targets:
            other = wing_of(target)
            if target.startswith("attnforge_kernels") and other not in allowed:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_a_wing_package_imports_nothing_when_imported():
    for wing in WINGS:
        body = ast.parse((PKG / wing / "__init__.py").read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), wing


def holds_code(source: str) -> list[str]:
    """The statements of a root module other than its docstring, imports, ``__all__`` and the
    ``if __name__ == "__main__": sys.exit(main())`` of a command."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]:
            continue
        if ast.unparse(node) == "if __name__ == '__main__':\n    sys.exit(main())":
            continue
        found.append(ast.unparse(node).splitlines()[0])
    return found


def test_the_public_names_at_the_root_hold_no_code():
    for name in ROOT - {"__init__"}:
        assert holds_code((PKG / f"{name}.py").read_text()) == [], name


def test_the_code_check_catches_code():
    assert holds_code('"""Doc."""\nimport sys\n\nfrom .x import main\n__all__ = ["main"]\n') == []
    assert holds_code("import sys\nX = 1\ndef f():\n    pass\n") == ["X = 1", "def f():"]


def private_uses(source: str) -> list[str]:
    """Where ``source`` takes another module's private ``_name`` from the
    project: ``from .x import _y``, or ``x._y`` with ``x`` a project module it imported."""
    modules: set[str] = set()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if not (node.level or mod.split(".")[0] in PROJECT):
                continue
            for alias in node.names:
                if re.match(r"_[a-zA-Z]", alias.name):
                    found.append(f"from {'.' * node.level}{mod} import {alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.asname and a.name.startswith(PROJECT)}
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and re.match(r"_[a-zA-Z]", node.attr)
        ):
            found.append(f"{node.value.id}.{node.attr}")
    return sorted(set(found))


# flash_attn's own public helper, whose name the API keeps.
PUBLIC_UNDERSCORE = {"_get_block_size_n"}


def test_no_module_takes_another_modules_private_name():
    files = kernels_files()
    files |= {str(p.relative_to(REPO)): p.read_text() for p in (REPO / "tools").glob("*.py")}
    found = {}
    for rel, source in files.items():
        uses = [
            u
            for u in private_uses(source)
            if u.rpartition(" ")[2].rpartition(".")[2] not in PUBLIC_UNDERSCORE
        ]
        if uses:
            found[rel] = uses
    assert found == {}


def test_the_private_name_check_catches_what_it_is_for():
    source = (
        "from . import flash\nfrom .x import _y, z\nfrom triton.runtime import _allocation\n"
        "import torch\nflash._dot\n_allocation._allocator\ntorch._C\n"
    )
    assert private_uses(source) == ["flash._dot", "from .x import _y"]


def echo_names(stems: list[str]) -> list[tuple[str, str]]:
    """Pairs of module names that echo each other: the same name (a leading underscore aside),
    or one with ``_kernels``, ``_impl`` or ``_native`` added."""
    norm = {s: s.lstrip("_") for s in stems}
    pairs = []
    for a in stems:
        for b in stems:
            if a >= b:
                continue
            x, y = norm[a], norm[b]
            if x == y or any(x == y + s or y == x + s for s in ("_kernels", "_impl", "_native")):
                pairs.append((a, b))
    return pairs


def test_no_two_modules_of_the_wings_echo_each_other():
    stems = [
        str(p.relative_to(PKG).with_suffix(""))
        for p in PKG.rglob("*.py")
        if p.parent != PKG and p.name != "__init__.py" and "__pycache__" not in p.parts
    ]
    names = [s.split("/")[-1] for s in stems]
    assert len(names) == len(set(names)), sorted(names)
    assert echo_names(names) == []


def test_the_echo_check_catches_what_it_is_for():
    names = ["native", "_native", "kvcache", "kvcache_kernels", "flash", "decode"]
    assert echo_names(names) == [("_native", "native"), ("kvcache", "kvcache_kernels")]


def module_table() -> set[str]:
    """The paths docs/kernels.md's module table lists."""
    text = (REPO / "docs" / "kernels.md").read_text()
    table = text[text.index("| module | what it is |") :]
    table = table[: table.index("\n\n")]
    return set(re.findall(r"^\| `(attnforge_kernels/[^`]+)` \|", table, flags=re.M))


def test_the_docs_module_table_lists_every_module_and_nothing_else():
    on_disk = {
        str(p.relative_to(REPO))
        for p in PKG.rglob("*")
        if p.suffix in (".py", ".cpp", ".sh")
        and "__pycache__" not in p.parts
        and not (p.name == "__init__.py" and p.parent != PKG)
    }
    listed = module_table()
    assert sorted(on_disk - listed) == [] and sorted(listed - on_disk) == []
