#!/usr/bin/env bash
# Issue 13 on one NVIDIA GPU (device tool or any CUDA box), from the repo root:
#   bash attnforge_kernels/gpu_features.sh [check] [bench]       (default: both)
# check  the full dropout/FP8 and packed/kv-cache grids (attnforge_kernels/checks/grids.py:
#        variant_grid, kvcache_grid) in 4 processes (compiling is CPU work), and memcheck over
#        their boundary shapes in 2 more, all at once; a table of what did not pass.
# bench  the backward tile candidates for Hopper (ATTNFORGE_KERNELS_CONFIG variants) against the
#        defaults, SDPA-flash and cuDNN on the fwd+bwd shapes, and two forward tiles.
# Everything lands in $OUT; results.tar holds the JSON and logs.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attnforge-kernels-features}
PY=${PYTHON:-python3}
mkdir -p "$OUT/k"
WHAT=${*:-check bench}
want() { [[ " $WHAT " == *" $1 "* ]]; }
# names GRID I N: every Nth case (from the Ith) of GRID (grid or grid_boundary), as --case flags
names() {
  "$PY" - "$@" <<'PY'
import sys
from attnforge_kernels.checks import grids as g
grid, i, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if grid == "grid":
    cases = g.variant_grid(False) + g.kvcache_grid(False)
else:
    cases = g.variant_boundary() + g.kvcache_boundary()
print(" ".join("--case " + c.name for c in cases[i::n]))
PY
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/k/device.txt"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/k/device.txt"
if want check; then
  start=$SECONDS
  for i in 0 1 2 3; do
    # shellcheck disable=SC2046  # one word per flag and case name
    timeout 420 "$PY" -m attnforge_kernels.check $(names grid $i 4) --json "$OUT/k/check-$i.json" \
      > "$OUT/k/check-$i.log" 2>&1 &
  done
  for i in 0 1; do
    # shellcheck disable=SC2046
    timeout 420 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
      "$PY" -m attnforge_kernels.check $(names boundary $i 2) --json "$OUT/k/memcheck-$i.json" \
      > "$OUT/k/memcheck-$i.log" 2>&1 &
  done
  wait
  echo "check + memcheck: $((SECONDS - start)) s"
  for f in "$OUT"/k/check-*.log "$OUT"/k/memcheck-*.log; do
    echo "$(basename "$f"): $(tail -n 1 "$f")"; grep -E '^(fail|crash)' "$f" | head -5
    grep -E 'ERROR SUMMARY' "$f"
  done
fi
if want bench; then
  timeout 240 "$PY" -m attnforge_kernels.bench --mode fwd+bwd --no-memory \
    --variant 'kv32x128w4s3={"bwd_kv":[32,128,4,3]}' \
    --variant 'kv32x128w8s3={"bwd_kv":[32,128,8,3]}' \
    --variant 'kv64x128w8s2={"bwd_kv":[64,128,8,2]}' \
    --variant 'kv64x64w4s3={"bwd_kv":[64,64,4,3]}' \
    --variant 'q128x32w4s3={"bwd_q":[128,32,4,3]}' \
    --json "$OUT/k/bench-bwd.json" > "$OUT/k/bench-bwd.log" 2>&1
  sed -n '/^| shape/,$p' "$OUT/k/bench-bwd.log"
  timeout 150 "$PY" -m attnforge_kernels.bench --mode fwd --no-memory \
    --variant 'f128x128w8s3={"fwd":[128,128,8,3]}' \
    --variant 'f128x128w8s2={"fwd":[128,128,8,2]}' \
    --json "$OUT/k/bench-fwd.json" > "$OUT/k/bench-fwd.log" 2>&1
  sed -n '/^| shape/,$p' "$OUT/k/bench-fwd.log"
fi
tar -C "$OUT" -cf "$OUT/results.tar" k
