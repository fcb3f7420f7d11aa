"""invoke validate / invoke report: run the in-image suite with the right device flags, keep its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from invoke import task
from invoke.exceptions import Exit

from ..console import out, user_errors
from ..engine import RunRequest, connect
from ..errors import UserError
from ..plan import Options, resolve
from ..recipes import load_recipes
from .build import ROOT, choose_target

# TheRock dockerfiles/README.md: docker run --device=/dev/kfd --device=/dev/dri --ipc=host
# --group-add=video --group-add=render; ROCm's "Running ROCm Docker containers" page also
# advises --security-opt seccomp=unconfined (some HIP/HSA calls are blocked by the default profile).
VALIDATED = "validated.json"
ROCM_DEVICES = ["/dev/kfd", "/dev/dri"]
ROCM_GROUPS = ["video", "render"]
ROCM_EXTRA = ["--ipc=host", "--security-opt", "seccomp=unconfined"]


def device_flags(vendor: str, dev_root: Path = Path("/dev")) -> dict:
    """Devices, groups and extra run flags for a vendor; UserError when the host lacks them."""
    if vendor == "amd":
        missing = [d for d in ROCM_DEVICES if not (dev_root / Path(d).name).exists()]
        if missing:
            raise UserError(
                f"{', '.join(missing)} not found: this host has no ROCm GPU driver loaded, so the image "
                "cannot reach an AMD GPU",
                hint="run on the machine with the GPU (or point DOCKER_HOST at it); to try the suite "
                "without a GPU use --local, or validate the cpu stack",
            )
        return {"devices": ROCM_DEVICES, "groups": ROCM_GROUPS, "extra": ROCM_EXTRA}
    if vendor == "nvidia":
        return {"devices": [], "groups": [], "extra": ["--gpus", "all", "--ipc=host"]}
    return {"devices": [], "groups": [], "extra": []}


def suite_args(
    json_path: str, md_path: str, expect_path: str, quick: bool, timeout: int
) -> list[str]:
    args = ["-m", "validate", "all", "--json", json_path, "--md", md_path, "--expect", expect_path]
    if quick:
        args.append("--quick")
    if timeout:
        args += ["--timeout", str(timeout)]
    return args


def print_summary(report_path: Path) -> None:
    """Print the suite's Markdown summary up to its first collapsed details block (the full text,
    which CI puts in a step summary, stays in report.md)."""
    md = report_path.with_name("report.md")
    if md.exists():
        text = md.read_text().split("<details>", 1)[0].rstrip()
        out.print(text, markup=False, highlight=False)
        out.print(f"(full summary: {md})")


@task(
    help={
        "arch": "arch of the image to validate (default: the host's AMD GPU, else cpu)",
        "stack": "stack whose final image to validate (default: as for build)",
        "image": "validate this image instead of the stack's final tag",
        "local": "run the suite with this Python on this host instead of in an image",
        "quick": "fewer cases (a smoke-level run)",
        "timeout": "seconds each check may run before it counts as a timeout",
        "engine": "container engine: docker (default) or podman",
        "namespace": "image name prefix the stack was built under (default: attnforge)",
        "debug": "show tracebacks",
    }
)
@user_errors
def validate(
    c, arch=None, stack=None, image=None, local=False, quick=False, timeout=0, engine="docker",
    namespace="attnforge", debug=False,
):  # fmt: skip
    """Run the validation suite in the stack's image; writes reports/<arch>/<stack>/report.{json,md}."""
    recipes = load_recipes(ROOT)
    arch, stack = choose_target(recipes, arch, stack)
    plan = resolve(recipes, arch, stack, Options(namespace=namespace))
    if plan.blocked_by and not (local or image):
        first = plan.blocked_by[0]
        raise UserError(
            f"stack {stack} has no image for {arch}: layer {first.layer} is unsupported: {first.reason}"
        )
    reports = ROOT / "reports" / arch / stack
    reports.mkdir(parents=True, exist_ok=True)
    expect_file = reports / "expect.json"
    expect_file.write_text(
        json.dumps({"stack": stack, "arch": arch, "expect": plan.expect}, indent=2) + "\n"
    )
    report = reports / "report.json"
    stamp = reports / VALIDATED
    for stale in (report, reports / "report.md", stamp):
        stale.unlink(missing_ok=True)  # a report on disk is always this run's

    if local:
        argv = [
            sys.executable,
            *suite_args(str(report), str(reports / "report.md"), str(expect_file), quick, timeout),
        ]
        out.print(f"running the suite on this host: {' '.join(argv)}")
        code = subprocess.run(argv, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))).returncode
    else:
        flags = device_flags(recipes.arches[arch].vendor)  # before anything else: the usual miss
        eng = connect(engine)
        ref = image or plan.final_tag
        if not ref or eng.image_id(ref) is None:
            raise UserError(
                f"image {ref} not found",
                hint=f"build it first: invoke build --arch {arch} --stack {stack}",
            )
        req = RunRequest(
            image=ref,
            command=[
                "python3",
                *suite_args(
                    "/out/report.json", "/out/report.md", "/in/expect.json", quick, timeout
                ),
            ],
            devices=flags["devices"],
            groups=flags["groups"],
            extra=flags["extra"],
            mounts=[
                (reports.resolve(), "/out", False),
                (expect_file.resolve(), "/in/expect.json", True),
            ],
        )
        out.print(f"validating {ref} ({arch}, stack {stack})")
        log = reports / "validate.log"
        with log.open("w") as fh:
            code = eng.run_streaming(
                req, fh, on_line=lambda line: out.print(f"  {line}", markup=False, highlight=False)
            )
    if not report.exists():
        raise UserError(f"the suite wrote no report (exit {code}); see {reports / 'validate.log'}")
    if not local:
        # What `invoke publish` checks: this very image passed (image ids, not tags, which move).
        stamp.write_text(
            json.dumps(
                {"image": ref, "image_id": eng.image_id(ref), "exit": code, "passed": code == 0},
                indent=2,
            )
            + "\n"
        )
    print_summary(report)
    out.print(f"report: {report}")
    if code != 0:
        out.print(f"[bold red]validation failed[/] (exit {code})")
        raise Exit(code=code)


@task(
    positional=["path"],
    help={
        "path": "a report.json (default: reports/<arch>/<stack>/report.json)",
        "arch": "with --stack: find the report under reports/",
        "stack": "with --arch: find the report under reports/",
        "html": "also write HTML next to it",
        "debug": "show tracebacks",
    },
)
@user_errors
def report(c, path=None, arch=None, stack=None, html=False, debug=False):
    """Render a report.json to Markdown (and HTML) with the suite's own renderer."""
    if path is None:
        if not (arch and stack):
            raise UserError("give a report.json path, or --arch and --stack")
        path = ROOT / "reports" / arch / stack / "report.json"
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such report")
    argv = [
        sys.executable,
        "-m",
        "validate",
        "render",
        str(path),
        "--md",
        str(path.with_suffix(".md")),
    ]
    if html:
        argv += ["--html", str(path.with_suffix(".html"))]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"rendering {path} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    out.print(path.with_suffix(".md").read_text(), markup=False, highlight=False)
    if html:
        out.print(f"wrote {path.with_suffix('.html')}")
