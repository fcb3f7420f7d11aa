"""recipes/tritons.yaml: which Triton each stack's kernels meet, and which Tritons CI checks."""

import re
from pathlib import Path

import pytest

from attnforge.errors import UserError
from attnforge.recipes import load_recipes
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


@pytest.mark.parametrize(
    "text, message",
    [
        ("torch: []\n", "expected torch:"),
        ('torch: [{torch: "2.14", triton: "three", source: s}]\nnewest: {triton: "3.9.0", '
         "source: s}\n", "'three' is not a version"),
        ('torch: [{torch: "2.14", triton: "3.8.0", source: a}, {torch: "2.14", triton: "3.8.1", '
         'source: b}]\nnewest: {triton: "3.9.0", source: s}\n', r"torch \['2.14'\] twice"),
    ],
)  # fmt: skip
def test_a_bad_table_is_one_sentence_naming_the_file(tmp_path, text, message):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes/tritons.yaml").write_text(text)
    with pytest.raises(UserError, match=message) as e:
        load_table(tmp_path)
    assert str(e.value).startswith("recipes/tritons.yaml: ")


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
