#!/usr/bin/env bash
# Issue 12 on one NVIDIA GPU, from the repo root (OUT = output folder; the device tool sets it).
#   tests/validate/gpu/run_h100_issue12.sh [PART...]    parts: speed tools (default: both)
# speed  `validate all --quick` and `validate all` through the worker pool, each twice (the first
#        run fills the Triton cache, as a CI runner's first job does; the second is what a warm
#        runner pays), with their reports: the numbers of docs/benchmarks.md.
# tools  bench (--quick), bench-train, and the Qwen-Image stress of every backend (1000 its),
#        written as the sibling files of the report so that `invoke report --html` draws them.
set -u
OUT=${OUT:-/tmp/validate-gpu}
PY=${PY:-python3}
D=$OUT/reports
mkdir -p "$D"
export PYTHONUNBUFFERED=1
PARTS=${*:-speed tools}
want() { [[ " $PARTS " == *" $1 "* ]]; }
timed() {  # timed LABEL CMD...: run, print the wall time and the exit status
  local label=$1 s e; shift
  s=$EPOCHREALTIME; "$@"; local rc=$?; e=$EPOCHREALTIME
  awk -v l="$label" -v s="$s" -v e="$e" -v rc="$rc" 'BEGIN { printf "%s: %.1f s, exit %d\n", l, e - s, rc }' \
    | tee -a "$OUT/times.txt"
}
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  if want speed; then
    for run in 1 2; do
      timed "all --quick, run $run" "$PY" -m validate all --quick --timeout 240 \
        --json "$D/quick-$run.json" > "$OUT/quick-$run.log" 2>&1
      tail -1 "$OUT/quick-$run.log"
    done
    for run in 1 2; do
      timed "all, run $run" "$PY" -m validate all --timeout 240 --json "$D/report.json" \
        --md "$D/report.md" > "$OUT/all-$run.log" 2>&1
      tail -1 "$OUT/all-$run.log"
    done
  fi
  if want tools; then
    timed "bench --quick" "$PY" -m validate bench --quick --json "$D/bench.json"
    timed "bench-train" "$PY" -m validate bench-train --json "$D/bench_train.json"
    timed "stress qwen-image x1000" "$PY" -m validate stress --workload qwen-image --backend all \
      --iters 1000 --check-every 10 --json "$D/stress-qwen-image.json"
  fi
} 2>&1 | tee "$OUT/log.txt"
