"""Validates an image as build.py builds one: the plan first, then requests, then one engine.

`plan_validation` turns what the user asked for into a `Validation`: the report folder, the
expectations, and every `RunRequest` (the suite, then bench, bench-train and stress) made before
anything runs, so tests can read them and a recording engine can execute them. `execute` runs
them through an `Engine` (a container engine, or `engine.LocalEngine` for --local: this host's
Python behind the same interface) and keeps the promises of `invoke validate`:

- the new report and each tool's document are written into a dot folder beside the report
  folder and moved into place only once complete; a run that writes no report leaves the last
  one as it was;
- the image stamp (validated.json, what `invoke publish` trusts) is written only by a run that
  validated an image, and says whether it passed;
- the kept baseline (reports/<arch>/<stack>/baseline/) is replaced only by a passing --bench run.

cli/validate.py keeps the arguments and the printing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract import names

from . import hostinfo, multiarch
from .baseline import gate
from .baseline import store as baseline_store
from .engine import Engine, RunRequest
from .errors import UserError
from .mirror.use import refuse_rehearsal
from .plan import Options, Plan, aotriton_facts, resolve
from .recipes import Recipes
from .workspace import VALIDATED, Workspace

# TheRock dockerfiles/README.md: docker run --device=/dev/kfd --device=/dev/dri --ipc=host
# --group-add=video --group-add=render; ROCm's "Running ROCm Docker containers" page also
# advises --security-opt seccomp=unconfined (some HIP/HSA calls are blocked by the default profile).
OUTPUTS = ("report.json", "report.md")  # what the suite writes; moved into place together
COMPARE_OUTPUTS = ("baseline-compare.json", "baseline-compare.md")
LOG = "validate.log"
OUT = "/out"  # where the run folder is mounted in the image
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


# Thread-count variables a validation in an image takes from the host when set there. A container
# sees every host core (the engine limits CPU time, not what torch counts), so torch, OpenMP and
# MKL size their pools by the host; a CI runner that caps them with these variables (shared cores:
# several processes each spinning one thread per core wait on each other) keeps the cap inside.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def thread_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The host's THREAD_ENV variables that are set (for the image's runs)."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in THREAD_ENV if environ.get(k)}


@dataclass(frozen=True)
class ToolRun:
    """One of the suite's tools run after it (bench, bench-train, stress): what it writes."""

    name: str  # as the user reads it: "bench", "stress qwen-image"
    output: str  # the JSON document it writes, a file name beside report.json
    args: list[str]  # after the interpreter, with the output folder filled in

    def argv(self, python: str, out_dir: str) -> list[str]:
        return [python, *(a.replace("{out}", out_dir) for a in self.args)]


def tool_runs(
    bench: bool, stress: list[str], quick: bool, tiny: bool, timeout: int, stress_iters: int,
    backends: tuple[str, ...] = (),
) -> list[ToolRun]:  # fmt: skip
    """What runs after the suite: bench and bench-train with --bench (over ``backends``, default
    all), stress per workload. ``tiny`` (no GPU: the cpu stack) shrinks every shape, since CPU
    torch and Triton's interpreter would take hours at the real ones."""
    size = ["--tiny"] if tiny else (["--quick"] if quick else [])
    # bench's tiny sweep has a quick form too (one shape, the Triton interpreter's quickest):
    # --quick on the cpu stack keeps it, as it keeps the quick sweep on a GPU. bench-train's
    # tiny model has no smaller one.
    bench_size = [*size, "--quick"] if tiny and quick else size
    limit = ["--timeout", str(timeout)] if timeout else []
    limit += ["--backend", ",".join(backends)] if backends else []
    runs = []
    if bench:
        runs.append(
            ToolRun(
                "bench",
                "bench.json",
                ["-m", "validate", "bench", "--json", "{out}/bench.json", *bench_size, *limit],
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


def report_target(
    recipes: Recipes, plan: Plan, reports: Path, in_image: bool = True
) -> tuple[Path, dict[str, Any]]:
    """Where this run's outputs land and what the suite holds the image to. A multi-arch set is
    validated per member, on its GPU: this host's member gets its own folder under the set's
    (reports/<set>/<stack>/<member>/) and its own expectations and torch limits."""
    arch = recipes.arches[plan.arch]
    member = None
    if isinstance(arch, multiarch.ArchSet):
        member = multiarch.host_member(arch, hostinfo.default_arch()[0])
        reports = multiarch.member_reports(reports, member)
    expect = expect_document(recipes, plan, shown_as=reports / "expect.json", in_image=in_image)
    if member:
        expect.update(arch=member, expect=multiarch.member_expect(recipes, plan, member))
        limits = recipes.arches[member].sdpa_limits  # what this member's torch refuses
        if limits:
            expect["sdpa_limits"] = limits.model_dump()
    return reports, expect


def stack_gates(recipes: Recipes, stack: str) -> tuple[list[gate.Gate], float]:
    """The stack's bench_gates (recipes/stacks.yaml) as gates, and their default threshold."""
    spec = recipes.stacks[stack].bench_gates
    if spec is None:
        return [], gate.DEFAULT_MIN_RATIO
    gates = [gate.Gate(g.backend, g.shape, g.mode, g.min_ratio) for g in spec.gates]
    return gates, spec.min_ratio


@dataclass(frozen=True)
class Validation:
    """One validation, planned: where it writes, what it holds the image to, and every request
    it will hand the engine, in order."""

    reports: Path  # reports/<arch>/<stack>[/<member>]: where the outputs land
    run_dir: Path  # the dot folder the new outputs are written into first
    image: str | None  # the image validated; None for --local (nothing is stamped)
    expect: dict[str, Any]
    suite: RunRequest
    tools: tuple[tuple[ToolRun, RunRequest], ...] = ()
    bench: bool = False
    base: baseline_store.Baseline | None = None
    gates: tuple[gate.Gate, ...] = ()
    min_ratio: float = gate.DEFAULT_MIN_RATIO
    run_id: str | None = None  # stamped on every document of the run (ATTNFORGE_RUN_ID)

    @property
    def requests(self) -> list[RunRequest]:
        return [self.suite, *(req for _, req in self.tools)]


def plan_validation(
    reports: Path, expect: dict[str, Any], *, image: str | None, quick: bool, timeout: int,
    runs: list[ToolRun], flags: dict | None = None, env: dict[str, str] | None = None,
    bench: bool = False, base: baseline_store.Baseline | None = None,
    gates: tuple[gate.Gate, ...] | list[gate.Gate] = (), min_ratio: float = gate.DEFAULT_MIN_RATIO,
    run_id: str | None = None,
) -> Validation:  # fmt: skip
    """The requests of one validation, before anything runs. The run folder is mounted at /out;
    an image of `image` runs them with its python3 (a local engine maps both to this host)."""
    flags = flags or device_flags("cpu")
    run_dir = reports / f".run-{os.getpid()}"
    from validate.report import RUN_ID_ENV  # the suite's own name for it: stdlib only

    env = {**(env or {}), **({RUN_ID_ENV: run_id} if run_id else {})}
    common = dict(
        image=image or "", devices=list(flags["devices"]), groups=list(flags["groups"]),
        extra=list(flags["extra"]), env=env, mounts=[(run_dir.resolve(), OUT, False)],
    )  # fmt: skip
    suite = RunRequest(
        command=["python3", *suite_args(f"{OUT}/report.json", f"{OUT}/report.md",
                                       f"{OUT}/expect.json", quick, timeout)],
        **common,
    )  # fmt: skip
    tools = tuple((t, RunRequest(command=t.argv("python3", OUT), **common)) for t in runs)
    return Validation(reports, run_dir, image, expect, suite, tools, bench, base, tuple(gates),
                      min_ratio, run_id)  # fmt: skip


@dataclass
class Result:
    """What a validation did; the outputs are in `reports` already."""

    code: int  # the suite's exit status
    codes: dict[str, int] = field(default_factory=dict)  # each tool's
    failures: list[str] = field(default_factory=list)  # one sentence each, besides the suite's
    compared: dict | None = None  # the comparison with the baseline, when there was one
    benched: bool = False  # this run wrote a bench.json
    kept: Path | None = None  # the baseline this run became (passing --bench runs only)

    @property
    def passed(self) -> bool:
        return self.code == 0 and not self.failures


Progress = Callable[[str, str], None]  # (event, detail): ("line", text) or ("tool", name)


def execute(v: Validation, engine: Engine, progress: Progress | None = None) -> Result:
    """Run the planned requests on `engine` and move the complete outputs into place; a
    UserError (the last report untouched) when the suite wrote no report."""
    notify = progress or (lambda event, detail: None)
    reports, run_dir = v.reports, v.run_dir
    reports.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir()
    try:
        (run_dir / "expect.json").write_text(json.dumps(v.expect, indent=2) + "\n")
        log = run_dir / LOG
        with log.open("w") as fh:
            code = engine.run_streaming(v.suite, fh, on_line=lambda line: notify("line", line))
        result = Result(code)
        if (run_dir / "report.json").exists():
            for t, req in v.tools:
                notify("tool", t.name)
                with log.open("a") as fh:
                    result.codes[t.name] = engine.run_streaming(
                        req, fh, on_line=lambda line: notify("line", line)
                    )
        if log.exists():
            os.replace(log, reports / LOG)
        if not (run_dir / "report.json").exists():
            raise UserError(
                f"the suite wrote no report (exit {code}); see {reports / LOG}; "
                "the previous report, if any, is unchanged"
            )
        runs = [t for t, _ in v.tools]
        result.failures = tool_failures(runs, result.codes, run_dir)
        result.benched = v.bench and (run_dir / "bench.json").exists()
        if result.benched and v.base is not None:
            result.compared = compare_with_baseline(
                v.base, run_dir, reports, list(v.gates), v.min_ratio, v.run_id
            )
            result.failures += [
                f"below the baseline: {s}" for s in result.compared.get("failures", [])
            ]
        outputs = (*(t.output for t in runs), *(COMPARE_OUTPUTS if result.compared else ()))
        if v.image:
            stamp(v, engine, result, run_dir, outputs)
        move_into_place(run_dir, reports, stamped=bool(v.image), extra=outputs)
        if result.benched and not result.compared:  # the last comparison was of the bench replaced
            for name in COMPARE_OUTPUTS:
                (reports / name).unlink(missing_ok=True)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if result.benched and result.passed:
        result.kept = keep_baseline(v, engine)
    return result


def stamp(v: Validation, engine: Engine, result: Result, run_dir: Path, outputs) -> None:
    """What `invoke publish` checks: this very image passed (image ids, not tags, which move);
    `documents` lets it tell this run's bench.json from a later --local one's."""
    assert v.image is not None
    documents = {name: baseline_store.sha256_file(run_dir / name)
                 for name in ("report.json", *outputs) if (run_dir / name).is_file()}  # fmt: skip
    compared = result.compared
    (run_dir / VALIDATED).write_text(json.dumps(
        {"image": v.image, "image_id": engine.image_id(v.image), "exit": result.code,
         "passed": result.passed, "tools": result.codes, "documents": documents,
         "baseline": ({"source": v.base.source, "passed": compared.get("passed")}
                      if compared and v.base else None)}, indent=2) + "\n")  # fmt: skip


def move_into_place(
    run_dir: Path, reports: Path, stamped: bool, extra: tuple[str, ...] = ()
) -> None:
    """The new report replaces the old one only now that it is complete; so does each tool's
    document this run wrote (one it did not write leaves the last one). A --local run validated
    no image, so it leaves the image stamp (what `invoke publish` trusts) as it was."""
    for name in (*OUTPUTS, "expect.json", *extra):
        if (run_dir / name).exists():
            os.replace(run_dir / name, reports / name)
    if stamped:
        os.replace(run_dir / VALIDATED, reports / VALIDATED)


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


def keep_baseline(v: Validation, engine: Engine) -> Path:
    """A passing --bench run's report and bench become the kept baseline (swapped in whole)."""
    bench_doc = json.loads((v.reports / "bench.json").read_text())
    return baseline_store.keep(v.reports, {
        "kind": names.BASELINE, "version": names.KIND_VERSIONS[names.BASELINE], "kept": gate.now_iso(),
        "bench_created": bench_doc.get("created"), "local": v.image is None, "image": v.image,
        "image_id": engine.image_id(v.image) if v.image else None,
        "compared_with": v.base.source if v.base else None,
    })  # fmt: skip


# ---------------------------------------------------------------------------- the stamp's policy
# What lets an image leave this machine (publish, export): the stamp `stamp` wrote for that very
# image id, passed; for an arch set, every member's.


def single_validation(
    ws: Workspace, arch: str, stack: str, final: str, final_id: str, done: str = "published"
) -> dict:
    """The stamp `invoke validate` left for this very image, or a UserError saying why not and
    that the image is not `done` with (published, exported)."""
    stamp_file = ws.validated_stamp(arch, stack)
    if not stamp_file.exists():
        raise UserError(
            f"{final} was never validated here; it is not {done}",
            hint=f"invoke validate --arch {arch} --stack {stack}",
        )
    record = json.loads(stamp_file.read_text())
    if record.get("image_id") != final_id:
        raise UserError(
            f"{final} changed since it was validated (validated {str(record.get('image_id'))[:19]}, now {final_id[:19]}); it is not {done}",
            hint=f"invoke validate --arch {arch} --stack {stack}",
        )
    if not record.get("passed"):
        raise UserError(
            f"{final} failed validation (exit {record.get('exit')}); it is not {done}",
            hint=f"see {ws.reports_for(arch, stack) / 'report.md'}",
        )
    return record


def set_validation(
    ws: Workspace, arch: multiarch.ArchSet, stack: str, final: str, final_id: str
) -> dict:
    """One image for several arches leaves only when every member passed on it."""
    reports = ws.reports_for(arch.name, stack)
    stamps = {}
    for m in arch.members:
        path = multiarch.member_reports(reports, m.name) / VALIDATED
        stamps[m.name] = json.loads(path.read_text()) if path.is_file() else None
    why = multiarch.publish_refusals(final_id, stamps)
    if why:
        raise UserError(
            f"{final} is not published: {'; '.join(why)}",
            hint=f"run `invoke validate --arch {arch.name} --stack {stack}` on a GPU of each "
            "arch it lists",
        )
    return {"image": final, "image_id": final_id, "passed": True, "members": stamps}


def validated_image(
    ws: Workspace, recipes: Recipes, eng: Engine, arch: str, stack: str, namespace: str,
    done: str = "published",
) -> tuple[str, str, dict]:  # fmt: skip
    """(final tag, image id, validation record) of a stack whose final image passed `invoke
    validate`, or a UserError saying why it is not `done` (published, exported)."""
    final = resolve(recipes, arch, stack, Options(namespace=namespace)).final_tag
    final_id = eng.image_id(final) if final else None
    if final_id is None:
        raise UserError(f"no image {final}", hint=f"invoke build --arch {arch} --stack {stack}")
    refuse_rehearsal(eng.labels(final), final, done)
    if isinstance(recipes.arches[arch], multiarch.ArchSet):
        return final, final_id, set_validation(ws, recipes.arches[arch], stack, final, final_id)
    return final, final_id, single_validation(ws, arch, stack, final, final_id, done)
