"""No import circle anywhere in the repository's Python: every import counts, the ones inside
functions too (an import moved into a function to dodge a circle hides the circle, it does not
remove it)."""

from __future__ import annotations

import ast

from tests.conftest import repo_files


def module_name(rel: str) -> str:
    """``attnforge/cli/export.py`` -> ``attnforge.cli.export``; a package's ``__init__.py`` is the
    package."""
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, name: str, is_package: bool) -> list[str]:
    """Every module ``source`` (module ``name``) imports, anywhere in it, absolute: for
    ``from X import y`` both ``X`` and ``X.y`` (one of them is not a module and drops out)."""
    package = name if is_package else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.append(mod)
            found += [f"{mod}.{a.name}" for a in node.names]
    return found


def graph(files: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the modules of ``files`` (path -> source) it imports."""
    names = {module_name(rel): rel for rel in files}
    edges: dict[str, set[str]] = {}
    for name, rel in names.items():
        targets = set()
        for imp in imports_of(files[rel], name, rel.endswith("__init__.py")):
            while imp and imp not in names:  # `a.b.c` where only `a.b` is a module here
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                targets.add(imp)
        edges[name] = targets
    return edges


def circles(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(part)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_repository_has_no_import_circle():
    assert [sorted(c) for c in circles(graph(repo_files("*.py")))] == []


def test_the_graph_covers_the_kernels_and_the_tools():
    edges = graph(repo_files("*.py"))
    assert "attnforge_kernels.launch.replay" in edges["attnforge_kernels.api.flash_attn"]
    # checks.attention imports the API inside a function
    assert "attnforge_kernels.api.flash_attn" in edges["attnforge_kernels.checks.attention"]
    assert "attnforge_kernels.launch.replay" in edges["tools.step_probe"]


def test_a_circle_through_a_function_local_import_is_found():
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "def f():\n    from .c import x\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/d.py": "from pkg import a\n",  # imports into the circle, not part of it
    }
    assert circles(graph(files)) == [{"pkg.a", "pkg.b", "pkg.c"}]


def test_modules_that_import_each_other_one_way_are_no_circle():
    files = {"p/__init__.py": "from .a import f\n", "p/a.py": "from .b import g\n",
             "p/b.py": "import os\n"}  # fmt: skip
    assert circles(graph(files)) == []
