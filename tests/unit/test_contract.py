"""The contract (contract/) is the one home of the names and rules validate/, attnforge_kernels/ and
attnforge/ share: stdlib only, imported by the others, never re-defined by them."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from contract import arches, documents, names

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "validate" / "report.schema.json").read_text())
PACKAGES = ("attnforge", "validate", "attnforge_kernels")


def modules(folder: str) -> list[Path]:
    return sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def imported(path: Path) -> set[str]:
    """Top-level names of what a module imports (absolute imports and import_module strings)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value.split(".")[0])
    return found


def test_the_scan_sees_imports_of_every_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import validate.grid\nfrom validate import x\nfrom .sib import y\n"
        "def f():\n    importlib.import_module('validate.report')\n"
    )
    assert imported(src) == {"validate"}


@pytest.mark.parametrize("path", modules("attnforge_kernels"), ids=lambda p: p.name)
def test_kernels_never_import_validate(path):
    assert "validate" not in imported(path), f"{path.relative_to(REPO)} imports validate"


@pytest.mark.parametrize("path", modules("contract"), ids=lambda p: p.name)
def test_the_contract_imports_only_the_standard_library(path):
    outside = imported(path) - set(sys.stdlib_module_names) - {"__future__", "contract"}
    assert not outside, f"{path.relative_to(REPO)} imports {sorted(outside)}"


def literals(path: Path):
    """(line, value) of each string constant and of each all-string tuple/list/set literal."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and node.elts:
            if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                yield node.lineno, tuple(e.value for e in node.elts)  # type: ignore[attr-defined]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def redefinitions(path: Path) -> list[str]:
    """Where a module writes out the contract's names instead of importing them."""
    kinds = set(names.KIND_VERSIONS) | {names.BENCH}
    found = []
    for line, value in literals(path):
        if isinstance(value, str):
            if value in kinds:
                found.append(f"line {line}: the document kind {value!r}")
        elif len(value) > 1 and (
            set(value) <= set(names.BACKEND_NAMES) and len(value) > 2
            or set(value) == set(names.SDPA_BACKENDS)
            or set(value) == set(names.MODES)
            or set(value) == set(names.DTYPES)
            or set(value) == set(names.FAILING) - {names.ERROR}
            or set(value) == set(names.FAILING) - {names.FAIL}
            or set(value) in (set(names.CHECK_STATUSES), set(names.BENCH_STATUSES),
                              set(names.RUN_STATUSES), set(names.CASE_STATUSES))
        ):  # fmt: skip
            found.append(f"line {line}: {value!r}")
    return found


@pytest.mark.parametrize(
    "path",
    [p for pkg in PACKAGES for p in modules(pkg)],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_no_module_writes_out_the_contract_again(path):
    assert not redefinitions(path), f"{path.relative_to(REPO)}: {redefinitions(path)}"


def test_the_redefinition_scan_finds_lists_and_kinds(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        'MODES = ["fwd", "bwd", "fwd_bwd"]\nKIND = "attnforge.stress"\n'
        'B = ("sdpa.math", "sdpa.flash", "kernels")\nF = ("fail", "crash", "timeout")\n'
        'OK = ("fwd", "bwd")\nDOC = "reads attnforge.bench documents"\n'
    )
    assert [f.split(":")[0] for f in redefinitions(src)] == ["line 1", "line 2", "line 3", "line 4"]


def test_check_statuses_are_the_report_schemas():
    assert list(names.CHECK_STATUSES) == SCHEMA["$defs"]["status"]["enum"]
    assert set(SCHEMA["properties"]["summary"]["properties"]["counts"]["required"]) == set(
        names.CHECK_STATUSES
    )


def test_the_report_reader_reads_the_schemas_major_version(tmp_path):
    pattern = SCHEMA["properties"]["schema_version"]["pattern"]
    major = names.REPORT_SCHEMA_VERSION.split(".")[0]
    assert pattern.startswith(f"^{major}\\.")
    ok, bad = tmp_path / "ok.json", tmp_path / "bad.json"
    ok.write_text(json.dumps({"schema_version": f"{major}.99"}))
    bad.write_text(json.dumps({"schema_version": f"{int(major) + 1}.0"}))
    assert documents.load_report(ok)["schema_version"] == f"{major}.99"
    with pytest.raises(documents.DocumentError, match="is not supported"):
        documents.load_report(bad)


def test_every_sibling_kind_has_a_version_a_list_and_a_tool():
    for _pattern, kind in documents.SIBLINGS.values():
        assert kind in names.KIND_VERSIONS
        assert kind in documents.SIBLING_LISTS and kind in documents.SIBLING_TOOLS


def test_the_failing_statuses_fail_in_every_document():
    for statuses in (names.CHECK_STATUSES, names.RUN_STATUSES, names.BENCH_STATUSES):
        failing = [s for s in statuses if s in names.FAILING]
        assert failing and set(failing) >= {names.CRASH, names.TIMEOUT}
    assert not set(names.FAILING) & {names.PASS, names.OK, names.SKIP, names.UNSUPPORTED}


def test_backends_are_named_once_with_a_label():
    assert len(set(names.BACKEND_NAMES)) == len(names.BACKENDS)
    assert all(b.label for b in names.BACKENDS)
    assert names.SDPA_BACKENDS == ("flash", "efficient", "cudnn", "math")
    assert names.backend("kernels").label == "bundled kernels"
    with pytest.raises(KeyError):
        names.backend("sdpa.nope")


# ---------------------------------------------------------------------------- arch facts


@pytest.fixture(scope="module")
def arch_yaml() -> dict:
    import yaml

    return yaml.safe_load((REPO / "recipes" / "arches.yaml").read_text())


def test_families_come_from_the_arch_entries_and_their_neighbours(arch_yaml):
    facts = arches.from_mapping(arch_yaml)
    for name, entry in arch_yaml["arches"].items():
        assert facts.family(name) == entry["family"]
    assert facts.family("gfx942:sramecc+:xnack-") == "cdna3"
    assert facts.family("GFX1151") == "rdna3.5"
    assert facts.family("gfx1103") == "rdna3" and facts.family("gfx1036") == "rdna2"
    assert facts.family("gfx1153") == "rdna3.5" and facts.family("gfx1200") == "rdna4"
    assert facts.family("gfx1199") is None  # no guess from the name


def test_the_rendering_the_images_carry_is_what_the_contract_reads(
    tmp_path, monkeypatch, arch_yaml
):
    from attnforge.build import render_arch_facts

    ctx = tmp_path / "context"
    (ctx / "recipes").mkdir(parents=True)
    (ctx / "contract").mkdir()
    (ctx / "recipes" / "arches.yaml").write_text((REPO / "recipes" / "arches.yaml").read_text())
    tree = tmp_path / "tree.json"  # a staged file may be a hard link into the source tree
    tree.write_text("{}")
    (ctx / "contract" / arches.JSON_NAME).hardlink_to(tree)
    rendered = render_arch_facts(ctx)
    assert rendered == ctx / "contract" / arches.JSON_NAME and tree.read_text() == "{}"
    monkeypatch.setenv(arches.ENV, str(rendered))
    assert arches.load() == arches.from_mapping(arch_yaml)
    monkeypatch.setenv(arches.ENV, str(tmp_path / "absent.json"))
    assert arches.load() is None
    assert render_arch_facts(tmp_path / "no-contract") is None


def test_the_validate_layer_carries_the_contract_and_the_arch_facts():
    layer = (REPO / "recipes" / "layers" / "validate.yaml").read_text()
    dockerfile = (REPO / "dockerfiles" / "validate.Dockerfile").read_text()
    assert "contract" in layer and "recipes/arches.yaml" in layer
    assert "COPY contract /opt/attnforge/src/contract" in dockerfile
