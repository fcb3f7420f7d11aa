"""The series shipped in patches/: well-formed, and applying where they are meant to.

The real checks against upstream were made on real checkouts (see docs/patches.md); here a
reproduction made only of each patch's own context lines stands in for the upstream file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
from pathlib import Path

import pytest
from patch_helpers import tree_digest, write_files

from attnforge import patches

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches"
FIXTURES = Path(__file__).parent / "fixtures"
SHIPPED = sorted(p.parent for p in PATCHES.glob("*/*/series.json"))
FA_SERIES = PATCHES / "flash-attention" / "rdna35-arch-list"
SELFTEST = PATCHES / "selftest" / "cpu-demo"
TRITON_ERRORS_SHA256 = "f167e7b9128b1b9efc9a063a701037102aee54c7fd50b10a14d811709e888563"


@pytest.mark.parametrize("folder", SHIPPED, ids=[f"{p.parent.name}/{p.name}" for p in SHIPPED])
def test_shipped_series_load_and_record_what_they_were_checked_against(folder):
    series = patches.load_series(folder, component=folder.parent.name)

    assert series.summary and series.upstream_refs
    for patch in series.patches:
        assert series.checked_against[patch.name].strip()
    if series.component != "selftest":
        assert series.links, "a real fix links its upstream issue or PR"
        for patch in series.patches:
            assert re.fullmatch(r"[0-9a-f]{40}", series.checked_against[patch.name])


def test_the_flash_attention_series_pins_a_full_main_perf_commit():
    series = patches.load_series(FA_SERIES, "flash-attention")

    (ref,) = series.upstream_refs
    branch, sha = ref.split("@")
    assert branch == "main_perf" and re.fullmatch(r"[0-9a-f]{40}", sha)
    assert set(series.checked_against.values()) == {sha}


def _reproduction(tmp_path: Path, series: patches.Series) -> Path:
    """A tree holding, at each patched path, filler lines then each hunk's own preimage."""
    tree = tmp_path / "upstream"
    for patch in series.patches:
        (path,) = patch.files
        text, in_hunk = b"", False
        for line in patch.data.split(b"\n"):
            hunk = re.match(rb"@@ -(\d+)", line)
            if hunk:
                filler = int(hunk.group(1)) - 1 - text.count(b"\n")
                text += b"".join(b"# filler %d\n" % i for i in range(filler))
                in_hunk = True
            elif in_hunk and line[:1] in (b" ", b"-"):
                text += line[1:] + b"\n"
        write_files(tree, {path: text})
    return tree


def test_flash_attention_series_applies_to_a_reproduction_of_upstream_utils(tmp_path):
    series = [patches.load_series(FA_SERIES, "flash-attention")]
    tree = _reproduction(tmp_path, series[0])
    utils = tree / "flash_attn" / "flash_attn_triton_amd" / "utils.py"
    assert b'"gfx1102", "gfx1200", "gfx1201")' in utils.read_bytes()

    assert [r.action for r in patches.apply(series, tree)] == ["apply"]
    patched = utils.read_text()
    digest = tree_digest(tree)
    assert [r.action for r in patches.apply(series, tree)] == ["skip"]

    assert tree_digest(tree) == digest
    for arch in ("gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153", "gfx1100", "gfx1201"):
        assert f'"{arch}"' in patched
    # Still Python (the reproduction stops at the trailing context's "def ...:").
    compile(patched + "    pass\n", str(utils), "exec")


def _installed_triton_errors() -> Path | None:
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "errors.py"
    if hashlib.sha256(path.read_bytes()).hexdigest() != TRITON_ERRORS_SHA256:
        return None
    return path


@pytest.fixture
def site_packages(tmp_path: Path) -> Path:
    """A copy of the installed triton's errors.py (3.9.0, the cpu stack's; 3.6.0 has the same file),
    laid out as in site-packages."""
    source = _installed_triton_errors()
    if source is None:
        pytest.skip("needs triton 3.9.0 installed (the cpu stack's version)")
    target = tmp_path / "site-packages" / "triton" / "errors.py"
    target.parent.mkdir(parents=True)
    shutil.copy(source, target)
    return tmp_path / "site-packages"


def test_selftest_series_applies_to_the_installed_triton(site_packages):
    series = [patches.load_series(SELFTEST, "selftest")]

    assert [r.action for r in patches.apply(series, site_packages)] == ["apply"]
    assert [r.action for r in patches.apply(series, site_packages)] == ["skip"]
    text = (site_packages / "triton" / "errors.py").read_text()
    assert "attnforge in-build self-test" in text
    namespace: dict = {}
    exec(compile(text, "errors.py", "exec"), namespace)
    assert issubclass(namespace["TritonError"], Exception)


def test_conflicting_selftest_fixture_fails_with_the_clear_message(site_packages):
    before = tree_digest(site_packages)
    series = [patches.load_series(FIXTURES / "selftest-conflict", "selftest")]

    with pytest.raises(patches.PatchConflict) as info:
        patches.apply(series, site_packages)

    assert tree_digest(site_packages) == before
    message = str(info.value)
    assert "0001-selftest-conflict-in-triton-errors.patch" in message
    assert "file: triton/errors.py" in message and "hunk #1 (@@ -1,5 +1,6 @@)" in message
