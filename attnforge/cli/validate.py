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

from .. import baseline as gate
from .. import baseline_store, hostinfo, multiarch
from ..console import out, user_errors
from ..engine import RunRequest, check_engine_name, connect
from ..errors import UserError
from ..plan import Options, Plan, aotriton_facts, resolve
from ..recipes import Recipes, load_recipes
from ..workspace import REPORTS_DIR_ENV, VALIDATED, Workspace
from . import (
    ARCH,
    ENGINE,
    NAMESPACE,
    STACK,
    choose_target,
    command,
    number,
    text,
    writable_folder,
)

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
    bench: bool, stress: list[str], quick: bool, tiny: bool, timeout: int, stress_iters: int,
    backends: tuple[str, ...] = (),
) -> list[ToolRun]:  # fmt: skip
    """What runs after the suite: bench and bench-train with --bench (over ``backends``, default
    all), stress per workload. ``tiny`` (no GPU: the cpu stack) shrinks every shape, since CPU
    torch and Triton's interpreter would take hours at the real ones."""
    size = ["--tiny"] if tiny else (["--quick"] if quick else [])
    limit = ["--timeout", str(timeout)] if timeout else []
    limit += ["--backend", ",".join(backends)] if backends else []
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
                             *(["--tiny"] if tiny else []),
                             *(["--timeout", str(timeout)] if timeout else [])]))  # fmt: skip
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


def expect_document(
    recipes: Recipes, plan: Plan, shown_as: Path | None = None, in_image: bool = True
) -> dict:
    """What the suite holds the image to: the stack's expectations, the known-bad host rules
    (recipes/hosts.yaml: ROCm hosts, so none for a CPU or NVIDIA arch), what the recipes say of
    the torch's AOTriton, and what the arch's torch refuses by design (recipes/arches.yaml
    sdpa_limits); `shown_as` is the path the user will find the file at (the report names it, not
    the image's /out/expect.json), `in_image` False for a suite run on the host."""
    arch = recipes.arches[plan.arch]
    limits = getattr(arch, "sdpa_limits", None)  # an arch set (multiarch) has none of its own
    rules = []
    for r in recipes.host_rules if arch.vendor == "amd" else []:
        rule = r.model_dump(exclude_none=True)
        on_host = rule.pop("fix_on_host", None)
        if on_host and not in_image:
            rule["fix"] = on_host
        rules.append(rule)
    doc = {
        "stack": plan.stack,
        "arch": plan.arch,
        "expect": plan.expect,
        "host_rules": rules,
        "aotriton": aotriton_facts(recipes, plan),
        **({"sdpa_limits": limits.model_dump()} if limits else {}),
        "in_image": in_image,
    }
    if shown_as is not None:
        doc["shown_as"] = str(shown_as)
    return doc


def print_summary(report_path: Path) -> None:
    """Print the suite's Markdown summary up to its first collapsed details block (the full text,
    which CI puts in a step summary, stays in report.md)."""
    md = report_path.with_name("report.md")
    if md.exists():
        text = md.read_text().split("<details>", 1)[0].rstrip()
        out.print(text, markup=False, highlight=False)
        out.print(f"(full summary: {md})")


@command(
    options={
        "arch": ARCH,
        "stack": STACK,
        "image": text("IMAGE"),
        "timeout": number("SECONDS"),
        "engine": ENGINE,
        "namespace": NAMESPACE,
        "stress": text("WORKLOAD[,WORKLOAD...]", repeatable=True),
        "stress_iters": number("N"),
        "baseline": text("PATH|IMAGE"),
        "bench_backend": text("BACKEND[,BACKEND...]", repeatable=True),
    },  # fmt: skip
    writes=("reports",),
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
        "baseline": "with --bench: compare the benchmark with this one and apply the stack's "
        "bench_gates: a report folder, report.json, bench.json, or an image published with "
        "`invoke publish` (default: the kept last passing run, reports/<arch>/<stack>/baseline/)",
        "bench_backend": "with --bench: time only this backend (repeatable, or a comma list; "
        "default all), e.g. kernels",
        "debug": "show tracebacks",
    },
)
@user_errors
def validate(
    c, arch=None, stack=None, image=None, local=False, quick=False, timeout=None, engine="docker",
    namespace="attnforge", bench=False, stress=None, stress_iters=None, baseline=None,
    bench_backend=None, debug=False,
):  # fmt: skip
    """Run the validation suite in the stack's image; writes reports/<arch>/<stack>/report.{json,md}.

    With --bench and --stress, the benchmarks and stress runs follow in the same image and land
    beside the report; --bench compares with the baseline and fails below the stack's gates. The
    last report stays in place until this run has written a complete new one; so do the last
    bench and stress documents, and the kept baseline moves only after a run that passed."""
    ws = Workspace.discover()
    recipes = load_recipes(ws.root)
    arch, stack = choose_target(recipes, arch, stack)
    timeout = timeout or 0
    iters = stress_iters
    workloads = stress_workloads(list(stress or []), workload_names(ws.root) if stress else [])
    if (baseline or bench_backend) and not bench:
        flag = "--baseline" if baseline else "--bench-backend"
        raise UserError(f"{flag} goes with --bench, which runs the benchmark it is about",
                        hint=f"invoke validate --arch {arch} --bench {flag} ...")  # fmt: skip
    runs = tool_runs(
        bench, workloads, quick, tiny=recipes.arches[arch].vendor == "cpu", timeout=timeout,
        stress_iters=iters or (10 if quick else 100),
        backends=bench_backends(list(bench_backend or [])),
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
    member = None
    if isinstance(recipes.arches[arch], multiarch.ArchSet):  # validated per member, on its GPU
        member = multiarch.host_member(recipes.arches[arch], hostinfo.default_arch()[0])
        reports = multiarch.member_reports(reports, member)
    base = find_baseline(baseline, reports, ws, engine) if bench else None
    gates, min_ratio = stack_gates(recipes, stack)
    reports.mkdir(parents=True, exist_ok=True)
    run_dir = reports / f".run-{os.getpid()}"  # the new report is written here, then moved
    from validate.report import RUN_ID_ENV, new_run_id  # the suite's own: stdlib only

    run_id = new_run_id()  # stamped on every document of this run
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    try:
        expect_file = run_dir / "expect.json"
        expect_doc = expect_document(
            recipes, plan, shown_as=reports / "expect.json", in_image=not local
        )
        if member:
            expect_doc.update(arch=member, expect=multiarch.member_expect(recipes, plan, member))
            limits = recipes.arches[member].sdpa_limits  # what this member's torch refuses
            if limits:
                expect_doc["sdpa_limits"] = limits.model_dump()
        expect_file.write_text(json.dumps(expect_doc, indent=2) + "\n")
        log = run_dir / "validate.log"
        if local:
            argv = [sys.executable, *suite_args(str(run_dir / "report.json"),
                    str(run_dir / "report.md"), str(expect_file), quick, timeout)]  # fmt: skip
            out.print(f"running the suite on this host: {' '.join(argv)}")
            env = dict(os.environ, PYTHONPATH=str(ws.root), **{RUN_ID_ENV: run_id})
            code = subprocess.run(argv, cwd=ws.root, env=env).returncode
        else:
            req = RunRequest(
                image=ref,
                command=["python3", *suite_args("/out/report.json", "/out/report.md",
                                               "/out/expect.json", quick, timeout)],
                devices=flags["devices"], groups=flags["groups"], extra=flags["extra"],
                env={"ATTNFORGE_ENGINE": eng.describe(), RUN_ID_ENV: run_id},
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
        benched = bench and (run_dir / "bench.json").exists()
        compared = None
        if benched and base is not None:
            compared = compare_with_baseline(base, run_dir, reports, gates, min_ratio, run_id)
            failures += [f"below the baseline: {s}" for s in compared.get("failures", [])]
        passed = code == 0 and not failures
        outputs = (*(t.output for t in runs), *(COMPARE_OUTPUTS if compared else ()))
        if not local:
            # What `invoke publish` checks: this very image passed (image ids, not tags, which
            # move); `documents` lets it tell this run's bench.json from a later --local one's.
            documents = {name: baseline_store.sha256_file(run_dir / name)
                         for name in ("report.json", *outputs) if (run_dir / name).is_file()}  # fmt: skip
            (run_dir / VALIDATED).write_text(json.dumps(
                {"image": ref, "image_id": eng.image_id(ref), "exit": code, "passed": passed,
                 "tools": codes, "documents": documents,
                 "baseline": ({"source": base.source, "passed": compared.get("passed")}
                              if compared else None)}, indent=2) + "\n")  # fmt: skip
        _move_into_place(run_dir, reports, local, outputs)
        if benched and not compared:  # the last comparison was of the bench just replaced
            for name in COMPARE_OUTPUTS:
                (reports / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    report = reports / "report.json"
    refresh_page(report, ws.root)
    print_summary(report)
    out.print(f"report: {report}")
    for t in runs:
        if (reports / t.output).exists():
            out.print(f"{t.name}: {reports / t.output}")
    if compared:
        print_comparison(compared, reports)
    if benched:
        keep_or_not(passed, reports, base, ref if not local else None, eng, local)
    if code != 0:
        out.print(f"[bold red]validation failed[/] (exit {code})")
    for sentence in failures:
        out.print(sentence, style="bold red", markup=False, highlight=False)
    if not passed:
        raise Exit(code=code or 1)


COMPARE_OUTPUTS = ("baseline-compare.json", "baseline-compare.md")


def render(report: Path, root: Path, html: bool) -> subprocess.CompletedProcess:
    """`python -m validate render` (the suite's own renderer) of report.json into report.md and,
    with `html`, report.html beside it."""
    argv = [sys.executable, "-m", "validate", "render", str(report), "--md",
            str(report.with_suffix(".md"))]  # fmt: skip
    if html:
        argv += ["--html", str(report.with_suffix(".html"))]
    return subprocess.run(argv, cwd=root, capture_output=True, text=True)


def refresh_page(report: Path, root: Path) -> None:
    """A report.html older than the report.json beside it (drawn by `invoke report --html` for
    an earlier run) is drawn again, so that the page never shows another run than the report;
    where it cannot be drawn it is removed, and both are said."""
    page = report.with_suffix(".html")
    if not page.is_file() or page.stat().st_mtime >= report.stat().st_mtime:
        return
    proc = render(report, root, html=True)
    if proc.returncode == 0:
        out.print(f"page: {page} (drawn again for this run)", markup=False, highlight=False)
        return
    page.unlink(missing_ok=True)
    why = (proc.stderr.strip() or f"exit {proc.returncode}").splitlines()[-1]
    out.print(f"removed {page}, which showed the previous run: it could not be drawn again "
              f"({why}); `invoke report --html` draws it", style="yellow", markup=False,
              highlight=False)  # fmt: skip


def bench_backends(values: list[str]) -> tuple[str, ...]:
    """--bench-backend values (repeatable, comma lists) -> backend names, checked against the
    bench's own list when the validate package is importable here."""
    from ..recipes import known_bench_backends

    known = known_bench_backends()
    picked: list[str] = []
    for name in (v.strip() for value in values for v in value.split(",")):
        if not name:
            continue
        if known is not None and name not in known:
            raise UserError(f"--bench-backend {name}: no such backend",
                            hint=f"choose from {', '.join(known)}")  # fmt: skip
        if name not in picked:
            picked.append(name)
    return tuple(picked)


def stack_gates(recipes: Recipes, stack: str) -> tuple[list[gate.Gate], float]:
    """The stack's bench_gates (recipes/stacks.yaml) as gates, and their default threshold."""
    spec = recipes.stacks[stack].bench_gates
    if spec is None:
        return [], gate.DEFAULT_MIN_RATIO
    gates = [gate.Gate(g.backend, g.shape, g.mode, g.min_ratio) for g in spec.gates]
    return gates, spec.min_ratio


def find_baseline(
    given: str | None, reports: Path, ws: Workspace, engine: str
) -> baseline_store.Baseline | None:
    """--baseline's benchmark, else the kept one of this arch and stack, else None (said)."""
    if given:
        engines: dict[str, object] = {}

        def eng():
            if "engine" not in engines:
                engines["engine"] = connect(engine)
            return engines["engine"]

        found = baseline_store.resolve(
            given, ws.reports_dir, image_id=lambda ref: eng().image_id(ref),
            registry_digest=lambda ref: eng().registry_digest(ref),
        )  # fmt: skip
        out.print(f"baseline: {found.source}", markup=False, highlight=False)
        return found
    kept = baseline_store.kept_dir(reports)
    if kept is None:
        out.print(f"no baseline for this arch and stack yet ({reports / baseline_store.KEPT}): "
                  "this run's benchmark becomes it if the run passes", markup=False)  # fmt: skip
        return None
    try:
        bench_doc = gate.load_bench(kept)
    except gate.BaselineError as exc:
        out.print(f"the kept baseline cannot be read ({exc}); comparing with nothing, and a "
                  "passing run replaces it", style="yellow", markup=False)  # fmt: skip
        return None
    out.print(f"baseline: the last passing run, {kept}", markup=False, highlight=False)
    return baseline_store.Baseline(bench_doc, f"the kept baseline ({kept})", kept)


def compare_with_baseline(
    base: baseline_store.Baseline, run_dir: Path, reports: Path, gates: list[gate.Gate],
    min_ratio: float, run_id: str | None = None,
) -> dict:  # fmt: skip
    """This run's bench.json against the baseline's; the document is written into the run folder
    (baseline-compare.json and .md) and moves into place with the report."""
    try:
        current = gate.load_bench(run_dir / "bench.json")
    except gate.BaselineError as exc:
        return {"passed": False, "failures": [f"this run's bench.json cannot be compared: {exc}"]}
    doc = gate.compare(base.bench, current, gates, min_ratio, baseline_source=base.source,
                       now_source=str(reports / "bench.json"), created=gate.now_iso())  # fmt: skip
    if run_id:
        doc["run_id"] = run_id
    gate.write(doc, run_dir / COMPARE_OUTPUTS[0], run_dir / COMPARE_OUTPUTS[1])
    return doc


def print_comparison(doc: dict, reports: Path) -> None:
    if "rows" not in doc:
        return
    out.print("\n".join(gate.table_lines(doc)), markup=False, highlight=False, soft_wrap=True)
    for note in doc["notes"]:
        out.print(f"note: {note}", style="yellow", markup=False, highlight=False)
    for unmatched in doc["unmatched_gates"]:
        out.print(f"note: the gate {unmatched} matched no result of this run", style="yellow",
                  markup=False, highlight=False)  # fmt: skip
    out.print(gate.headline(doc), style="green" if doc["passed"] else "bold red", markup=False,
              highlight=False)  # fmt: skip
    out.print(f"comparison: {reports / COMPARE_OUTPUTS[0]} (and .md)", markup=False)


def keep_or_not(
    passed: bool, reports: Path, base: baseline_store.Baseline | None, ref: str | None, eng,
    local: bool,
) -> None:  # fmt: skip
    """After a passing --bench run its report and bench become the kept baseline; after any
    other the kept one stays as it was."""
    if not passed:
        if baseline_store.kept_dir(reports) is not None:
            out.print("the kept baseline is unchanged: this run did not pass", markup=False)
        return
    bench_doc = json.loads((reports / "bench.json").read_text())
    kept = baseline_store.keep(reports, {
        "kind": "attnforge.baseline", "version": 1, "kept": gate.now_iso(),
        "bench_created": bench_doc.get("created"), "local": local, "image": ref,
        "image_id": eng.image_id(ref) if ref and eng else None,
        "compared_with": base.source if base else None,
    })  # fmt: skip
    out.print(f"kept as the baseline of the next --bench run: {kept}", markup=False)


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
    options={"path": text("FILE", positional=True), "arch": ARCH, "stack": STACK},
    help={
        "path": "the report.json to render, also given without the flag: invoke report FILE "
        "(default: the one of --arch and --stack)",
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
    writable_folder(path.parent, "the report's folder")
    proc = render(path, ws.root, html)
    if proc.returncode != 0:
        raise UserError(f"rendering {path} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    for line in proc.stderr.strip().splitlines():  # siblings left out, pictures not drawn
        out.print(line, style="yellow", markup=False, highlight=False)
    if html:  # the page is what was asked for: its path, not the Markdown again
        out.print(f"wrote {path.with_suffix('.html')} (and {path.with_suffix('.md')})",
                  markup=False, highlight=False)  # fmt: skip
        return
    out.print(path.with_suffix(".md").read_text(), markup=False, highlight=False)
