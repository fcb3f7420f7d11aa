"""Rehearsals: AMD stacks built end to end on the real engine from a mirror of stand-in wheels
(tests/rehearsal.py), so that every RUN line of their Dockerfiles executes where no AMD index or
GPU is. What a rehearsal shows and what only an AMD machine can: docs/ci.md, "Rehearsals".

The mirror is made with `invoke mirror` (stand-ins added with --add, flash-attention's stand-in
repository with --add-repo, the rest from PyPI) and the stack built with `invoke build --mirror`,
each layer with every URL but the mirror's refused. A warm run reuses BuildKit's cache.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from attnforge.plan import Options, parse_overrides, resolve
from attnforge.recipes import load_recipes
from tests.conftest import REPO
from tests.e2e.test_cpu_stack import (
    BASE,
    CA_CERT,
    WHEELHOUSE,
    copy_tree,
    invoke,
    outcomes,
    remove_images,
    require_engine,
    unavailable,
)
from tests.rehearsal import AITER_URL, dao_repos, standins

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NAMESPACE = f"attnforge-e2e-rehearsal-{uuid.uuid4().hex[:8]}"
FA_REPO = "https://github.com/ROCm/flash-attention.git"
DAO_REPO = "https://github.com/Dao-AILab/flash-attention.git"
FAMILY = {"gfx1151": "gfx115x", "gfx1100": "gfx110x"}
AMD_LAYERS = ["base", "rocm-sdk", "pytorch-wheels", "flash-attention", "validate"]


def plan_of(arch: str, stack: str, given: list[str] = ()):
    """The stack's plan with the --set values ``given`` (["--set", "L.K=V", ...])."""
    recipes = load_recipes(REPO)
    overrides = parse_overrides([v for v in given if v != "--set"], recipes)
    return resolve(recipes, arch, stack, Options(base_image=BASE, overrides=overrides))


def channel_pins(arch: str, stack: str, given: list[str] = ()) -> dict[str, str]:
    """The versions the stack's rocm-sdk and pytorch-wheels layers pin, read from the recipes."""
    plan = plan_of(arch, stack, given)
    pins: dict[str, str] = {}
    for step in plan.steps:
        if step.layer in ("rocm-sdk", "pytorch-wheels", "pytorch-org"):
            pins.update(step.pins)
    return pins


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    require_engine()
    if not any(Path(WHEELHOUSE).glob("torch-*+cpu-*.whl")):
        unavailable(f"no CPU torch wheel in {WHEELHOUSE} for the stand-ins",
                    f"no CPU torch wheel in {WHEELHOUSE} (tools/setup.sh wheelhouse)")  # fmt: skip
    dest = copy_tree(tmp_path_factory, "rehearsal")
    try:
        yield dest
    finally:
        remove_images(NAMESPACE)


def rehearsal_mirror(
    tree: Path, arch: str, stack: str, dest: Path, given: list[str] = ()
) -> tuple[list[str], str]:
    """`invoke mirror` of the stack with stand-ins; returns the --set flags both commands take
    (``given`` and flash-attention's stand-in commit) and what mirror printed."""
    arches = arch.split(",")
    wheels, repo, commit = standins(Path(WHEELHOUSE), channel_pins(arches[0], stack, given), arches,
                                    FAMILY, CA_CERT if Path(CA_CERT).is_file() else None)  # fmt: skip
    plan = plan_of(arches[0], stack, given)
    runs = {s.layer for s in plan.steps if s.runs}
    sets = [*given, *(["--set", f"flash-attention.SOURCE_REF={commit}"]
                      if "flash-attention" in runs else [])]  # fmt: skip
    repos = ["--add-repo", f"{FA_REPO}={repo}"]
    if "flash-attention-dao" in runs:
        dao, dao_commit, aiter = dao_repos(
            repo.parent, CA_CERT if Path(CA_CERT).is_file() else None
        )
        sets += ["--set", f"flash-attention-dao.SOURCE_REF={dao_commit}"]
        repos += ["--add-repo", f"{DAO_REPO}={dao}", "--add-repo", f"{AITER_URL}={aiter}"]
    made = invoke(tree, "mirror", "--arch", arch, "--stack", stack, "--to", str(dest), *sets,
                  "--add", str(wheels), *repos,
                  "--index-url", "https://pypi.org/simple/", "--python-version", "3.11",
                  "--rehearsal", "AMD's names and pins on CPU torch/triton and metadata-only wheels",
                  timeout=900)  # fmt: skip
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    return sets, made.stdout


def rehearse(tree: Path, arch: str, stack: str, mirror: Path, sets: list[str]):
    return invoke(tree, "build", "--arch", arch, "--stack", stack, "--mirror", str(mirror), *sets,
                  "--base-image", BASE, "--namespace", NAMESPACE, timeout=1800)  # fmt: skip


def labels(ref: str) -> dict[str, str]:
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", ref],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def default_rehearsal(tree, tmp_path_factory):
    mirror = tmp_path_factory.mktemp("mirror") / "default"
    sets, _ = rehearsal_mirror(tree, "gfx1151", "default", mirror)
    return mirror, sets, rehearse(tree, "gfx1151", "default", mirror, sets)


def test_the_default_stack_rehearses_end_to_end(default_rehearsal):
    """`invoke build --arch gfx1151 --mirror DIR`: every layer built, every rehearsable smoke
    check passed, the others named with their reason, and the output says it is a rehearsal."""
    _, _, built = default_rehearsal
    out = built.stdout
    assert built.returncode == 0, out[-4000:] + built.stderr[-3000:]
    assert outcomes(out) == dict.fromkeys(AMD_LAYERS, "built")
    out = " ".join(out.split())  # rich wraps long lines
    assert out.count("REHEARSAL: built from stand-in wheels") == 2  # first and last
    assert "stand-ins: " in out and "torch-2.14.0+rocm10.1.0-cp311" in out
    assert "not rehearsable: pytorch-wheels: torch's GPU code for the arch is on disk" in out
    assert "smoke FAIL" not in out
    for check in ("the coupled ROCm wheels are one build", "rocm-sdk lists the arch among its targets",
                  "flash_attn imports with the chosen backend", "the suite answers --help"):  # fmt: skip
        assert f"smoke ok {check}" in out, check
    final = labels(f"{NAMESPACE}/default:gfx1151")
    assert final["org.attnforge.rehearsal"]


def test_the_validate_layer_compiled_the_native_launch_path_the_loader_looks_for(default_rehearsal):
    """The stand-in torch is a ROCm build by its version (torch.version.hip), so the validate
    layer compiles the native launch path, from native_build.py and replay.cpp alone, before the
    packages are copied in (dockerfiles/validate.Dockerfile); the module is the one the packages'
    loader asks for in the finished image."""
    assert default_rehearsal[2].returncode == 0
    code = ("from attnforge_kernels.launch import native_build as b; "
            "print(b._name(b._compiler())); print(*sorted(p.name for p in b.cache_dir().iterdir()))")  # fmt: skip
    proc = subprocess.run(["docker", "run", "--rm", f"{NAMESPACE}/default:gfx1151", "python3", "-c",
                           code], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, files = proc.stdout.splitlines()
    assert f"{name}.so" in files.split(), proc.stdout


def test_a_rehearsal_image_is_neither_published_nor_exported(tree, default_rehearsal):
    assert default_rehearsal[2].returncode == 0
    for args, done in ((["publish", "--to", "localhost:5999/never"], "published"),
                       (["export"], "exported")):  # fmt: skip
        proc = invoke(tree, *args, "--arch", "gfx1151", "--namespace", NAMESPACE)
        said = " ".join((proc.stdout + proc.stderr).split())  # rich wraps long lines
        assert (
            proc.returncode != 0 and "is a rehearsal image" in said and f"it is not {done}" in said
        ), said


def test_the_mirror_is_checked_before_anything_builds(tree, default_rehearsal, tmp_path):
    """A damaged file and a missing pin are each one sentence, said before any layer builds."""
    mirror, sets, _ = default_rehearsal
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-a", str(mirror), str(broken)], check=True)
    audio = next((broken / "files").glob("torchaudio-*.whl"))
    vision = next((broken / "files").glob("torchvision-*.whl"))
    vision.write_bytes(vision.read_bytes()[:-1])
    manifest = json.loads((broken / "manifest.json").read_text())
    del manifest["files"][audio.name]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    audio.unlink()
    proc = rehearse(tree, "gfx1151", "default", broken, sets)
    said = " ".join((proc.stdout + proc.stderr).split())  # rich wraps long lines
    assert proc.returncode != 0 and "[1/5]" not in said, said[-3000:]
    assert (
        "2 problems: layer pytorch-wheels pins torchaudio==2.11.0.3+rocm10.1.0, and the mirror has no wheel of it"
        in said
    )
    assert f"files/{vision.name} does not match its sha256 in manifest.json" in said


@pytest.mark.parametrize(
    ("good", "planted", "said"),
    [
        (
            ' --index-url "${ROCM_INDEX_URL}"',
            ' --index-urll "${ROCM_INDEX_URL}"',
            "no such option: --index-urll",
        ),
        ("ARG TORCHVISION_VERSION\n", "", "torchvision[device-gfx1151]=="),
    ],
    ids=["pip-flag-typo", "missing-arg"],
)
def test_a_planted_defect_in_a_rocm_layer_fails_the_rehearsal(
    tree, default_rehearsal, good, planted, said
):
    """The rehearsal runs the Dockerfiles' lines: a typo in a pip flag of pytorch-wheels, or an
    ARG it no longer declares (its pin arrives empty), fails it at that layer."""
    mirror, sets, built = default_rehearsal
    assert built.returncode == 0
    dockerfile = tree / "dockerfiles/pytorch-wheels.Dockerfile"
    text = dockerfile.read_text()
    assert text.count(good) == 1
    dockerfile.write_text(text.replace(good, planted))
    try:
        proc = rehearse(tree, "gfx1151", "default", mirror, sets)
    finally:
        dockerfile.write_text(text)
    out = " ".join((proc.stdout + proc.stderr).split())  # rich wraps long lines
    assert proc.returncode != 0 and "layer 'pytorch-wheels' failed to build" in out, out[-3000:]
    assert said in out


NIGHTLY = "10.2.0a20261119"  # the form AMD's nightlies take (docs/channels.md)
NIGHTLY_SETS = [
    "--set", f"rocm-sdk.ROCM_VERSION={NIGHTLY}",
    "--set", f"pytorch-wheels.TORCH_VERSION=2.15.0a0+rocm{NIGHTLY}",
    "--set", f"pytorch-wheels.TORCHVISION_VERSION=0.30.0a0+rocm{NIGHTLY}",
    "--set", f"pytorch-wheels.TORCHAUDIO_VERSION=2.11.0a0+rocm{NIGHTLY}",
]  # fmt: skip


@pytest.mark.parametrize(
    ("arch", "stack", "torch", "given"),
    [
        ("gfx1151", "rocm10.0", "2.13.0+rocm10.0.0", []),
        ("gfx1151,gfx1100", "default", "2.14.0+rocm10.1.0", []),
        ("gfx1151", "pytorch-org", "2.14.1+rocm7.14", []),
        ("gfx1151", "pytorch-org2.15", "2.15.0+rocm10.0", []),
        ("gfx1151", "pytorch-org2.15-rocm7.14", "2.15.0+rocm7.14", []),
        ("gfx1151", "rocm7.14", "2.12.0+rocm7.14.0", []),
        ("gfx1151", "nightly", f"2.15.0a0+rocm{NIGHTLY}", NIGHTLY_SETS),
    ],
    ids=[
        "rocm10.0",
        "gfx1151+gfx1100",
        "pytorch-org",
        "pytorch-org2.15",
        "pytorch-org2.15-rocm7.14",
        "rocm7.14",
        "nightly",
    ],
)
def test_other_channels_and_a_two_arch_image_rehearse(tree, tmp_path, arch, stack, torch, given):
    """The rocm10.0, rocm7.14, nightly (pre-release versions given with --set) and pytorch.org
    channels (torch 2.14.1, and 2.15.0 on its two inferred ROCm lines), and one image for gfx1151
    and gfx1100 (both device extras, both arches' checks), built end to end from their own
    rehearsal mirrors."""
    mirror = tmp_path / "mirror"
    sets, _ = rehearsal_mirror(tree, arch, stack, mirror, given)
    built = rehearse(tree, arch, stack, mirror, sets)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-3000:]
    layers = [s.layer for s in plan_of(arch.split(",")[0], stack, given).chain]
    assert outcomes(built.stdout) == dict.fromkeys(layers, "built")
    if stack.startswith("pytorch-org"):  # its device-code check read hipcc-built code objects
        log = (tree / "build" / "logs" / arch / "pytorch-org.log").read_text()  # the latest build
        check = next(json.loads(line) for line in log.splitlines()
                     if line.startswith('{"name": "libtorch_hip.so holds GPU code'))  # fmt: skip
        assert check["ok"] and check["detail"] == f"libtorch_hip.so: {arch}", check
    out = " ".join(built.stdout.split())
    assert f": torch {torch}" in out and "smoke FAIL" not in out
    assert "REHEARSAL: built from stand-in wheels" in out
    for one in arch.split(","):
        assert f"rocm-sdk-device-{one}" in out


@pytest.mark.parametrize(
    ("arch", "stack", "stop"),
    [
        ("gfx1151", "rdna3-minimal", "flash-attention-rdna3-minimal"),
        ("gfx942", "source", "aotriton"),
    ],
)
def test_a_stack_rehearses_up_to_its_named_stop_point(tree, tmp_path, arch, stack, stop):
    """What cannot run without AMD's binaries (a HIP compile) is the named point where the
    rehearsal stops: every layer below it is built, it and the layers above are reported skipped
    with the reason, never silently left out."""
    mirror = tmp_path / "mirror"
    sets, made = rehearsal_mirror(tree, arch, stack, mirror)
    assert f"rehearsal stops before {stop}" in " ".join(made.split())
    built = rehearse(tree, arch, stack, mirror, sets)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-3000:]
    layers = [
        s.layer for s in resolve(load_recipes(REPO), arch, stack, Options(base_image=BASE)).chain
    ]
    below = layers[: layers.index(stop)]
    got = outcomes(built.stdout)
    assert got == {
        **dict.fromkeys(below, got[below[0]]),
        **dict.fromkeys(layers[len(below) :], "skipped"),
    }
    assert got[below[0]] in ("built", "cached")
    out = " ".join(built.stdout.split())
    assert f"stops before {stop}: " in out and "smoke FAIL" not in out


def test_dao_rehearses_end_to_end_with_its_submodule_from_the_mirror(tree, tmp_path):
    """Dao-AILab's tree (the dao stack): the mirror holds its third_party/aiter submodule at the
    commit the stand-in tree pins, and the layer's own `git submodule update` fetches it from
    there (every other URL refused), then builds and passes its smoke checks."""
    mirror = tmp_path / "mirror"
    sets, made = rehearsal_mirror(tree, "gfx1151", "dao", mirror)
    assert "rehearsal stops" not in " ".join(made.split())
    repos = json.loads((mirror / "manifest.json").read_text())["repos"]
    assert set(repos) == {DAO_REPO, AITER_URL}
    built = rehearse(tree, "gfx1151", "dao", mirror, sets)
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-3000:]
    layers = [s.layer for s in plan_of("gfx1151", "dao").chain]
    assert outcomes(built.stdout) == dict.fromkeys(layers, "built")
    out = " ".join(built.stdout.split())
    assert "smoke FAIL" not in out and "REHEARSAL: built from stand-in wheels" in out


def test_a_rehearsal_builds_with_podman_from_the_mirror_on_the_host_network(
    tree, default_rehearsal
):
    """--engine podman: the layers up to rocm-sdk build with buildah's `--network host`, reach
    the mirror on 127.0.0.1 with every other URL refused, and pass their smoke checks, as under
    Docker (the Podman of `tools/setup.sh podman`, its own storage holding the base image)."""
    if shutil.which("podman") is None:
        unavailable("no podman (tools/setup.sh podman)", "no podman: run tools/setup.sh podman")
    mirror, sets, _ = default_rehearsal
    built = invoke(tree, "build", "--arch", "gfx1151", "--mirror", str(mirror), *sets,
                   "--only", "rocm-sdk", "--engine", "podman", "--base-image", BASE,
                   "--namespace", f"{NAMESPACE}-podman", timeout=1800)  # fmt: skip
    try:
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-3000:]
        assert outcomes(built.stdout) == {"base": "built", "rocm-sdk": "built"}
        out = " ".join(built.stdout.split())
        assert "smoke FAIL" not in out and "REHEARSAL: built from stand-in wheels" in out
    finally:  # what this test tagged in Podman's storage
        remove_images(f"{NAMESPACE}-podman", engine="podman")
