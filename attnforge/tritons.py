"""Which Triton each stack's bundled kernels run on (recipes/tritons.yaml), and so which Tritons
CI compiles and checks the kernels with.

    python -m attnforge.tritons              the table, as docs/kernels.md shows it
    python -m attnforge.tritons --versions   the Triton releases to check, one a line

A stack's Triton is the `triton` layer's TRITON_VERSION pin where the stack has that layer, else
the Triton its torch release requires (recipes/tritons.yaml `torch:`); a stack whose torch comes
from --set (nightly) is checked at the newest Triton. Each Triton line is checked at the newest
release a stack uses.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .errors import UserError
from .plan import resolve
from .recipes import TRITONS, Recipes, load_recipes, load_tritons, selectors_match

TABLE = TRITONS


@dataclass(frozen=True)
class TorchTriton:
    torch: str  # a release line, "2.14"
    triton: str  # the Triton release its wheels require, "3.8.0"
    source: str


@dataclass(frozen=True)
class KnownProblem:
    """What one Triton line does to one kernel that the tiles do not fix (``known:``)."""

    triton: str  # a line, "3.9"
    arch: str
    head_dim: int
    kernel: str
    happens: str
    reason: str
    fallback: str

    def covers(self, triton: str) -> bool:
        """Whether a release (3.9.0, 3.9.1+rocm10.2.0) is of this line."""
        return Version(triton).release[:2] == Version(self.triton).release[:2]


@dataclass(frozen=True)
class TritonTable:
    torch: tuple[TorchTriton, ...]
    newest: str
    newest_source: str
    known: tuple[KnownProblem, ...] = ()

    def known_on(self, triton: str) -> list[KnownProblem]:
        return [k for k in self.known if k.covers(triton)]

    def for_torch(self, version: str) -> TorchTriton | None:
        """The row of a torch version (2.14.0+rocm10.1.0 -> the 2.14 row), or None."""
        try:
            release = Version(version).release[:2]
        except InvalidVersion:
            return None
        line = ".".join(map(str, release))
        return next((r for r in self.torch if r.torch == line), None)


@dataclass(frozen=True)
class StackTriton:
    stack: str
    torch: str  # the torch pin, or a sentence when there is none
    triton: str  # the Triton release the stack runs (or stands in for it on the CPU)
    how: str  # where that came from


def _words(text: str) -> str:
    return " ".join(str(text).split())


def load_table(root: Path) -> TritonTable:
    """recipes/tritons.yaml, loaded and checked by the recipes' strict loader (unknown keys,
    malformed YAML, versions and a torch line twice are errors naming the line and field)."""
    data = load_tritons(root)
    if data is None:
        raise UserError(f"{TABLE}: no such file under {root}")
    rows = tuple(TorchTriton(r.torch, r.triton, _words(r.source)) for r in data.torch)
    known = tuple(
        KnownProblem(k.triton, k.arch, k.head_dim, k.kernel, _words(k.happens), _words(k.reason),
                     _words(k.fallback))
        for k in data.known
    )  # fmt: skip
    return TritonTable(rows, data.newest.triton, data.newest.source, known)


def _an_arch(recipes: Recipes, stack: str) -> str:
    """The first arch of recipes/arches.yaml the stack builds for."""
    selectors = recipes.stacks[stack].arches
    return next(n for n, a in recipes.arches.items() if selectors_match(selectors, a))


def stack_triton(recipes: Recipes, table: TritonTable, stack: str) -> StackTriton:
    """The Triton one stack's kernels meet; UserError when the table has no row for its torch."""
    plan = resolve(recipes, _an_arch(recipes, stack), stack)
    torch = "from --set"
    for step in plan.steps:
        layer = recipes.layers[step.layer]
        if "triton" in layer.provides and "TRITON_VERSION" in step.pins:
            where = recipes.layer_files[layer.name]
            return StackTriton(stack, torch, step.pins["TRITON_VERSION"], f"{where} TRITON_VERSION")
        if "torch" in layer.provides and layer.torch_version_pin in step.pins:
            torch = step.pins[layer.torch_version_pin]
            if "triton" in layer.provides:
                row = table.for_torch(torch)
                if row is None:
                    raise UserError(
                        f"stack {stack}: torch {torch} has no row in {TABLE} (torch: "
                        f"{', '.join(r.torch for r in table.torch)}); add the Triton it requires"
                    )
                return StackTriton(stack, torch, row.triton, f"torch {row.torch}'s requirement")
    if torch == "from --set":
        return StackTriton(stack, torch, table.newest, "the newest Triton release")
    raise UserError(f"stack {stack}: no layer provides triton beside torch {torch}")


def stack_tritons(recipes: Recipes, table: TritonTable) -> list[StackTriton]:
    return [stack_triton(recipes, table, name) for name in recipes.stacks]


def versions_to_check(rows: list[StackTriton], newest: str) -> list[str]:
    """One release per Triton line, the newest one a stack uses (or the newest on PyPI)."""
    by_line: dict[tuple[int, ...], Version] = {}
    for v in [Version(r.triton) for r in rows] + [Version(newest)]:
        line = v.release[:2]
        by_line[line] = max(by_line.get(line, v), v)
    return [str(by_line[k]) for k in sorted(by_line)]


def render_markdown(rows: list[StackTriton], table: TritonTable) -> str:
    """The stacks' Tritons, then the torch rows and the newest release with their sources."""
    lines = ["| stack | torch | Triton | from |", "|---|---|---|---|"]
    lines += [f"| `{r.stack}` | {r.torch} | {r.triton} | {r.how} |" for r in rows]
    lines += ["", "| torch | Triton | source |", "|---|---|---|"]
    lines += [f"| {r.torch} | {r.triton} | {r.source} |" for r in table.torch]
    lines += [f"| newest | {table.newest} | {table.newest_source} |"]
    if not table.known:
        lines += [
            "",
            "No Triton line spills or overflows a kernel at its default config (beyond "
            "`configs.ACCEPTED_SPILLS`, the measured exceptions of every line).",
        ]
        return "\n".join(lines)
    lines += [
        "",
        "| Triton | arch | d | kernel | what happens | why | what runs |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {k.triton} | {k.arch} | {k.head_dim} | {k.kernel} | {k.happens} | {k.reason} | "
              f"{k.fallback} |" for k in table.known]  # fmt: skip
    return "\n".join(lines)


def main(argv=None, root: Path = Path(".")) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attnforge.tritons", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--versions", action="store_true", help="the Triton releases to check")
    args = ap.parse_args(argv)
    try:
        recipes = load_recipes(root)
        table = load_table(root)
        rows = stack_tritons(recipes, table)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        "\n".join(versions_to_check(rows, table.newest))
        if args.versions
        else render_markdown(rows, table)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
