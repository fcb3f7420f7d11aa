#!/usr/bin/env bash
# The whole NVIDIA GPU session of the kernels in one command (device tool or any CUDA box):
#   bash kernels/gpu_suite.sh [check|memcheck|bench|all] [bench args...]
# Logs and JSON go to $OUT (default /tmp/attnforge-kernels-gpu); a short table is printed last.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/attnforge-kernels-gpu}
mkdir -p "$OUT"
what=${1:-all}
shift || true
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
date -u +%FT%TZ | tee -a "$OUT/device.txt"
rc=0
if [[ $what == check || $what == all ]]; then
    $PY -m kernels.check --json "$OUT/check.json" > "$OUT/check.log" 2>&1 || rc=1
    grep -c '^pass' "$OUT/check.log" | sed 's/^/check pass: /'
    grep -v '^pass' "$OUT/check.log" | tail -20
fi
if [[ $what == memcheck || $what == all ]]; then
    compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
        $PY -m kernels.check --boundary --json "$OUT/memcheck_cases.json" > "$OUT/memcheck.log" 2>&1
    mrc=$?
    echo "memcheck rc=$mrc"; grep -E 'ERROR SUMMARY|not failed' "$OUT/memcheck.log" | tail -3
    [[ $mrc == 0 ]] || rc=1
fi
if [[ $what == bench || $what == all ]]; then
    $PY -m kernels.bench --json "$OUT/bench.json" "$@" > "$OUT/bench.log" 2>&1 || rc=1
    sed -n '/^| shape/,$p' "$OUT/bench.log"
    grep -i -E 'error|Traceback' "$OUT/bench.log" | head -5
fi
exit $rc
