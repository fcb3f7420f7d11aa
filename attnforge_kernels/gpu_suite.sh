#!/usr/bin/env bash
# The whole NVIDIA GPU session of the kernels in one command (device tool or any CUDA box):
#   bash attnforge_kernels/gpu_suite.sh [check|memcheck|bench|all] [bench args...]
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
# check: the full grid (attention, dropout/FP8, packed/kv-cache) in 4 processes, and the quick
# grid with floating-point fusion off (ATTNFORGE_FP_FUSION=0: Triton 3.10's default, which the
# kernels do not take, attnforge_kernels/device/configs.py FP_FUSION) in a fifth; memcheck: the
# boundary shapes under compute-sanitizer in 2. Compiling is CPU work, so they share the GPU well;
# with "all" the two run side by side, and the benchmark runs alone afterwards.
check() {
    local pids=() i
    for i in 0 1 2 3; do
        "$PY" -m attnforge_kernels.check --shard $i/4 --json "$OUT/check-$i.json" > "$OUT/check-$i.log" 2>&1 &
        pids+=($!)
    done
    ATTNFORGE_FP_FUSION=0 "$PY" -m attnforge_kernels.check --quick --json "$OUT/check-nofusion.json" \
        > "$OUT/check-nofusion.log" 2>&1 &
    pids+=($!)
    local rc=0
    for i in "${pids[@]}"; do wait "$i" || rc=1; done
    return $rc
}
memcheck() {
    local pids=() i
    for i in 0 1; do
        compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
            "$PY" -m attnforge_kernels.check --boundary --shard $i/2 --json "$OUT/memcheck-$i.json" \
            > "$OUT/memcheck-$i.log" 2>&1 &
        pids+=($!)
    done
    local rc=0
    for i in "${pids[@]}"; do wait "$i" || rc=1; done
    return $rc
}
crc=0; mrc=0
case $what in
    check) check || crc=1 ;;
    memcheck) memcheck || mrc=1 ;;
    all) check & cpid=$!; memcheck & mpid=$!; wait $cpid || crc=1; wait $mpid || mrc=1 ;;
esac
if [[ $what == check || $what == all ]]; then
    echo "check: $(cat "$OUT"/check-*.log | grep -c '^pass') pass, $(cat "$OUT"/check-*.log | grep -c -E '^(fail|crash)') fail"
    grep -h -E '^(fail|crash)' "$OUT"/check-*.log | head -20
    [[ $crc == 0 ]] || rc=1
fi
if [[ $what == memcheck || $what == all ]]; then
    echo "memcheck rc=$mrc"; grep -h -E 'ERROR SUMMARY|not failed' "$OUT"/memcheck-*.log
    [[ $mrc == 0 ]] || rc=1
fi
if [[ $what == bench || $what == all ]]; then
    $PY -m attnforge_kernels.bench --json "$OUT/bench.json" "$@" > "$OUT/bench.log" 2>&1 || rc=1
    sed -n '/^| shape/,$p' "$OUT/bench.log"
    grep -i -E 'error|Traceback' "$OUT/bench.log" | head -5
fi
exit $rc
