"""invoke validate / invoke report: run the in-image suite with the right device flags, keep its report."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from invoke.exceptions import Exit

from ..console import out, user_errors
from ..engine import RunRequest, check_engine_name, connect
from ..errors import UserError
from ..plan import Options, Plan, aotriton_facts, resolve
from ..recipes import Recipes, load_recipes
from ..workspace import REPORTS_DIR_ENV, VALIDATED, Workspace
from . import choose_target, command, whole_number

# TheRock dockerfiles/README.md: docker run --device=/dev/kfd --device=/dev/dri --ipc=host
# --group-add=video --group-add=render; ROCm's "Running ROCm Docker containers" page also
# advises --security-opt seccomp=unconfined (some HIP/HSA calls are blocked by the default profile).
OUTPUTS = ("report.json", "report.md")  # what the suite writes; moved into place together
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


@dataclass(frozen=True)
class ToolRun:
    """One of the suite's tools run after it (bench, bench-train, stress): what it writes."""

    name: str  # as the user reads it: "bench", "stress qwen-image"
    output: str  # the JSON document it writes, a file name beside report.json
    args: list[str]  # after the interpreter, with the output folder filled in

    def argv(self, python: str, out_dir: str) -> list[str]:
        return [python, *(a.replace("{out}", out_dir) for a in self.args)]


def workload_names(root: Path) -> list[str]:
    """The stress workloads, read from the tree's validate/workloads.py (standard library only;
    the validate package is not installed on the host)."""
    path = root / "validate" / "workloads.py"
    spec = importlib.util.spec_from_file_location("_attnforge_workloads", path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path}: cannot be loaded, so --stress cannot check workload names")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return list(module.names())


def stress_workloads(values: list[str], known: list[str]) -> list[str]:
    """--stress values (repeatable, comma lists) -> workloads in the order given, once each."""
    picked: list[str] = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if not name:
                continue
            if name not in known:
                raise UserError(
                    f"--stress {name}: no such workload",
                    hint=f"choose from {', '.join(w for w in known if w != 'custom')}",
                )
            if name == "custom":
                raise UserError(
                    "--stress custom needs a shape, which invoke validate does not take",
                    hint="run `python -m validate stress --workload custom --shape ...` in the image",
                )
            if name not in picked:
                picked.append(name)
    return picked


def tool_runs(
    bench: bool, stress: list[str], quick: bool, tiny: bool, timeout: int, stress_iters: int
) -> list[ToolRun]:
    """What runs after the suite: bench and bench-train with --bench, stress per workload.
    ``tiny`` (no GPU: the cpu stack) shrinks every shape, since CPU torch and Triton's
    interpreter would take hours at the real ones."""
    size = ["--tiny"] if tiny else (["--quick"] if quick else [])
    limit = ["--timeout", str(timeout)] if timeout else []
    runs = []
    if bench:
        runs.append(
            ToolRun(
                "bench",
                "bench.json",
                ["-m", "validate", "bench", "--json", "{out}/bench.json", *size, *limit],
            )
        )
        runs.append(ToolRun("bench-train", "bench_train.json",
                            ["-m", "validate", "bench-train", "--json", "{out}/bench_train.json",
                             *size, *limit]))  # fmt: skip
    for w in stress:
        runs.append(ToolRun(f"stress {w}", f"stress-{w}.json",
                            ["-m", "validate", "stress", "--workload", w, "--backend", "all",
                             "--iters", str(stress_iters), "--json", f"{{out}}/stress-{w}.json",
                             *(["--tiny"] if tiny else []), *limit]))  # fmt: skip
    return runs


def tool_failures(runs: list[ToolRun], codes: dict[str, int], run_dir: Path) -> list[str]:
    """One sentence per tool that failed or wrote nothing."""
    failed = []
    for t in runs:
        code = codes.get(t.name)
        if not (run_dir / t.output).exists():
            failed.append(
                f"{t.name} wrote no {t.output} (exit {code}); the previous one, if any, is kept"
            )
        elif code:
            failed.append(f"{t.name} failed (exit {code}): see {t.output}")
    return failed


def expect_document(recipes: Recipes, plan: Plan) -> dict:
    """What the suite holds the image to: the stack's expectations, the known-bad host rules
    (recipes/hosts.yaml) and what the recipes say of the torch's AOTriton."""
    return {
        "stack": plan.stack,
        "arch": plan.arch,
        "expect": plan.expect,
        "host_rules": [r.model_dump(exclude_none=True) for r in recipes.host_rules],
        "aotriton": aotriton_facts(recipes, plan),
    }


def print_summary(report_path: Path) -> None:
    """Print the suite's Markdown summary up to its first collapsed details block (the full text,
    which CI puts in a step summary, stays in report.md)."""
    md = report_path.with_name("report.md")
    if md.exists():
        text = md.read_text().split("<details>", 1)[0].rstrip()
        out.print(text, markup=False, highlight=False)
        out.print(f"(full summary: {md})")


@command(
    help={
        "arch": "arch of the image to validate (default: the host's AMD GPU, else cpu)",
        "stack": "stack whose final image to validate (default: as for build)",
        "image": "validate this image instead of the stack's final tag",
        "local": "run the suite with this Python on this host instead of in an image",
        "quick": "fewer cases (a smoke-level run)",
        "timeout": "seconds each check may run before it counts as a timeout",
        "engine": "container engine: docker (default) or podman",
        "namespace": "image name prefix the stack was built under (default: attnforge)",
        "bench": "after the suite, time every backend (python -m validate bench and bench-train; "
        "smaller with --quick): bench.json, bench_train.json",
        "stress": "after the suite, stress every backend at a workload's shapes: qwen-image, "
        "sd15, sdxl or llm (repeatable, or a comma list): stress-<workload>.json",
        "stress_iters": "iterations per backend for --stress (default 100; 10 with --quick)",
        "debug": "show tracebacks",
    },
    iterable=["stress"],
)
@user_errors
def validate(
    c, arch=None, stack=None, image=None, local=False, quick=False, timeout=None, engine="docker",
    namespace="attnforge", bench=False, stress=None, stress_iters=None, debug=False,
):  # fmt: skip
    """Run the validation suite in the stack's image; writes reports/<arch>/<stack>/report.{json,md}.

    With --bench and --stress, the benchmarks and stress runs follow in the same image and land
    beside the report. The last report stays in place until this run has written a complete new
    one; so do the last bench and stress documents."""
    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    arch, stack = choose_target(recipes, arch, stack)
    timeout = whole_number("--timeout", timeout) if timeout is not None else 0
    iters = whole_number("--stress-iters", stress_iters) if stress_iters is not None else None
    workloads = stress_workloads(list(stress or []), workload_names(ws.root) if stress else [])
    runs = tool_runs(
        bench, workloads, quick, tiny=recipes.arches[arch].vendor == "cpu", timeout=timeout,
        stress_iters=iters or (10 if quick else 100),
    )  # fmt: skip
    check_engine_name(engine)
    plan = resolve(recipes, arch, stack, Options(namespace=namespace))
    if plan.blocked_by and not (local or image):
        first = plan.blocked_by[0]
        raise UserError(
            f"stack {stack} has no image for {arch}: layer {first.layer} is unsupported: {first.reason}"
        )
    eng = ref = None
    if not local:  # everything that can fail early, before a file is touched
        flags = device_flags(recipes.arches[arch].vendor)
        eng = connect(engine)
        ref = image or plan.final_tag
        if not ref or eng.image_id(ref) is None:
            raise UserError(
                f"image {ref} not found",
                hint=f"build it first: invoke build --arch {arch} --stack {stack}",
            )

    reports = ws.reports_for(arch, stack)
    reports.mkdir(parents=True, exist_ok=True)
    run_dir = reports / f".run-{os.getpid()}"  # the new report is written here, then moved
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    try:
        expect_file = run_dir / "expect.json"
        expect_file.write_text(json.dumps(expect_document(recipes, plan), indent=2) + "\n")
        log = run_dir / "validate.log"
        if local:
            argv = [sys.executable, *suite_args(str(run_dir / "report.json"),
                    str(run_dir / "report.md"), str(expect_file), quick, timeout)]  # fmt: skip
            out.print(f"running the suite on this host: {' '.join(argv)}")
            env = dict(os.environ, PYTHONPATH=str(ws.root))
            code = subprocess.run(argv, cwd=ws.root, env=env).returncode
        else:
            req = RunRequest(
                image=ref,
                command=["python3", *suite_args("/out/report.json", "/out/report.md",
                                               "/out/expect.json", quick, timeout)],
                devices=flags["devices"], groups=flags["groups"], extra=flags["extra"],
                env={"ATTNFORGE_ENGINE": eng.describe()},
                mounts=[(run_dir.resolve(), "/out", False)],
            )  # fmt: skip
            out.print(f"validating {ref} ({arch}, stack {stack})")
            with log.open("w") as fh:
                code = eng.run_streaming(
                    req,
                    fh,
                    on_line=lambda line: out.print(f"  {line}", markup=False, highlight=False),
                )
        codes: dict[str, int] = {}
        if (run_dir / "report.json").exists():
            for t in runs:
                out.print(f"running {t.name}")
                if local:
                    argv = t.argv(sys.executable, str(run_dir))
                    codes[t.name] = subprocess.run(argv, cwd=ws.root, env=env).returncode
                    continue
                treq = RunRequest(
                    image=ref, command=t.argv("python3", "/out"), devices=flags["devices"],
                    groups=flags["groups"], extra=flags["extra"], env=req.env, mounts=req.mounts,
                )  # fmt: skip
                with log.open("a") as fh:
                    codes[t.name] = eng.run_streaming(
                        treq,
                        fh,
                        on_line=lambda line: out.print(f"  {line}", markup=False, highlight=False),
                    )
        if log.exists():
            os.replace(log, reports / "validate.log")
        if not (run_dir / "report.json").exists():
            raise UserError(
                f"the suite wrote no report (exit {code}); see {reports / 'validate.log'}; "
                "the previous report, if any, is unchanged"
            )
        failures = tool_failures(runs, codes, run_dir)
        passed = code == 0 and not failures
        if not local:
            # What `invoke publish` checks: this very image passed (image ids, not tags, which move).
            (run_dir / VALIDATED).write_text(json.dumps(
                {"image": ref, "image_id": eng.image_id(ref), "exit": code, "passed": passed,
                 "tools": codes}, indent=2) + "\n")  # fmt: skip
        _move_into_place(run_dir, reports, local, tuple(t.output for t in runs))
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    report = reports / "report.json"
    print_summary(report)
    out.print(f"report: {report}")
    for t in runs:
        if (reports / t.output).exists():
            out.print(f"{t.name}: {reports / t.output}")
    if code != 0:
        out.print(f"[bold red]validation failed[/] (exit {code})")
    for sentence in failures:
        out.print(sentence, style="bold red", markup=False, highlight=False)
    if not passed:
        raise Exit(code=code or 1)


def _move_into_place(
    run_dir: Path, reports: Path, local: bool, extra: tuple[str, ...] = ()
) -> None:
    """The new report replaces the old one only now that it is complete; so does each tool's
    document this run wrote (one it did not write leaves the last one). A --local run validated
    no image, so it leaves the image stamp (what `invoke publish` trusts) as it was."""
    for name in (*OUTPUTS, "expect.json", *extra):
        if (run_dir / name).exists():
            os.replace(run_dir / name, reports / name)
    if not local:
        os.replace(run_dir / VALIDATED, reports / VALIDATED)


@command(
    help={
        "path": "the report.json to render (default: the one of --arch and --stack)",
        "arch": "find the report under reports/<arch>/<stack>/ (default: as for validate)",
        "stack": "with --arch (default: the arch's default stack)",
        "html": "also write report.html next to it",
        "debug": "show tracebacks",
    },
)
@user_errors
def report(c, path=None, arch=None, stack=None, html=False, debug=False):
    """Render a validation report to Markdown (and HTML) with the suite's own renderer."""
    ws = Workspace.discover()
    if path is None:
        arch, stack = choose_target(load_recipes(ws.root), arch, stack)
        path = ws.reports_for(arch, stack) / "report.json"
        if not path.is_file():
            raise UserError(
                f"{path}: no such report",
                hint=f"run `invoke validate --arch {arch} --stack {stack}` first "
                f"(reports live under ${REPORTS_DIR_ENV}, default reports/)",
            )
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
    proc = subprocess.run(argv, cwd=ws.root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"rendering {path} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    out.print(path.with_suffix(".md").read_text(), markup=False, highlight=False)
    if html:
        out.print(f"wrote {path.with_suffix('.html')}")
