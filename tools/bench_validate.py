"""Times `python -m validate` with the worker pool against one process per check (--isolate).

    python tools/bench_validate.py [--runs N] [--workers N] [--only-pool] [COMMAND ...]

COMMAND is a validate command line in quotes; the default is "all --quick" and "all", the two
numbers of issue 12 (targets on one H100/H200: 20 s and 90 s). Each command runs as a user runs
it, from the repo root with this Python, once per mode and run, the modes alternating so that
both see the same Triton cache; the table gives the median wall time, the checks and their
statuses, and the exit status, so a faster run that lost checks shows. Standard library only:
it runs where `python -m validate` runs (an image, a bare GPU host).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_COMMANDS = ("all --quick", "all")


def run_once(command: str, mode: list[str], report: Path) -> dict:
    argv = [sys.executable, "-m", "validate", *shlex.split(command), *mode, "--json", str(report)]
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    try:
        doc = json.loads(report.read_text())
    except (OSError, json.JSONDecodeError):
        doc = {"checks": [], "summary": {"counts": {}}, "observations": {}}
    return {"seconds": seconds, "rc": proc.returncode, "doc": doc, "stderr": proc.stderr}


def counts(doc: dict) -> str:
    c = doc.get("summary", {}).get("counts", {})
    return " ".join(f"{n} {k}" for k, n in c.items() if n) or "no report"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]),
    )
    parser.add_argument("commands", nargs="*", metavar="COMMAND", help="validate command lines")
    parser.add_argument("--runs", type=int, default=1, help="runs per mode (median reported)")
    parser.add_argument("--workers", type=int, default=1, help="--workers for the pool mode")
    parser.add_argument(
        "--only-pool", action="store_true", help="leave out the --isolate runs (the old way)"
    )
    args = parser.parse_args()
    modes = {"pool": ["--workers", str(args.workers)]}
    if not args.only_pool:
        modes["isolate"] = ["--isolate"]
    rows = []
    env_line = ""
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as tmp:
        for command in args.commands or DEFAULT_COMMANDS:
            results: dict[str, list[dict]] = {m: [] for m in modes}
            for i in range(args.runs):
                for mode, flags in modes.items():
                    res = run_once(command, flags, Path(tmp, f"{mode}-{i}.json"))
                    results[mode].append(res)
                    print(f"  {command} [{mode}] run {i + 1}: {res['seconds']:.1f} s", flush=True)
                    obs = res["doc"].get("observations", {})
                    if not env_line and obs:
                        env_line = (
                            f"torch {obs.get('torch.version')}, "
                            f"device arch {obs.get('torch.device_arch', 'cpu')}, "
                            f"GPU {obs.get('torch.gpu_available')}"
                        )
            for mode, runs in results.items():
                last = runs[-1]
                rows.append(
                    (
                        command,
                        mode,
                        statistics.median(r["seconds"] for r in runs),
                        len(last["doc"].get("checks", [])),
                        counts(last["doc"]),
                        last["rc"],
                    )
                )
    print(f"\n{env_line}; python {sys.version.split()[0]}")
    print(f"{'command':<16} {'mode':<8} {'wall s':>8} {'checks':>7}  exit  statuses")
    for command, mode, seconds, n, statuses, rc in rows:
        print(f"{command:<16} {mode:<8} {seconds:8.1f} {n:7d}  {rc:>4}  {statuses}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
