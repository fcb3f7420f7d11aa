"""``python -m kernels.native build|status``: attnforge's native launch path (kernels/_native.py,
kernels/native.cpp) compiled now, or whether calls use it and why not."""

from __future__ import annotations

import sys

from ._native import build, status


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m kernels.native",
        description="Build or check attnforge's native launch path (kernels/native.cpp).",
    )
    ap.add_argument("action", choices=["build", "status"],
                    help="build: compile it into the cache now (an image's build step); status: "
                         "whether calls use it, and why not")  # fmt: skip
    args = ap.parse_args(argv)
    if args.action == "build":
        try:
            print(build(again=True))
        except (RuntimeError, OSError) as err:
            print(f"kernels.native: {err}", file=sys.stderr)
            return 1
        return 0
    state = status()
    print(state)
    return 0 if state == "active" else 1


if __name__ == "__main__":
    sys.exit(main())
