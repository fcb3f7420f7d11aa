"""The patch ledger on real git repositories: a patch whose fix landed upstream is droppable, one
whose fix has not is still needed, and one the ledger cannot judge is unknown, never droppable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnforge import patch_ledger
from attnforge.errors import UserError
from attnforge.pins.upstream import Sources
from attnforge.recipes import load_recipes
from tests.conftest import REPO, run_invoke
from tests.patches.patch_helpers import diff_of, git, make_series

BEFORE = b'def is_rdna(arch):\n    return arch in ("gfx1100", "gfx1101")\n'
FIXED = b'def is_rdna(arch):\n    return arch in ("gfx1100", "gfx1101", "gfx1151")\n'
URL = "https://example.com/upstream/fa.git"

RECIPES = {
    "recipes/arches.yaml": "arches:\n  gfx1151: {description: t, vendor: amd, family: rdna3.5}\n",
    "recipes/stacks.yaml": (
        "stacks:\n  s:\n    description: t\n    arches: [all]\n    base_image: img\n"
        "    layers: [fa]\n"
    ),
    "dockerfiles/fa.Dockerfile": "FROM scratch\n",
}
LAYER = """
name: fa
description: t
follows: a test of the patch ledger
dockerfile: dockerfiles/fa.Dockerfile
source: {{repo: "{url}", ref: {ref}}}
patches: [patches/fa/rdna-list]
"""


@pytest.fixture
def world(tmp_path, scratch):
    """An upstream repository whose second commit lands the fix, mirrored where --offline looks,
    and a recipe tree whose layer patches the first commit."""
    up = tmp_path / "upstream"
    up.mkdir()
    git(up, "init", "-q")
    (up / "utils.py").write_bytes(BEFORE)
    git(up, "add", "-A")
    git(up, "commit", "-qm", "before")
    before = git(up, "rev-parse", "HEAD").stdout.decode().strip()
    (up / "utils.py").write_bytes(FIXED)
    git(up, "commit", "-qam", "upstream adds gfx1151")
    fixed = git(up, "rev-parse", "HEAD").stdout.decode().strip()
    offline = tmp_path / "offline"
    git(tmp_path, "clone", "-q", "--mirror", str(up), str(offline / "example.com/upstream/fa.git"))

    tree = tmp_path / "tree"
    for rel, text in RECIPES.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    (tree / "recipes/layers").mkdir()
    (tree / "recipes/layers/fa.yaml").write_text(LAYER.format(url=URL, ref=before))
    patch = diff_of(scratch, {"utils.py": BEFORE}, {"utils.py": FIXED})
    ledger = {
        "0001-change-1.patch": {
            "why": "is_rdna() lacks gfx1151",
            "upstream": ["https://example.com/upstream/pull/7"],
            "drop_if": [{"file": "utils.py", "contains": '"gfx1151"'}, {"commit": fixed}],
        }
    }
    make_series(tree / "patches", "fa", "rdna-list", [patch], extra={"ledger": ledger})
    return tree, offline, before, fixed


def _status(tree, offline, **kwargs):
    return patch_ledger.status(load_recipes(tree), Sources(offline), **kwargs)


def test_a_patch_whose_fix_is_not_upstream_at_the_pinned_ref_is_still_needed(world):
    tree, offline, before, _ = world
    [row] = _status(tree, offline)
    assert (row.patch, row.ref, row.status) == ("0001-change-1.patch", before, "still needed")
    assert any("lacks '\"gfx1151\"'" in e for e in row.evidence)
    assert row.why == "is_rdna() lacks gfx1151"


def test_a_patch_whose_fix_landed_at_the_ref_asked_about_is_droppable(world):
    tree, offline, _, fixed = world
    [row] = _status(tree, offline, ref=fixed)
    assert row.status == "droppable"
    assert any("contains '\"gfx1151\"'" in e for e in row.evidence)
    assert any(f"contains {fixed[:12]}" in e for e in row.evidence)


def test_the_cli_reports_a_patch_droppable_once_the_pin_moves_past_the_fix(world):
    tree, offline, before, fixed = world
    layer = tree / "recipes/layers/fa.yaml"
    layer.write_text(layer.read_text().replace(before, fixed))
    res = run_invoke(tree, "--search-root", str(REPO), "patches.ledger", "--offline", str(offline))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fa: 0001-change-1.patch at " + fixed[:12] + ": droppable" in res.stdout
    assert "https://example.com/upstream/pull/7" in res.stdout
    res = run_invoke(
        tree, "--search-root", str(REPO), "patches.ledger", "--offline", str(offline), "--json"
    )
    assert json.loads(res.stdout)[0]["status"] == "droppable"


def test_a_patch_without_a_ledger_entry_or_a_readable_upstream_is_unknown(world, tmp_path):
    tree, offline, _, _ = world
    [row] = _status(tree, tmp_path / "no-mirrors")
    assert row.status == "unknown"
    meta_path = tree / "patches/fa/rdna-list/series.json"
    meta = json.loads(meta_path.read_text())
    del meta["ledger"]
    meta_path.write_text(json.dumps(meta))
    [row] = _status(tree, offline)
    assert row.status == "unknown" and "no ledger entry" in row.evidence[0]


def test_a_malformed_drop_condition_is_an_error_naming_the_series_file(world):
    tree, offline, _, _ = world
    meta_path = tree / "patches/fa/rdna-list/series.json"
    meta = json.loads(meta_path.read_text())
    meta["ledger"]["0001-change-1.patch"]["drop_if"] = [{"file": "utils.py"}]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(UserError) as info:
        _status(tree, offline)
    assert str(meta_path) in info.value.message and "drop_if" in info.value.message


def test_every_shipped_patch_has_a_ledger_entry():
    recipes = load_recipes(REPO)
    for name, layer in recipes.layers.items():
        if layer.source is None:
            continue  # the cpu self-test series patches a wheel, not an upstream source
        for rel in layer.patches:
            entries = patch_ledger.read_ledger(Path(REPO, rel))
            patch_files = sorted(p.name for p in Path(REPO, rel).glob("*.patch"))
            assert sorted(entries) == patch_files, f"{name}: {rel}"
