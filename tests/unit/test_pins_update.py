"""pins.update: the newest complete set of pins a channel's index serves, as a diff of the
recipes (stable) or --set flags (nightly); never a file written, never a guess. Offline against
index pages saved in the PEP 503 / PEP 691 formats (tests/pins/update/README.md), and once over
HTTP from a server on 127.0.0.1 serving the same pages."""

from __future__ import annotations

import hashlib
import http.server
import json
import shutil
import socket
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from attnforge.errors import UserError
from attnforge.pins import update as pins_update
from attnforge.pins import upstream as pins
from attnforge.recipes import load_recipes
from tests.conftest import REPO, outputs_env
from tests.unit.conftest import pins_update_cmd as update
from tests.unit.conftest import propose, proposed

STABLE = "stable.repo.amd.com/rocm/whl-next"
NIGHTLY = "nightly.repo.amd.com/rocm/whl-next"

# What the fixture's stable index proposes for the fixture tree (ROCm 10.0.0 pinned today) on
# ubuntu:24.04's Python 3.12 and gfx1151: only the quoted values of the stable blocks change.
STABLE_DIFF = """\
--- a/recipes/layers/rocm-sdk.yaml
+++ b/recipes/layers/rocm-sdk.yaml
@@ -13,7 +13,7 @@
     hint_args:
       ROCM_INDEX_URL: https://stable.repo.amd.com/rocm/whl-next/
     pins:
-      ROCM_VERSION: "10.0.0"  # the stable release
+      ROCM_VERSION: "10.1.0"  # the stable release
   nightly:
     hint_args:
       ROCM_INDEX_URL: https://nightly.repo.amd.com/rocm/whl-next/
--- a/recipes/layers/pytorch-wheels.yaml
+++ b/recipes/layers/pytorch-wheels.yaml
@@ -16,11 +16,11 @@
     hint_args:
       ROCM_INDEX_URL: https://stable.repo.amd.com/rocm/whl-next/
     pins:
-      TORCH_VERSION: "2.13.0+rocm10.0.0"
-      TORCHVISION_VERSION: '0.28.0+rocm10.0.0'
-      TORCHAUDIO_VERSION: "2.11.0.2+rocm10.0.0"
+      TORCH_VERSION: "2.14.0+rocm10.1.0"
+      TORCHVISION_VERSION: '0.29.0a0+rocm10.1.0'
+      TORCHAUDIO_VERSION: "2.11.0.3+rocm10.1.0"
     expect:
-      torch.version: "2.13.0+rocm10.0.0"
+      torch.version: "2.14.0+rocm10.1.0"
   nightly:
     aotriton: "0.12b"
     hint_args:
"""

NIGHTLY_COMMAND = """\
invoke build --stack nightly --arch gfx1151 \\
    --set rocm-sdk.ROCM_VERSION=10.2.0a20261119 \\
    --set pytorch-wheels.TORCH_VERSION=2.15.0a0+rocm10.2.0a20261119 \\
    --set pytorch-wheels.TORCHVISION_VERSION=0.30.0a0+rocm10.2.0a20261119 \\
    --set pytorch-wheels.TORCHAUDIO_VERSION=2.11.0a0+rocm10.2.0a20261119
"""


def drop_files(offline: Path, page: str, needle: str) -> None:
    """Remove a project page's files whose name contains `needle` (a PEP 691 JSON page)."""
    path = offline / page / "index.json"
    data = json.loads(path.read_text())
    data["files"] = [f for f in data["files"] if needle not in f["filename"]]
    path.write_text(json.dumps(data))


# ------------------------------------------------------------------ stable


def test_stable_prints_the_diff_of_the_stable_blocks_to_the_newest_release(tree, offline):
    proc = update(tree, "--channel", "stable", "--offline", str(offline))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == STABLE_DIFF  # stdout is the patch alone
    err = proc.stderr
    assert "newest complete release: ROCm 10.1.0" in err
    assert "pytorch-wheels.TORCH_VERSION: 2.13.0+rocm10.0.0 -> 2.14.0+rocm10.1.0" in err
    assert "not releases, so not proposed: ROCm 10.2.0rc1" in err
    # two torchvision builds carry +rocm10.1.0: the newest is proposed and the doubt is said
    assert "ambiguous: torchvision has 2 builds for +rocm10.1.0 (0.28.0+rocm10.1.0" in err
    # what the index cannot tell is left to a person, with the expect line spelled out
    assert (
        're-check the AOTriton torch 2.14.0+rocm10.1.0 bundles: the stable variant says aotriton: "0.12b"'
        in err
    )  # noqa: E501
    assert "invoke pins.check --stack default" in err
    assert 'expect torch.version: "2.13.0+rocm10.0.0" -> "2.14.0+rocm10.1.0"' in err
    assert "Traceback" not in err


def test_the_diff_applies_and_the_edited_recipes_load_with_the_new_pins_and_comments(
    tree, offline, tmp_path
):
    proc = update(tree, "--channel", "stable", "--offline", str(offline))
    patch = tmp_path / "stable.diff"
    patch.write_text(proc.stdout)
    subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True, capture_output=True)
    recipes = load_recipes(tree)
    stable = recipes.layers["pytorch-wheels"].variants["stable"]
    assert stable.pins == {
        "TORCH_VERSION": "2.14.0+rocm10.1.0",
        "TORCHVISION_VERSION": "0.29.0a0+rocm10.1.0",
        "TORCHAUDIO_VERSION": "2.11.0.3+rocm10.1.0",
    }
    assert stable.expect == {"torch.version": "2.14.0+rocm10.1.0"}
    assert stable.aotriton == "0.12b"  # left for a person (and pins.check) to re-check
    assert recipes.layers["rocm-sdk"].variants["stable"].pins == {"ROCM_VERSION": "10.1.0"}
    text = (tree / "recipes/layers/rocm-sdk.yaml").read_text()
    assert "# ROCm 10.0.0: this comment must survive pins.update's edit." in text
    # and now there is nothing left to propose
    again = update(tree, "--channel", "stable", "--offline", str(offline))
    assert again.returncode == 0 and again.stdout == "stable pins are current\n"


def test_rocm_7_14_does_not_win_although_pep440_sorts_its_builds_higher(tree, offline):
    # The trap of ROCm/TheRock#7183: PEP 440 compares the alphanumeric local segment "rocm7" with
    # "rocm10" as a string, so a 7.14 build of the same public version sorts above the 10.x one.
    assert Version("2.14.0+rocm7.14.0") > Version("2.14.0+rocm10.1.0")
    # The fixture holds the trap: of the torch==2.14.0 builds on its page, PEP 440 order (pip's
    # choice for `torch==2.14.0`) puts the 7.14 one on top.
    page = pins.IndexSource(offline).files(f"https://{STABLE}/", "torch")
    builds = [v for v in pins_update.by_version(page, "torch") if v.public == "2.14.0"]
    assert max(builds) == Version("2.14.0+rocm7.14.0")
    proposal = propose(tree, offline, "stable")
    assert proposal.rocm == "10.1.0"
    assert proposed(proposal) == {
        "ROCM_VERSION": "10.1.0",
        "TORCH_VERSION": "2.14.0+rocm10.1.0",
        "TORCHVISION_VERSION": "0.29.0a0+rocm10.1.0",
        "TORCHAUDIO_VERSION": "2.11.0.3+rocm10.1.0",
    }


@pytest.mark.parametrize(
    ("kwargs", "torch"),
    [
        ({}, "2.14.0+rocm10.1.0"),  # 2.14.1 is cp313-only, 2.14.2 lacks a gfx1151 device wheel
        ({"python": "3.13"}, "2.14.1+rocm10.1.0"),
        ({"arch": "gfx942"}, "2.14.2+rocm10.1.0"),  # gfx942's device page has 2.14.2
    ],
)
def test_only_builds_for_the_python_and_the_arch_device_package_count(tree, offline, kwargs, torch):
    proposal = propose(tree, offline, "stable", **kwargs)
    assert proposed(proposal)["TORCH_VERSION"] == torch
    # 2.14.3+rocm10.1.0 is newer, fits cp312 and has device wheels, but it is yanked (PEP 592)
    assert all(p.proposed != "2.14.3+rocm10.1.0" for p in proposal.picks)


def test_a_newest_release_without_torchaudio_falls_back_and_says_why(tree, offline):
    drop_files(offline, f"{STABLE}/torchaudio", "rocm10.1.0")
    proc = update(tree, "--channel", "stable", "--offline", str(offline))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "stable pins are current\n"  # the tree pins 10.0.0 already
    assert "newer releases skipped: ROCm 10.1.0: no torchaudio +rocm10.1.0" in proc.stderr, (
        proc.stderr
    )


def test_no_complete_release_is_an_error_not_a_guess(tree, offline):
    for label in ("rocm10.1.0", "rocm10.0.0", "rocm7.14.0"):
        drop_files(offline, f"{STABLE}/torchaudio", label)
    proc = update(tree, "--channel", "stable", "--offline", str(offline))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith(
        f"error: the stable index https://{STABLE}/ has no ROCm release with rocm, torch, "
        "torchvision, torchaudio for Python 3.12 and gfx1151's device packages (ROCm 10.1.0: no "
        "torchaudio +rocm10.1.0;"
    ), proc.stderr


def test_stable_json_carries_the_pins_the_diff_and_the_expect_change(tree, offline):
    proc = update(tree, "--channel", "stable", "--offline", str(offline), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["current"] is False and report["diff"] == STABLE_DIFF
    assert report["rocm"] == "10.1.0" and report["python"] == "3.12"
    assert report["expect"] == {
        "torch.version": {"current": "2.13.0+rocm10.0.0", "proposed": "2.14.0+rocm10.1.0"}
    }
    torch = next(p for p in report["pins"] if p["key"] == "TORCH_VERSION")
    assert torch == {
        "layer": "pytorch-wheels",
        "key": "TORCH_VERSION",
        "project": "torch",
        "current": "2.13.0+rocm10.0.0",
        "proposed": "2.14.0+rocm10.1.0",
        "file": "torch-2.14.0+rocm10.1.0-cp312-cp312-linux_x86_64.whl",
    }
    assert any("AOTriton" in r for r in report["reminders"])


def test_the_real_recipes_stable_blocks_are_editable_line_by_line(tmp_path):
    """The shape the edit relies on holds in the checkout's recipes: each stable pin and the
    expect line is one `KEY: "value"` line, and the edited text loads with the new values."""
    recipes = load_recipes(REPO)
    for layer, section, keys in (
        ("rocm-sdk", "pins", ["ROCM_VERSION"]),
        ("pytorch-wheels", "pins", ["TORCH_VERSION", "TORCHVISION_VERSION", "TORCHAUDIO_VERSION"]),
        ("pytorch-wheels", "expect", ["torch.version"]),
    ):
        rel = recipes.layer_files[layer]
        copy = tmp_path / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, copy)
        changes = {(section, key): f"99.{i}.0+rocm99.0.0" for i, key in enumerate(keys)}
        old, new = pins_update.edit_variant(copy, rel, "stable", changes)
        changed = [a for a, b in zip(old.splitlines(), new.splitlines(), strict=True) if a != b]
        assert len(changed) == len(keys), changed


# ------------------------------------------------------------------ nightly


def test_nightly_prints_the_set_flags_of_the_newest_complete_date(tree, offline):
    proc = update(tree, "--channel", "nightly", "--offline", str(offline))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == NIGHTLY_COMMAND
    # 20261120 has rocm, torch and torchvision but no torchaudio: the day before wins
    assert (
        "newer nightlies skipped: ROCm 10.2.0a20261120: no torchaudio +rocm10.2.0a20261120"
        in proc.stderr
    )
    # the fixture has no `rocm` page on the nightly index: the version came from rocm-sdk-core
    assert "(rocm_sdk_core-10.2.0a20261119-py3-none-linux_x86_64.whl)" in proc.stderr


def test_nightly_json_has_the_flags_and_the_command(tree, offline):
    proc = update(tree, "--channel", "nightly", "--offline", str(offline), "--json")
    report = json.loads(proc.stdout)
    assert report["set"] == [
        "--set rocm-sdk.ROCM_VERSION=10.2.0a20261119",
        "--set pytorch-wheels.TORCH_VERSION=2.15.0a0+rocm10.2.0a20261119",
        "--set pytorch-wheels.TORCHVISION_VERSION=0.30.0a0+rocm10.2.0a20261119",
        "--set pytorch-wheels.TORCHAUDIO_VERSION=2.11.0a0+rocm10.2.0a20261119",
    ]
    assert report["command"] == " ".join(
        ["invoke build --stack nightly --arch gfx1151", *report["set"]]
    )


def test_the_nightly_flags_are_accepted_by_the_build_planner(tree, offline):
    """The flags name settings `invoke build --set` knows, with values its pin check accepts."""
    from attnforge.plan import parse_overrides

    proposal = propose(tree, offline, "nightly")
    items = [flag.removeprefix("--set ") for flag in proposal.set_flags]
    assert parse_overrides(items, load_recipes(tree)) == {
        "rocm-sdk": {"ROCM_VERSION": "10.2.0a20261119"},
        "pytorch-wheels": {
            "TORCH_VERSION": "2.15.0a0+rocm10.2.0a20261119",
            "TORCHVISION_VERSION": "0.30.0a0+rocm10.2.0a20261119",
            "TORCHAUDIO_VERSION": "2.11.0a0+rocm10.2.0a20261119",
        },
    }


def test_an_arch_without_device_pages_is_not_held_back_and_says_so(tree, offline):
    proposal = propose(tree, offline, "nightly", arch="gfx942")  # no gfx942 pages were saved
    assert proposal.rocm == "10.2.0a20261119"
    assert any("amd-torch-device-gfx942 is not saved" in n for n in proposal.notes)


# ------------------------------------------------------------------ nothing written, no guesses


def _snapshot(*roots: Path) -> dict[str, str]:
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for root in roots
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_pins_update_writes_no_file(tree, offline, tmp_path):
    outputs = tmp_path / "outputs"
    env = outputs_env(outputs)
    before = _snapshot(tree, offline)
    for channel in ("stable", "nightly"):
        for extra in ([], ["--json"]):
            proc = update(tree, "--channel", channel, "--offline", str(offline), *extra, env=env)
            assert proc.returncode == 0, proc.stderr
    assert _snapshot(tree, offline) == before
    assert not outputs.exists()  # no build folder, no reports, no cache


def test_a_page_missing_from_the_offline_folder_is_a_one_sentence_error(tree, offline):
    (offline / STABLE / "torchvision" / "index.html").unlink()
    proc = update(tree, "--channel", "stable", "--offline", str(offline))
    assert proc.returncode == 2
    assert proc.stdout == ""
    first = proc.stderr.splitlines()[0]
    assert first.startswith("error: cannot read the stable index, so nothing is proposed: ")
    assert "torchvision/index.json or index.html" in first
    assert "Traceback" not in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _point_at(tree: Path, base: str) -> None:
    """The tree's channel indexes at `base` + host/path, for a server on 127.0.0.1."""
    for rel in ("recipes/layers/rocm-sdk.yaml", "recipes/layers/pytorch-wheels.yaml",
                "recipes/layers/pytorch-org.yaml"):  # fmt: skip
        path = tree / rel
        if path.exists():
            path.write_text(path.read_text().replace("https://", base))


def test_an_unreachable_index_is_an_error_with_exit_2(tree):
    _point_at(tree, f"http://127.0.0.1:{_free_port()}/")  # nothing listens there
    proc = update(tree, "--channel", "stable")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith(
        "error: cannot read the stable index, so nothing is proposed: GET"
    )
    assert "hint: " in proc.stderr and "--offline DIR" in proc.stderr
    assert "Traceback" not in proc.stderr


class _SimpleIndex(http.server.BaseHTTPRequestHandler):
    """Serves saved pages as an index would: PEP 691 JSON or PEP 503 HTML by the page saved, 404
    for a project with no page."""

    root: Path

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.endswith(".metadata"):  # PEP 658, beside the wheel's URL
            return self._metadata()
        folder = self.root / self.path.strip("/")
        for name, ctype in (
            ("index.json", "application/vnd.pypi.simple.v1+json"),
            ("index.html", "text/html"),
        ):
            if (folder / name).is_file():
                body = (folder / name).read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
        self.send_error(404)

    def _metadata(self) -> None:
        """`/whl/rocm7.14/<wheel>.metadata`: saved beside the project's page (pytorch.org's
        wheels sit in the index folder itself, their pages one folder down). The page's
        absolute hrefs drop the host folder the saved pages are served under: any host's."""
        folder, _, name = urllib.parse.unquote(self.path.strip("/")).rpartition("/")
        rel = f"{folder}/{name.split('-', 1)[0]}/{name}"
        saved = next((p for p in (self.root / rel, *self.root.glob(f"*/{rel}")) if p.is_file()),
                     None)  # fmt: skip
        if saved is None:
            return self.send_error(404)
        body = saved.read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(offline: Path) -> Iterator[str]:
    handler = type("Handler", (_SimpleIndex,), {"root": offline})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_online_over_http_proposes_what_offline_does(org_tree, offline, server):
    tree = org_tree  # with a pytorch-org layer, so every channel is asked
    expected = {ch: proposed(propose(tree, offline, ch)) for ch in pins_update.CHANNELS}
    _point_at(tree, server)
    recipes = load_recipes(tree)
    for channel in pins_update.CHANNELS:
        proposal = pins_update.propose(recipes, channel, pins.IndexSource(None))
        assert proposed(proposal) == expected[channel]
    # a 404 page (no gfx942 device packages on the nightly index) is "no page", not an error
    gfx942 = pins_update.propose(recipes, "nightly", pins.IndexSource(None), arch="gfx942")
    assert "the index has no amd-torch-device-gfx942 page: not checked" in gfx942.notes


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "error: --channel (not given): expected one of stable, nightly, pytorch-org"),
        (
            ["--channel", "beta"],
            "error: --channel beta: expected one of stable, nightly, pytorch-org",
        ),
        (["--channel", "stable", "--python", "py3"], "error: --python 'py3': expected"),
        (["--channel", "stable", "--arch", "gfx0"], "error: unknown arch 'gfx0'"),
    ],
)
def test_bad_arguments_are_one_sentence(tree, offline, args, message):
    proc = update(tree, *args, "--offline", str(offline))
    assert proc.returncode == 2
    assert proc.stderr.startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_channel_no_stack_uses_is_an_error(tree, offline):
    path = tree / "recipes" / "stacks.yaml"
    text = path.read_text()
    path.write_text(text[: text.index("  nightly:")])  # the nightly variants stay, unused
    with pytest.raises(
        UserError, match="no stack in recipes/stacks.yaml uses pytorch-wheels:nightly"
    ):
        propose(tree, offline, "nightly")


# ------------------------------------------------------------------ pytorch.org's ROCm index

ORG_PAGES = REPO / "tests" / "pins" / "index" / "download.pytorch.org"
ORG_LAYER = """\
name: pytorch-org
description: torch and torchvision from pytorch.org's ROCm index, rocm pinned beside them
dockerfile: dockerfiles/layer.Dockerfile
follows: nothing upstream (a test fixture)
arches: [vendor:amd]
provides: [torch]
needs: [python]
aotriton: "0.12b"
hint_args:
  TORCH_INDEX_URL: https://download.pytorch.org/whl/rocm7.14
pins:
  TORCH_VERSION: "2.14.0+rocm7.14"
  TORCHVISION_VERSION: "0.29.0+rocm7.14"
  ROCM_VERSION: "7.14.0"  # 7.14.0 requires itself
expect:
  torch.version: "2.14.0+rocm7.14"
"""

ORG_DIFF = """\
--- a/recipes/layers/pytorch-org.yaml
+++ b/recipes/layers/pytorch-org.yaml
@@ -9,8 +9,8 @@
 hint_args:
   TORCH_INDEX_URL: https://download.pytorch.org/whl/rocm7.14
 pins:
-  TORCH_VERSION: "2.14.0+rocm7.14"
-  TORCHVISION_VERSION: "0.29.0+rocm7.14"
-  ROCM_VERSION: "7.14.0"  # 7.14.0 requires itself
+  TORCH_VERSION: "2.14.1+rocm7.14"
+  TORCHVISION_VERSION: "0.29.2+rocm7.14"
+  ROCM_VERSION: "7.14.0.post1"  # 7.14.0 requires itself
 expect:
-  torch.version: "2.14.0+rocm7.14"
+  torch.version: "2.14.1+rocm7.14"
"""


@pytest.fixture
def org_tree(tree: Path, offline: Path) -> Path:
    (tree / "recipes/layers/pytorch-org.yaml").write_text(ORG_LAYER)
    with (tree / "recipes/stacks.yaml").open("a") as f:
        f.write(
            "  org:\n    description: pytorch.org's ROCm wheels\n    arches: [vendor:amd]\n"
            "    base_image: ubuntu:24.04\n    layers: [base, pytorch-org]\n"
        )
    shutil.copytree(ORG_PAGES, offline / "download.pytorch.org")
    return tree


def test_pytorch_org_prints_the_diff_of_the_layers_pins(org_tree, offline):
    proc = update(org_tree, "--channel", "pytorch-org", "--offline", str(offline))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ORG_DIFF
    err = proc.stderr
    assert "newest complete release: ROCm 7.14.0.post1" in err
    # 2.14.2 has a cp313 wheel only; +rocm7.2 builds are another channel's
    assert "pytorch-org.TORCH_VERSION: 2.14.0+rocm7.14 -> 2.14.1+rocm7.14" in err
    # another patch release torch's ==7.14.* would take is named, not proposed
    assert "not proposed: rocm 7.14.1" in err
    assert (
        're-check the AOTriton torch 2.14.1+rocm7.14 bundles: the pytorch-org layer says aotriton: "0.12b"'
        in err
    )  # noqa: E501
    assert "Traceback" not in err


def test_pytorch_org_pins_that_are_newest_are_current(org_tree, offline):
    layer = org_tree / "recipes/layers/pytorch-org.yaml"
    text = layer.read_text().replace("2.14.0+", "2.14.1+").replace("0.29.0+", "0.29.2+")
    layer.write_text(text.replace('"7.14.0"', '"7.14.0.post1"'))
    proc = update(org_tree, "--channel", "pytorch-org", "--offline", str(offline))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "pytorch-org pins are current\n"


def test_pytorch_org_without_a_torchvision_for_its_torch_says_so(org_tree, offline):
    folder = offline / "download.pytorch.org/whl/rocm7.14/torchvision"
    for meta in folder.glob("*.metadata"):  # every torchvision now requires an older torch
        meta.write_text(meta.read_text().replace("torch>=2.14.0", "torch==2.13.0")
                        .replace("torch (>=2.14.0)", "torch==2.13.0"))  # fmt: skip
    with pytest.raises(UserError) as err:
        propose(org_tree, offline, "pytorch-org")
    assert err.value.message.startswith(
        "the pytorch-org index https://download.pytorch.org/whl/rocm7.14 has no torchvision "
        "+rocm7.14 for Python 3.12 whose Requires-Dist admits torch 2.14.1+rocm7.14 "
        "(0.29.2+rocm7.14 requires torch==2.13.0; 0.29.1+rocm7.14 requires torch==2.13.0; "
        "0.29.0+rocm7.14 requires torch==2.14.0)"
    )


# ------------------------------------------------------------------ torchvision by Requires-Dist

METADATA = REPO / "tests" / "pins" / "metadata"


def _requires(name: str):
    return pins_update.torch_requirement((METADATA / f"{name}.metadata").read_text())


def test_the_torch_requirement_is_read_from_saved_torchvision_metadata():
    assert str(_requires("torchvision-0.29.0")) == "==2.14.0"
    assert str(_requires("torchvision-0.29.1")) == ">=2.14.0"
    assert str(_requires("torchvision-0.29.2")) == ">=2.14.0"  # `torch (>=2.14.0)`, PyPI's form
    assert str(_requires("torchvision-0.30.0a0+rocm10.2.0a20261007")) == (
        "==2.15.0a0+rocm10.2.0a20261007"
    )
    # an extra's requirement is not torch's, and a wheel naming no torch says so
    assert pins_update.torch_requirement('Requires-Dist: torch==1.0; extra == "x"\n') is None
    assert pins_update.torch_requirement("Name: torchvision\nRequires-Dist: numpy\n") is None


PYPI_VISIONS = {Version(v): f"torchvision-{v}" for v in ("0.29.0", "0.29.1", "0.29.2")}


@pytest.mark.parametrize(
    ("torch", "chosen"),
    [("2.15.0", "0.29.2"), ("2.15.0+rocm10.0", "0.29.2"), ("2.14.0", "0.29.2"),
     ("2.13.0", None)],
)  # fmt: skip
def test_torchvision_is_the_newest_whose_wheel_admits_the_torch(torch, chosen):
    vision, passed = pins_update.vision_for(
        Version(torch), list(PYPI_VISIONS), lambda v: _requires(PYPI_VISIONS[v])
    )
    assert vision == (Version(chosen) if chosen else None)
    if chosen is None:  # each one names what it requires instead
        assert passed == [
            "0.29.2 requires torch>=2.14.0",
            "0.29.1 requires torch>=2.14.0",
            "0.29.0 requires torch==2.14.0",
        ]


def test_the_old_formula_would_find_nothing_for_torch_2_15():
    """torch 2.N <-> torchvision 0.(N+15) asks for 0.30 for torch 2.15: PyPI has none (2026-12-04),
    while 0.29.2's own wheel admits 2.15.0."""
    assert not [v for v in PYPI_VISIONS if v.release[:2] == (0, 30)]
    assert pins_update.vision_for(Version("2.15.0"), list(PYPI_VISIONS),
                                  lambda v: _requires(PYPI_VISIONS[v]))[0] == Version("0.29.2")  # fmt: skip


def test_a_nightly_torchvision_serves_only_its_own_nightly_torch():
    nightly = Version("0.30.0a0+rocm10.2.0a20261007")
    visions = {**PYPI_VISIONS, nightly: "torchvision-0.30.0a0+rocm10.2.0a20261007"}

    def pick(torch):
        return pins_update.vision_for(Version(torch), list(visions),
                                      lambda v: _requires(visions[v]))  # fmt: skip

    assert pick("2.15.0a0+rocm10.2.0a20261007")[0] == nightly
    vision, passed = pick("2.15.0")  # the release is not the nightly 0.30.0a0 was built for
    assert vision == Version("0.29.2")
    assert passed == [f"{nightly} requires torch==2.15.0a0+rocm10.2.0a20261007"]


ORG_2_15 = """variants:
  rocm7.14: {}
  torch2.15-rocm7.14:
    aotriton: "0.14.2b"
    hint_args:
      TORCH_INDEX_URL: https://download.pytorch.org/whl/rocm7.14
    pins:
      TORCH_VERSION: "2.15.0+rocm7.14"
      TORCHVISION_VERSION: "0.30.0+rocm7.14"  # the old formula's guess
      ROCM_VERSION: "7.14.0.post1"
    expect:
      torch.version: "2.15.0+rocm7.14"
"""


def test_pytorch_org_proposes_each_variants_torchvision_by_its_requires_dist(org_tree, offline):
    layer = org_tree / "recipes/layers/pytorch-org.yaml"
    layer.write_text(layer.read_text() + ORG_2_15)
    proposal = propose(org_tree, offline, "pytorch-org")
    by = {(p.layer, p.key): (p.current, p.proposed) for p in proposal.picks}
    # 0.29.2 (stable ABI, torch>=2.14.0) serves torch 2.14.1 too; 0.29.0 requires torch==2.14.0
    assert by[("pytorch-org", "TORCHVISION_VERSION")] == ("0.29.0+rocm7.14", "0.29.2+rocm7.14")
    assert by[("pytorch-org:torch2.15-rocm7.14", "TORCH_VERSION")] == (
        "2.15.0+rocm7.14", "2.15.0+rocm7.14",
    )  # fmt: skip
    assert by[("pytorch-org:torch2.15-rocm7.14", "TORCHVISION_VERSION")] == (
        "0.30.0+rocm7.14", "0.29.2+rocm7.14",
    )  # fmt: skip
    # the 2.14 block stays on its line; the 2.15 line is named
    assert by[("pytorch-org", "TORCH_VERSION")][1] == "2.14.1+rocm7.14"
    assert any("also serves torch 2.15 +rocm7.14" in n for n in proposal.notes)
    # one diff of the file: the layer's pins and the variant's torchvision line
    assert '+      TORCHVISION_VERSION: "0.29.2+rocm7.14"  # the old formula\'s guess' in (
        proposal.diff
    )
    assert '+  TORCH_VERSION: "2.14.1+rocm7.14"' in proposal.diff
    reminders = pins_update.reminders(proposal, load_recipes(org_tree))
    assert any('pytorch-org layer says aotriton: "0.12b"' in r for r in reminders)


def test_the_shipped_pytorch_org_variants_are_all_proposed_from(tmp_path):
    """The repository's own layer: one block per torch line it pins, each with an index."""
    blocks = pins_update.org_blocks(load_recipes(REPO))
    assert [(b.name, b.url) for b in blocks] == [
        ("pytorch-org", "https://download.pytorch.org/whl/rocm7.14"),
        ("pytorch-org:torch2.15-rocm10.0", "https://download.pytorch.org/whl/rocm10.0"),
        ("pytorch-org:torch2.15-rocm7.14", "https://download.pytorch.org/whl/rocm7.14"),
    ]


def test_stable_pairs_an_ambiguous_torchvision_by_its_wheels_requires_dist(tree, offline):
    """Two torchvision builds carry +rocm10.1.0; with their metadata saved (PEP 658), the one
    whose Requires-Dist admits the proposed torch is chosen, not the newest."""
    folder = offline / STABLE / "torchvision"
    for version, torch in (("0.28.0", "torch==2.14.0+rocm10.1.0"),
                           ("0.29.0a0", "torch==2.15.0a0+rocm10.1.0")):  # fmt: skip
        for py in ("312", "313"):
            name = f"torchvision-{version}+rocm10.1.0-cp{py}-cp{py}-linux_x86_64.whl.metadata"
            (folder / name).write_text(
                f"Metadata-Version: 2.1\nName: torchvision\nVersion: {version}+rocm10.1.0\n"
                f"Requires-Dist: numpy\nRequires-Dist: {torch}\n"
            )
    proposal = propose(tree, offline, "stable")
    assert proposed(proposal)["TORCH_VERSION"] == "2.14.0+rocm10.1.0"
    assert proposed(proposal)["TORCHVISION_VERSION"] == "0.28.0+rocm10.1.0"
    assert (
        "torchvision 0.28.0+rocm10.1.0 chosen by its wheel's Requires-Dist (admits torch "
        "2.14.0+rocm10.1.0); passed over: 0.29.0a0+rocm10.1.0 requires "
        "torch==2.15.0a0+rocm10.1.0" in proposal.notes
    )
    assert not any(n.startswith("ambiguous: torchvision") for n in proposal.notes)
