"""Names that the documents, the command lines and the checks share (standard library only).

Adding a backend is one ``Backend`` row here, plus the code that runs it (the bench's and the
stress child's dispatch on its name); the command lines, documents, plots and the stacks' matrix
take it from here. Adding a status is one constant and its place in the sets below (and, for a
check status, in validate/report.schema.json, which tests/unit/test_contract.py holds equal).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    """An attention backend as the documents name it (``name``) and as tables head it (``label``).

    ``sdpa``: the torch.nn.attention.SDPBackend it forces with sdpa_kernel (lower-case), or None
    (F.scaled_dot_product_attention's own pick, or not SDPA at all). ``column``: the key of its
    column in the stacks' matrix (attnforge/matrix.py), None where the matrix has no column.
    """

    name: str
    label: str
    sdpa: str | None = None
    column: str | None = None


# SDPA's forced backends first, most specific first (a profile showing several ops names the
# first one of this order), then SDPA's own pick, flash_attn, the bundled kernels and the
# bundled kernels behind F.scaled_dot_product_attention (ATTNFORGE_SDPA_SHIM=1).
BACKENDS: tuple[Backend, ...] = (
    Backend("sdpa.flash", "SDPA flash", sdpa="flash", column="flash"),
    Backend("sdpa.efficient", "SDPA efficient", sdpa="efficient", column="efficient"),
    Backend("sdpa.cudnn", "SDPA cuDNN", sdpa="cudnn", column="cudnn"),
    Backend("sdpa.math", "SDPA math", sdpa="math", column="math"),
    Backend("sdpa.default", "SDPA default", column="pick"),
    Backend("flash_attn", "flash_attn", column="flash_attn"),
    Backend("kernels", "bundled kernels", column="kernels"),
    Backend("kernels.sdpa_shim", "bundled kernels via the SDPA shim"),
)
BACKEND_NAMES: tuple[str, ...] = tuple(b.name for b in BACKENDS)
# The SDPA backends a case forces one by one (validate/grid.py), by their SDPBackend names.
SDPA_BACKENDS: tuple[str, ...] = tuple(b.sdpa for b in BACKENDS if b.sdpa)


def backend(name: str) -> Backend:
    """The backend of a document's name (KeyError for one this contract does not know)."""
    for b in BACKENDS:
        if b.name == name:
            return b
    raise KeyError(name)


MODES = ("fwd", "bwd", "fwd_bwd")
DTYPES = ("bf16", "fp16", "fp32")

# Statuses: one vocabulary, each document using the subset it needs. A check (report.json) and a
# stress run pass or fail; a benchmark timing is ok or errors (it judges speed, not results).
PASS, FAIL, SKIP, CRASH, TIMEOUT = "pass", "fail", "skip", "crash", "timeout"
UNSUPPORTED, OK, ERROR = "unsupported", "ok", "error"
CHECK_STATUSES = (PASS, FAIL, SKIP, CRASH, TIMEOUT)  # report.json "checks"
CASE_STATUSES = (PASS, FAIL, SKIP)  # what attnforge_kernels.check.run_case returns
RUN_STATUSES = (PASS, FAIL, CRASH, TIMEOUT, UNSUPPORTED)  # stress-*.json "runs"
BENCH_STATUSES = (OK, UNSUPPORTED, ERROR, CRASH, TIMEOUT)  # bench.json, bench_train.json "results"
# What a required check, a stress run or a timing must not end as, in every document.
FAILING = (FAIL, ERROR, CRASH, TIMEOUT)


# The documents a run writes beside report.json, each with its own version (docs/validation.md,
# "Report"), and the other documents attnforge writes.
BENCH = "attnforge.bench"
BENCH_TRAIN = "attnforge.bench_train"
STRESS = "attnforge.stress"
BASELINE_COMPARE = "attnforge.baseline_compare"
BASELINE = "attnforge.baseline"
BISECT = "attnforge.bisect"
BISECT_PROBE = "attnforge.bisect_probe"
EXPORT = "attnforge.export"
KIND_VERSIONS = {
    BENCH: 1,
    BENCH_TRAIN: 1,
    STRESS: 1,
    BASELINE_COMPARE: 1,
    BASELINE: 1,
    BISECT: 1,
    BISECT_PROBE: 1,
    EXPORT: 1,
}
# report.json has a schema version instead (validate/report.schema.json); its major must match.
REPORT_SCHEMA_VERSION = "1.2"
