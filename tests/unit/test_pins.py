"""pins.check: pins exist upstream, tags resolve to the recorded commits, wheels are served for
the arch and the Python, and the AOTriton chain agrees. Offline, against real git repositories
made here and index pages saved in the PEP 503 / PEP 691 formats (tests/pins/README.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from attnforge.pins import upstream as pins
from attnforge.recipes import load_recipes
from tests.conftest import REPO, run_invoke

FIXTURES = REPO / "tests" / "pins"
OTHER_SHA = "1234567890abcdef1234567890abcdef12345678"


def _git(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid",
         "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", "-c", "init.defaultBranch=main",
         *args],
        cwd=cwd, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout.strip()


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


@dataclass
class World:
    tree: Path  # a recipe tree (tests/pins/tree with the commits filled in)
    offline: Path  # git mirrors and saved index pages, in the docs/pins.md layout
    aotriton_0112b: str
    aotriton_012b: str
    pytorch_pinned: str

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.tree / rel
        text = path.read_text()
        assert old in text, f"{old!r} not in {rel}"
        path.write_text(text.replace(old, new, 1))

    def check(self, **kwargs) -> list[pins.Finding]:
        recipes = load_recipes(self.tree)
        pairs = pins.targets(recipes, None, None)
        kwargs.setdefault("digest_of", lambda ref: None)
        return pins.check(recipes, pairs, pins.Sources(self.offline), **kwargs)


def finding(findings: list[pins.Finding], pin: str, value: str = "") -> pins.Finding:
    matches = [f for f in findings if f.pin == pin and f.value.startswith(value)]
    assert len(matches) == 1, [f.pin for f in findings]
    return matches[0]


@pytest.fixture
def world(tmp_path: Path) -> World:
    offline = tmp_path / "offline"
    shutil.copytree(FIXTURES / "index", offline)
    up = FIXTURES / "upstream"

    # AOTriton as a plain clone at <offline>/github.com/ROCm/aotriton: 0.11.2b a lightweight tag,
    # 0.12b an annotated one (its tag object must be peeled to the commit).
    aot = offline / "github.com" / "ROCm" / "aotriton"
    aot.mkdir(parents=True)
    _git(aot, "init", "-q")
    a0112 = _commit(aot, {"v3src/util.cc": (up / "util-0.11.2b.cc").read_text()}, "0.11.2b")
    _git(aot, "tag", "0.11.2b")
    a012 = _commit(aot, {"v3src/util.cc": (up / "util-0.12b.cc").read_text()}, "0.12b")
    _git(aot, "tag", "-a", "0.12b", "-m", "AOTriton 0.12b")

    # PyTorch as a bare mirror at <offline>/github.com/pytorch/pytorch.git.
    work = tmp_path / "pytorch-work"
    work.mkdir()
    _git(work, "init", "-q")
    cmake = "cmake/External/aotriton.cmake"
    old = (up / "aotriton-0.11.2b.cmake").read_text().replace("@AOTRITON_0112B_COMMIT@", a0112)
    _commit(work, {cmake: old}, "v2.11.0")
    _git(work, "tag", "v2.11.0")
    new = (up / "aotriton-0.12b.cmake").read_text().replace("@AOTRITON_012B_COMMIT@", a012)
    pinned = _commit(work, {cmake: new}, "bump AOTriton to 0.12b")
    mirror = offline / "github.com" / "pytorch" / "pytorch.git"
    _git(tmp_path, "clone", "-q", "--mirror", str(work), str(mirror))

    tree = tmp_path / "tree"
    shutil.copytree(FIXTURES / "tree", tree)
    world = World(tree, offline, a0112, a012, pinned)
    world.edit("recipes/layers/aotriton.yaml", "@AOTRITON_COMMIT@", a012)
    world.edit("recipes/layers/pytorch-source.yaml", "@PYTORCH_COMMIT@", pinned)
    return world


# ------------------------------------------------------------------ a correct fixture passes


def test_a_correct_fixture_passes_with_every_pin_confirmed(world):
    found = world.check()
    assert not pins.failed(found)
    assert {f.status for f in found} == {"ok", "floating"}, [
        (f.pin, f.status, f.evidence) for f in found if f.status not in ("ok", "floating")
    ]
    assert [f.pin for f in found if f.status == "floating"] == ["base BASE_IMAGE"]
    # what was confirmed, and how
    assert "0.12b -> " + world.aotriton_012b[:12] in finding(found, "aotriton source.tag").evidence
    chain = finding(found, "pytorch-source -> AOTriton")
    assert chain.evidence == f"names AOTriton 0.12b at {world.aotriton_012b[:12]}"
    assert (
        "torch v2.11.0 pins AOTriton 0.11.2b"
        in finding(found, "pytorch-wheels -> AOTriton").evidence
    )
    device = finding(found, "pytorch-wheels TORCH_VERSION [device-gfx1151]")
    assert "amd_torch_device_gfx1151-2.11.0+rocm7.13.0-py3-none-linux_x86_64.whl" in device.evidence
    torch = finding(found, "pytorch-wheels TORCH_VERSION")
    assert "Python 3.12" in torch.evidence and "cp312" in torch.evidence  # ubuntu:24.04's Python
    assert sorted(torch.used_by) == ["gfx1151/wheels", "gfx942/wheels"]
    exp = finding(found, "arches.yaml gfx1151 aotriton.experimental", "0.11.2b")
    assert exp.value == "0.11.2b: experimental" and "gfx1151" in exp.evidence
    graduated = finding(found, "arches.yaml gfx1151 aotriton.experimental", "0.12b")
    assert graduated.value == "0.12b: not experimental" and "gfx1151" not in graduated.evidence


def test_the_cli_passes_on_the_fixture_and_prints_json(world):
    proc = run_invoke(
        world.tree, "--search-root", str(REPO), "pins.check", "--offline", str(world.offline),
        "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True
    assert sorted(report["plans"]) == [
        "gfx1151/source", "gfx1151/wheels", "gfx942/source", "gfx942/wheels",
    ]  # fmt: skip
    assert {f["status"] for f in report["findings"]} == {"ok", "floating"}


# ------------------------------------------------------------------ planted faults fail it


def test_a_commit_missing_from_its_repository_fails(world):
    world.edit("recipes/layers/pytorch-source.yaml", world.pytorch_pinned, OTHER_SHA)
    found = world.check()
    assert pins.failed(found)
    ref = finding(found, "pytorch-source SOURCE_REF")
    assert ref.status == "missing" and OTHER_SHA in ref.evidence
    # the chain cannot be read at a commit that does not exist: unknown, never ok
    assert finding(found, "pytorch-source -> AOTriton").status == "unknown"


def test_the_cli_exits_non_zero_and_names_the_missing_commit(world):
    world.edit("recipes/layers/pytorch-source.yaml", world.pytorch_pinned, OTHER_SHA)
    proc = run_invoke(
        world.tree, "--search-root", str(REPO), "pins.check", "--offline", str(world.offline),
        "--stack", "source", "--arch", "gfx942",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "missing" in proc.stdout and "pytorch-source SOURCE_REF" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_wheel_version_the_index_does_not_serve_fails(world):
    world.edit("recipes/layers/rocm-sdk.yaml", '"7.13.0"', '"7.13.1"')
    found = world.check()
    assert pins.failed(found)
    assert finding(found, "rocm-sdk ROCM_VERSION").status == "missing"  # rocm itself
    for arch in ("gfx1151", "gfx942"):  # and the device package of each arch's extra
        dev = finding(found, f"rocm-sdk ROCM_VERSION [device-{arch}]")
        assert dev.status == "missing" and f"rocm-sdk-device-{arch}==7.13.1" in dev.evidence


def test_a_device_package_missing_for_one_arch_fails_only_that_arch(world):
    page = world.offline / "repo.amd.com/rocm/whl-multi-arch/amd-torch-device-gfx942/index.json"
    data = json.loads(page.read_text())
    data["files"] = []
    page.write_text(json.dumps(data))
    found = world.check()
    assert finding(found, "pytorch-wheels TORCH_VERSION [device-gfx942]").status == "missing"
    assert finding(found, "pytorch-wheels TORCH_VERSION [device-gfx1151]").status == "ok"


def test_a_wheel_served_only_for_other_pythons_is_a_mismatch(world):
    found = world.check(python="3.11")  # the fixture's torch wheels are cp312 and cp313 only
    torch = finding(found, "pytorch-wheels TORCH_VERSION")
    assert torch.status == "mismatch" and "cp312" in torch.evidence
    # py3-none wheels serve any Python 3
    assert finding(found, "pytorch-wheels TORCH_VERSION [device-gfx1151]").status == "ok"


def test_aotriton_built_at_another_commit_than_pytorch_pins_fails(world):
    world.edit("recipes/layers/aotriton.yaml", world.aotriton_012b, world.aotriton_0112b)
    found = world.check()
    chain = finding(found, "pytorch-source -> AOTriton")
    assert chain.status == "mismatch"
    assert f"PyTorch pins AOTriton {world.aotriton_012b}" in chain.evidence
    assert f"the aotriton layer builds {world.aotriton_0112b}" in chain.evidence
    tag = finding(found, "aotriton source.tag")  # the tag no longer names the recorded commit
    assert tag.status == "mismatch" and world.aotriton_012b in tag.evidence


def test_a_pytorch_commit_that_names_another_aotriton_version_fails(world):
    world.edit("recipes/layers/pytorch-source.yaml", 'aotriton: "0.12b"', 'aotriton: "0.11.2b"')
    found = world.check()
    chain = finding(found, "pytorch-source -> AOTriton")
    assert chain.status == "mismatch"
    assert "PyTorch names AOTriton 0.12b, the recipe says 0.11.2b" in chain.evidence


def test_a_torch_wheel_said_to_bundle_another_aotriton_fails(world):
    world.edit("recipes/layers/pytorch-wheels.yaml", 'aotriton: "0.11.2b"', 'aotriton: "0.12b"')
    found = world.check()
    chain = finding(found, "pytorch-wheels -> AOTriton")
    assert chain.status == "mismatch" and "torch v2.11.0 pins AOTriton 0.11.2b" in chain.evidence


def test_an_experimental_fact_upstream_contradicts_fails(world):
    world.edit(
        "recipes/arches.yaml",
        'experimental: ["0.10b", "0.11b", "0.11.1b", "0.11.2b"]',
        'experimental: ["0.10b", "0.11b", "0.11.1b"]',
    )
    found = world.check()
    exp = finding(found, "arches.yaml gfx1151 aotriton.experimental", "0.11.2b")
    assert exp.status == "mismatch" and "gfx1151" in exp.evidence  # upstream lists it
    assert pins.failed(found)


def test_a_missing_tag_fails(world):
    world.edit("recipes/layers/aotriton.yaml", 'tag: "0.12b"', 'tag: "0.12.1b"')
    tag = finding(world.check(), "aotriton source.tag")
    assert tag.status == "missing" and "no tag 0.12.1b" in tag.evidence


# ------------------------------------------------------------------ unknown is never ok


def test_an_unreadable_source_is_unknown_and_does_not_pass_as_ok(world):
    shutil.rmtree(world.offline / "github.com" / "ROCm" / "aotriton")
    (world.offline / "repo.amd.com/rocm/whl-multi-arch/torch/index.json").unlink()
    found = world.check()
    for pin in (
        "aotriton SOURCE_REF",
        "aotriton source.tag",
        "arches.yaml gfx942 aotriton.experimental",
        "pytorch-wheels TORCH_VERSION",
    ):
        f = [x for x in found if x.pin == pin][0]
        assert f.status == "unknown", (pin, f.status, f.evidence)
        assert "no mirror" in f.evidence or "no saved page" in f.evidence
    assert not pins.failed(found)  # unknown is reported, not a failure


def test_a_moving_base_image_is_a_warning_with_the_digest_to_pin(world):
    digest = "ubuntu@sha256:" + "a" * 64
    found = world.check(digest_of=lambda ref: digest if ref == "ubuntu:24.04" else None)
    base = finding(found, "base BASE_IMAGE")
    assert base.status == "floating" and f"pin to {digest}" in base.evidence
    assert not pins.failed(found)


# ------------------------------------------------------------------ the readers


def test_pep503_html_and_pep691_json_pages_list_the_same_files():
    # The same project page in both formats of the simple repository API: PEP 503 HTML (one <a>
    # per file; data-requires-python, and PEP 592's data-yanked) and PEP 691 JSON
    # (https://peps.python.org/pep-0503/, https://peps.python.org/pep-0691/).
    html = """<!DOCTYPE html><html><body>
    <a href="../../files/torch-2.11.0%2Brocm7.13.0-cp312-cp312-linux_x86_64.whl#sha256=00"
       data-requires-python="&gt;=3.10">torch-2.11.0+rocm7.13.0-cp312-cp312-linux_x86_64.whl</a>
    <a href="torch-2.10.0-cp312-cp312-linux_x86_64.whl" data-yanked="">torch-2.10.0-cp312-cp312-linux_x86_64.whl</a>
    </body></html>"""
    js = json.dumps({
        "meta": {"api-version": "1.0"}, "name": "torch",
        "files": [
            {"filename": "torch-2.11.0+rocm7.13.0-cp312-cp312-linux_x86_64.whl", "url": "x",
             "hashes": {}, "requires-python": ">=3.10"},
            {"filename": "torch-2.10.0-cp312-cp312-linux_x86_64.whl", "url": "y", "hashes": {},
             "yanked": "broken"},
        ],
    })  # fmt: skip
    from_html = pins.parse_index_page(html, "text/html")
    from_json = pins.parse_index_page(js, "application/vnd.pypi.simple.v1+json")
    assert from_html == from_json
    assert from_json[0].requires_python == ">=3.10" and from_json[1].yanked


@pytest.mark.parametrize(
    ("version", "python", "fits"),
    [
        ("2.11.0+rocm7.13.0", "3.12", True),
        ("2.11.0", "3.12", True),  # PEP 440: ==2.11.0 matches any local version of it
        ("2.11.0+rocm7.12.0", "3.12", False),
        ("2.11.0+rocm7.13.0", "3.9", False),  # requires-python >=3.10
        ("2.11.0+rocm7.13.0", "3.13", False),  # a cp312 wheel
    ],
)
def test_a_wheel_fits_by_version_python_tag_and_requires_python(version, python, fits):
    files = [pins.DistFile("torch-2.11.0+rocm7.13.0-cp312-cp312-linux_x86_64.whl", ">=3.10", False)]
    ok, _ = pins.match_files(files, "torch", version, python)
    assert bool(ok) == fits


@pytest.mark.parametrize(
    ("name", "arches"),
    [("util-0.11.2b.cc", {"gfx950", "gfx1151", "gfx1201"}), ("util-0.12b.cc", {"gfx950"})],
)
def test_experimental_arches_are_read_from_both_shapes_of_util_cc(name, arches):
    assert pins.experimental_arches((FIXTURES / "upstream" / name).read_text()) == arches


def test_experimental_arches_is_none_without_the_function():
    assert pins.experimental_arches("int getMultiProcessorCount() {\n  return 40;\n}\n") is None


def test_online_git_reads_a_repository_over_its_url_without_a_full_clone(tmp_path):
    """The online path (ls-remote, a shallow blob-less fetch of one commit, a lazy blob), run
    against a file:// URL so no network is needed."""
    src = tmp_path / "src"
    src.mkdir()
    _git(src, "init", "-q")
    first = _commit(src, {"a.txt": "one\n"}, "one")
    _git(src, "tag", "-a", "v1", "-m", "v1")
    _commit(src, {"a.txt": "two\n"}, "two")
    repo = pins.GitRepo(f"file://{src}", tmp_path / "cache" / "src.git", online=True)
    assert repo.tags() == {"v1": first}
    assert repo.has_commit(first)
    assert repo.show(first, "a.txt") == "one\n" and repo.show(first, "b.txt") is None
    assert not repo.has_commit(OTHER_SHA)
    gone = pins.GitRepo(f"file://{tmp_path}/nowhere", tmp_path / "cache" / "x.git", online=True)
    with pytest.raises(pins.Unavailable):
        gone.has_commit(OTHER_SHA)


def test_offline_layout_maps_a_url_to_host_and_path():
    assert pins.url_path("https://github.com/ROCm/aotriton.git") == Path(
        "github.com/ROCm/aotriton.git"
    )
    assert pins.url_path("https://repo.amd.com/rocm/whl-multi-arch/torch/") == Path(
        "repo.amd.com/rocm/whl-multi-arch/torch"
    )


# ------------------------------------------------------------------ issue 26: index facts


def test_a_pin_with_a_legacy_a0_the_index_dropped_names_the_served_version(world):
    # AMD's docs said torchvision 0.29.0a0+rocm10.1.0 at one commit and 0.29+rocm10.1.0 at a
    # later one; PEP 440 tells them apart, so the pin must be what the index serves
    world.edit("recipes/layers/pytorch-wheels.yaml", '"2.11.0+rocm7.13.0"', '"2.11.0a0+rocm7.13.0"')
    torch = finding(world.check(), "pytorch-wheels TORCH_VERSION")
    assert torch.status == "missing"
    assert "serves torch==2.11.0+rocm7.13.0" in torch.evidence and "legacy a0" in torch.evidence


def test_a_frozen_per_family_index_is_rejected_with_the_reason(world):
    world.edit(
        "recipes/layers/pytorch-wheels.yaml",
        "https://repo.amd.com/rocm/whl-multi-arch/",
        "https://repo.amd.com/rocm/whl/gfx1151/",
    )
    found = world.check()
    assert pins.failed(found)
    frozen = finding(found, "pytorch-wheels index")
    assert frozen.status == "mismatch" and frozen.value == "https://repo.amd.com/rocm/whl/gfx1151/"
    assert "frozen at ROCm 7.13.0" in frozen.evidence and "rocm-cli#271" in frozen.evidence
    # its wheels are not looked up on it
    assert not [f for f in found if "whl/gfx1151" in f.source and f.pin != "pytorch-wheels index"]


# ------------------------------------------------------------------ pytorch.org's ROCm index

ORG_LAYER = """\
name: pytorch-org
description: torch and torchvision from pytorch.org's ROCm index, rocm pinned beside them
dockerfile: dockerfiles/layer.Dockerfile
follows: nothing upstream (a test fixture)
arches: [vendor:amd]
provides: [torch]
needs: [python]
wheelhouse: true
aotriton: "0.12b"
args:
  AOTRITON_EXPERIMENTAL: "{aotriton_experimental}"
hint_args:
  TORCH_INDEX_URL: https://download.pytorch.org/whl/rocm7.14
pins:
"""


def _with_org(world: World, **pins_: str) -> list[pins.Finding]:
    """The fixture tree plus a pytorch-org layer pinned like the shipped one (or `pins_`), on
    the saved download.pytorch.org/whl/rocm7.14 pages; PyTorch's mirror gains tag v2.14.1."""
    shipped = load_recipes(REPO).layers["pytorch-org"].pins
    values = {**shipped, **pins_}
    text = ORG_LAYER + "".join(f'  {k}: "{v}"\n' for k, v in values.items())
    (world.tree / "recipes/layers/pytorch-org.yaml").write_text(text)
    with (world.tree / "recipes/stacks.yaml").open("a") as f:
        f.write(
            "  org:\n    description: pytorch.org's ROCm wheels\n    arches: [vendor:amd]\n"
            "    base_image: ubuntu:24.04\n    layers: [base, pytorch-org]\n"
        )
    mirror = world.offline / "github.com" / "pytorch" / "pytorch.git"
    _git(mirror, "tag", "-f", "v2.14.1", world.pytorch_pinned)  # names AOTriton 0.12b
    recipes = load_recipes(world.tree)
    return pins.check(
        recipes, pins.targets(recipes, "gfx1151", "org"), pins.Sources(world.offline),
        digest_of=lambda ref: None,
    )  # fmt: skip


def test_the_pytorch_org_pins_are_checked_on_its_index_without_device_packages(world):
    found = _with_org(world)
    assert not pins.failed(found), [(f.pin, f.status, f.evidence) for f in found]
    torch = finding(found, "pytorch-org TORCH_VERSION")
    assert torch.status == "ok" and "torch-2.14.1+rocm7.14-cp312-cp312" in torch.evidence
    assert torch.source == "https://download.pytorch.org/whl/rocm7.14/torch/"
    assert finding(found, "pytorch-org TORCHVISION_VERSION").status == "ok"
    rocm = finding(found, "pytorch-org ROCM_VERSION")
    assert rocm.status == "ok" and "rocm-7.14.0.post1.tar.gz" in rocm.evidence
    # pytorch.org's torch has no [device-<arch>] extra: no device package is looked up
    assert not [f for f in found if "[device-" in f.pin]
    chain = finding(found, "pytorch-org -> AOTriton")
    assert chain.status == "ok" and "torch v2.14.1 pins AOTriton 0.12b" in chain.evidence


def test_a_pytorch_org_pin_its_index_does_not_serve_fails(world):
    found = _with_org(world, ROCM_VERSION="7.14.2", TORCH_VERSION="2.14.1+rocm7.14.0")
    assert pins.failed(found)
    assert finding(found, "pytorch-org ROCM_VERSION").status == "missing"
    # the label is the ROCm minor on this index: +rocm7.14.0 is another version to PEP 440
    torch = finding(found, "pytorch-org TORCH_VERSION")
    assert torch.status == "missing" and "serves no torch==2.14.1+rocm7.14.0" in torch.evidence
