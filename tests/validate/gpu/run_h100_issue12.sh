#!/usr/bin/env bash
# Issue 12 on one NVIDIA GPU, from the repo root (OUT = output folder; the device tool sets it).
#   tests/validate/gpu/run_h100_issue12.sh [PART...]    parts: speed stress train bench (default: all)
# speed  `validate all` from an empty Triton cache (4 workers: compiling is CPU work), then
#        `validate all` and `validate all --quick` with the cache warm (one worker), with their
#        reports: the numbers of docs/benchmarks.md.
# stress the Qwen-Image stress of every backend (1000 iterations); train: bench-train; bench:
#        validate bench --quick; all three written as the report's sibling files, which
#        `invoke report --html` draws.
set -u
OUT=${OUT:-/tmp/validate-gpu}
PY=${PY:-python3}
D=$OUT/reports
mkdir -p "$D"
export PYTHONUNBUFFERED=1
PARTS=${*:-speed stress train bench}
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
    # Cold: an empty Triton cache, as on a fresh runner; compiling is CPU work, so 4 workers.
    timed "all --workers 4, cold cache" "$PY" -m validate all --workers 4 --timeout 240 \
      --json "$D/all-cold.json" > "$OUT/all-cold.log" 2>&1
    tail -1 "$OUT/all-cold.log"
    # Warm: what a runner with its cache kept pays, one worker (the default).
    timed "all, warm cache" "$PY" -m validate all --timeout 240 --json "$D/report.json" \
      --md "$D/report.md" > "$OUT/all-warm.log" 2>&1
    tail -1 "$OUT/all-warm.log"
    timed "all --quick, warm cache" "$PY" -m validate all --quick --timeout 240 \
      --json "$D/quick.json" > "$OUT/quick.log" 2>&1
    tail -1 "$OUT/quick.log"
  fi
  if want stress; then
    timed "stress qwen-image x1000" timeout 300 "$PY" -m validate stress --workload qwen-image \
      --backend all --iters 1000 --check-every 10 --json "$D/stress-qwen-image.json"
  fi
  if want train; then
    timed "bench-train" timeout 150 "$PY" -m validate bench-train --json "$D/bench_train.json"
  fi
  if want bench; then
    timed "bench --quick" timeout 240 "$PY" -m validate bench --quick --json "$D/bench.json"
  fi
} 2>&1 | tee "$OUT/log.txt"
