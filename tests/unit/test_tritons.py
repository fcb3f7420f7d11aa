"""recipes/tritons.yaml: which Triton each stack's kernels meet, and which Tritons CI checks."""

import dataclasses
import re
from pathlib import Path

import pytest

from attnforge.errors import UserError
from attnforge.plan import resolve, stacks_for
from attnforge.recipes import TRITONS, load_recipes
from attnforge.tritons import (
    StackTriton,
    TorchTriton,
    TritonTable,
    load_table,
    main,
    render_markdown,
    stack_triton,
    stack_tritons,
    versions_to_check,
)
from tests.conftest import run_invoke

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def recipes():
    return load_recipes(REPO)


@pytest.fixture(scope="module")
def table():
    return load_table(REPO)


def test_every_stack_has_a_triton(recipes, table):
    rows = {r.stack: r for r in stack_tritons(recipes, table)}
    assert set(rows) == set(recipes.stacks)
    for r in rows.values():
        assert re.fullmatch(r"\d+\.\d+\.\d+", r.triton), r


def test_the_cpu_stack_runs_its_triton_layer_pin_which_is_the_dev_extras(recipes, table):
    cpu = stack_triton(recipes, table, "cpu")
    pin = recipes.layers["triton"].pins["TRITON_VERSION"]
    assert (cpu.triton, cpu.how) == (pin, "recipes/layers/triton.yaml TRITON_VERSION")
    assert f'"triton=={pin}"' in (REPO / "pyproject.toml").read_text()  # the dev extra
    assert f'"triton=={pin}"' in (REPO / "tools/setup.sh").read_text()  # the cpu wheelhouse


def test_a_wheel_stack_runs_the_triton_its_torch_requires(recipes, table):
    default = stack_triton(recipes, table, "default")
    torch = recipes.layers["pytorch-wheels"].variants["stable"].pins["TORCH_VERSION"]
    assert default.torch == torch
    assert default.triton == table.for_torch(torch).triton
    assert default.how.startswith(f"torch {table.for_torch(torch).torch}")


def test_a_stack_whose_torch_comes_from_set_is_checked_at_the_newest(recipes, table):
    nightly = stack_triton(recipes, table, "nightly")
    assert (nightly.torch, nightly.triton) == ("from --set", table.newest)


def test_a_torch_line_missing_from_the_table_is_refused_with_the_stack_named(recipes):
    table = TritonTable((TorchTriton("2.13", "3.7.1", "x"),), "3.9.0", "y")
    with pytest.raises(UserError, match=r"stack default: torch 2\.14\.0\+rocm10\.1\.0 has no row"):
        stack_triton(recipes, table, "default")


@pytest.mark.parametrize(
    "tritons, newest, want",
    [
        (["3.6.0"], "3.9.0", ["3.6.0", "3.9.0"]),
        (["3.7.0", "3.7.1", "3.7.0"], "3.7.1", ["3.7.1"]),  # one release per line, its newest
        (["3.8.0", "3.10.0", "3.9.1"], "3.10.0", ["3.8.0", "3.9.1", "3.10.0"]),  # numeric order
    ],
)
def test_versions_to_check(tritons, newest, want):
    rows = [StackTriton(f"s{i}", "t", v, "h") for i, v in enumerate(tritons)]
    assert versions_to_check(rows, newest) == want


NEWEST = 'newest: {triton: "3.9.0", source: s}\n'
ROW = '  - {torch: "2.14", triton: "3.8.0", source: a}\n'


@pytest.mark.parametrize(
    "text, message",
    [
        ("torch: []\n", "newest: Field required"),
        ('torch: [{torch: "2.14", triton: "three", source: s}]\n' + NEWEST,
         ":1: torch.0.triton: 'three' is not a version"),
        ("torch:\n" + ROW + '  - {torch: "2.14", triton: "3.8.1", source: b}\n' + NEWEST,
         ":3: torch.1.torch: torch 2.14 has a row already"),
        # what the other files under recipes/ refuse, refused here too, with the line
        ("torch:\n" + ROW.replace("source: a", "source: a, triton_commit: abc") + NEWEST,
         ":2: torch.0.triton_commit: unknown key (valid: source, torch, triton)"),
        ("torch:\n" + ROW + "newest:\n\ttriton: 3.9.0\n", ":4: malformed YAML: found character"),
        ("torch:\n" + ROW + "newest: {triton: 3.9.0, source: s\n", "malformed YAML"),
        ("torch:\n" + ROW + NEWEST + "known: [{triton: '3.9', arch: gfx942}]\n",
         ":4: known.0.head_dim: Field required"),
    ],
)  # fmt: skip
def test_a_bad_table_is_one_sentence_naming_the_file_line_and_field(tmp_path, text, message):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes/tritons.yaml").write_text(text)
    with pytest.raises(UserError) as e:
        load_table(tmp_path)
    assert str(e.value).startswith("recipes/tritons.yaml")
    assert message in str(e.value)
    assert "\n" not in str(e.value).strip()


def test_a_broken_table_fails_a_dry_run_as_every_recipe_file_does(repo_copy):
    table = repo_copy / "recipes/tritons.yaml"
    table.write_text(table.read_text().replace("newest:\n  triton:", "newest:\n\ttriton:", 1))
    proc = run_invoke(repo_copy, "build", "--arch", "cpu", "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "recipes/tritons.yaml:" in proc.stderr and "malformed YAML" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_docs_show_the_table_as_the_command_prints_it(recipes, table, capsys):
    assert main([], root=REPO) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == render_markdown(stack_tritons(recipes, table), table)
    assert printed in (REPO / "docs/kernels.md").read_text()


def test_the_versions_command_lists_one_release_a_line(recipes, table, capsys):
    assert main(["--versions"], root=REPO) == 0
    assert capsys.readouterr().out.split() == versions_to_check(
        stack_tritons(recipes, table), table.newest
    )


def test_a_stack_whose_torch_line_has_no_row_is_refused_by_the_plan(recipes):
    """The plan refuses a torch release line the table lacks, naming the table and the line (a
    new torch release is planned only once its Triton row is in)."""
    planted = dataclasses.replace(recipes, tritons=recipes.tritons.model_copy(
        update={"torch": [r for r in recipes.tritons.torch if r.torch != "2.14"]}))  # fmt: skip
    plan = resolve(planted, "gfx1151", "default")
    torch = plan.step("pytorch-wheels")
    assert torch.status == "unsupported", torch
    assert "torch 2.14.0+rocm10.1.0 is of the 2.14 line" in torch.reason
    assert "no row in recipes/tritons.yaml (torch: 2.12, 2.13, 2.15" in torch.reason
    assert plan.final_tag is None and plan.blocked_by[0].layer == "pytorch-wheels"
    # a torch that does not bring its Triton (the cpu stack pins one) needs no row
    no_213 = dataclasses.replace(recipes, tritons=recipes.tritons.model_copy(
        update={"torch": [r for r in recipes.tritons.torch if r.torch != "2.13"]}))  # fmt: skip
    assert resolve(no_213, "cpu", "cpu").step("torch-cpu").status == "build"
    # the same stack with the row plans, and so does every stack of the recipes as they stand
    assert resolve(recipes, "gfx1151", "default").step("pytorch-wheels").status == "build"
    refused = [
        (arch, stack, s.reason) for arch in recipes.arches for stack in stacks_for(recipes, arch)
        for s in resolve(recipes, arch, stack).steps if TRITONS in (s.reason or "")
    ]  # fmt: skip
    assert refused == []
