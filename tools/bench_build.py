"""Times the planner and a no-op build, the two numbers docs/benchmarks.md tracks for the foundation.

    .venv/bin/python tools/bench_build.py [--runs N] [build args for the no-op, e.g. --base-image ...]

It runs `invoke build --arch gfx1151 --dry-run` and `invoke build --arch cpu ...` (expecting every
layer cached: build the cpu stack once first) as a user would, and prints the median wall time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wall(argv: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *argv], cwd=ROOT, capture_output=True, text=True
    )
    return time.perf_counter() - start, proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args, build_args = parser.parse_known_args()
    rows = []
    for label, argv in (
        ("dry-run gfx1151 (default stack)", ["build", "--arch", "gfx1151", "--dry-run"]),
        ("no-op build cpu (all cached)", ["build", "--arch", "cpu", *build_args]),
    ):
        times = []
        for _ in range(args.runs):
            seconds, proc = wall(argv)
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr, file=sys.stderr)
                return 1
            if "build" in argv and "--dry-run" not in argv and "built" in proc.stdout:
                print(
                    "a layer was rebuilt: build the cpu stack once before timing the no-op",
                    file=sys.stderr,
                )
                return 1
            times.append(seconds)
        rows.append((label, statistics.median(times), min(times), max(times)))
    print(f"{'what':38} {'median s':>9} {'min s':>7} {'max s':>7}")
    for label, med, lo, hi in rows:
        print(f"{label:38} {med:9.2f} {lo:7.2f} {hi:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
