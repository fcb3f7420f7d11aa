"""Runs a layer's smoke checks inside its freshly built image.

Sent to the container on stdin (`python3 - <checks-json>`), so it must stay stdlib-only and
self-contained. Prints one JSON line per check and exits 1 if any failed.
"""

import json
import subprocess
import sys
from importlib import metadata


def _canon(name):
    return name.lower().replace("_", "-").replace(".", "-")


def _installed():
    return {
        _canon(d.metadata["Name"]): d.version
        for d in metadata.distributions()
        if d.metadata["Name"]
    }


def check(spec, installed):
    if "dist" in spec:
        have = installed.get(_canon(spec["dist"]))
        if have is None:
            return False, f"{spec['dist']} is not installed"
        want = spec.get("version")
        if want and have != want:
            return False, f"{spec['dist']} is {have}, expected {want}"
        return True, f"{spec['dist']} {have}"
    if "absent" in spec:
        have = installed.get(_canon(spec["absent"]))
        if have is not None:
            return False, f"{spec['absent']} {have} is installed but must not be"
        return True, f"{spec['absent']} absent"
    if "torch_build" in spec:
        code = (
            "import torch, json; print(json.dumps({'hip': torch.version.hip, 'cuda': torch.version.cuda,"
            " 'version': torch.__version__}))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if out.returncode != 0:
            return False, "torch does not import: " + out.stderr.strip().splitlines()[-1:][
                0
            ] if out.stderr.strip() else "torch does not import"
        info = json.loads(out.stdout.strip().splitlines()[-1])
        built = "hip" if info["hip"] else "cuda" if info["cuda"] else "cpu"
        if built != spec["torch_build"]:
            return (
                False,
                f"torch {info['version']} is a {built} build, expected {spec['torch_build']}",
            )
        return True, f"torch {info['version']} ({built})"
    if "python" in spec:
        out = subprocess.run([sys.executable, "-c", spec["python"]], capture_output=True, text=True)
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).strip().splitlines()
            return False, lines[-1] if lines else f"exit {out.returncode}"
        return True, (out.stdout.strip().splitlines() or ["ok"])[-1]
    return False, "unknown check kind"


def main(argv):
    checks = json.loads(argv[1])
    installed = _installed()
    failed = 0
    for spec in checks:
        try:
            ok, detail = check(spec, installed)
        except Exception as exc:  # a broken check is a failed check, with its reason
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        failed += not ok
        print(json.dumps({"name": spec["name"], "ok": ok, "detail": detail}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
