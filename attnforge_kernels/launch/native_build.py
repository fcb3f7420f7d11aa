"""Compiling the native launch path (attnforge_kernels/launch/replay.cpp; the loader is
attnforge_kernels/launch/replay.py): ``build()``, the compiler's flags, the cache folder and the
module's name.

This file needs only the standard library, torch and replay.cpp beside it, so it also runs on
its own, as a file: ``python3 native_build.py`` compiles the extension into the cache and prints
its path (exit status 1, with the compiler's first error lines, when it cannot). The validate
layer (dockerfiles/validate.Dockerfile) runs it that way before it copies the packages in, so an
edit anywhere else in them does not compile the extension again: the name, a hash of the
source, torch, Python and compiler, is the one the packages' loader looks for.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("replay.cpp")


def cache_dir() -> Path:
    """$ATTNFORGE_NATIVE_DIR, else $XDG_CACHE_HOME/attnforge/native (~/.cache/attnforge/native)."""
    if os.environ.get("ATTNFORGE_NATIVE_DIR"):
        return Path(os.environ["ATTNFORGE_NATIVE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "attnforge" / "native"


def _compiler() -> str | None:
    cxx = os.environ.get("CXX") or "c++"
    return shutil.which(cxx)


def _flags() -> tuple[list[str], list[str]]:
    """Compile and link flags for the installed torch (its headers and libraries)."""
    from torch.utils import cpp_extension

    abi = int(bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    inc = [f"-I{p}" for p in cpp_extension.include_paths()]
    inc.append(f"-I{sysconfig.get_paths()['include']}")
    libs = cpp_extension.library_paths()
    link = [f"-L{p}" for p in libs] + [f"-Wl,-rpath,{p}" for p in libs]
    link += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    return ["-O2", "-std=c++20", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            "-DTORCH_API_INCLUDE_EXTENSION_H", *inc], link  # fmt: skip


def _name(cxx: str) -> str:
    """The module's name: a hash of what its binary depends on."""
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (torch.__version__, sys.version, sysconfig.get_paths()["include"], cxx):
        h.update(b"\0" + str(part).encode())
    return f"attnforge_native_{h.hexdigest()[:16]}"


def build(quiet: bool = False, again: bool = False) -> Path:
    """The extension's path, compiled first where it is not in the cache. A build writes aside
    and renames, under a lock, so concurrent processes and an interrupted build leave no partial
    file. Raises RuntimeError with the compiler's first error lines; a failed build is noted
    beside it, so later processes (validate's workers, each step of a job) do not spend the
    compile again for the same source, torch and compiler until ``again`` (``python -m
    attnforge_kernels.native build``)."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError(f"no C++ compiler ({os.environ.get('CXX') or 'c++'}) on PATH")
    name = _name(cxx)
    out_dir = cache_dir()
    target = out_dir / f"{name}.so"
    failed = out_dir / f"{name}.failed"
    if target.exists():
        return target
    if failed.exists() and not again:
        raise RuntimeError(
            f"{failed.read_text().strip()} (an earlier build; `python -m attnforge_kernels.native build` "
            "tries again)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while this one waited
            return target
        if not quiet:
            print(f"attnforge: compiling the native launch path into {out_dir} (once; "
                  "about 30 s)", file=sys.stderr, flush=True)  # fmt: skip
        cflags, link = _flags()
        tmp = out_dir / f".{name}.{os.getpid()}.tmp.so"
        cmd = [cxx, *cflags, f"-DTORCH_EXTENSION_NAME={name}", str(SOURCE), "-o", str(tmp), *link]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                errors = [ln for ln in r.stderr.splitlines() if "error" in ln][:3]
                why = f"{Path(cxx).name} failed ({r.returncode}): " + (
                    "; ".join(errors) or r.stderr.strip()[-400:]
                )
                note = out_dir / f".{name}.{os.getpid()}.failed"
                note.write_text(why + "\n")
                os.replace(note, failed)
                raise RuntimeError(why)
            failed.unlink(missing_ok=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def main(prog: str = "attnforge native launch path") -> int:
    """``python3 native_build.py`` (and ``python -m attnforge_kernels.native build``): build now,
    again after a failure, and print the path; exit status 1 and why, on stderr, when it cannot."""
    try:
        print(build(again=True))
    except (RuntimeError, OSError) as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
