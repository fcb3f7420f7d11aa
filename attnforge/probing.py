"""What attnforge learns by running its probe (attnforge/image/envprobe.py) in an image or in a
Python, and by reading an image's Debian package list: the probing behind export, verify-env and
publish's SBOM, kept out of the tasks so that they hold arguments and printing only."""

from __future__ import annotations

import functools
import json
import subprocess
import tempfile
from pathlib import Path

from .engine import Engine, RunRequest
from .errors import UserError


@functools.cache
def probe_source() -> str:
    """envprobe's source, sent to a Python on stdin."""
    from .image import envprobe

    return Path(envprobe.__file__).read_text()


def probe_image(eng: Engine, image: str, *flags: str) -> dict:
    """envprobe's document for the image's Python (the script goes in on stdin)."""
    proc = eng.run(
        RunRequest(image=image, command=["python3", "-", *flags], stdin=True, network="none"),
        input=probe_source(),
        timeout=600,
    )
    if proc.returncode != 0:
        raise UserError(f"probing the Python of {image} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def probe_python(python: str, *flags: str) -> dict:
    """envprobe's document for a Python on this host, run outside the tree (its packages would
    shadow the environment's)."""
    proc = subprocess.run(
        [python, "-", *flags], input=probe_source(), capture_output=True, text=True,
        cwd=tempfile.gettempdir(),
    )  # fmt: skip
    if proc.returncode != 0:
        raise UserError(f"probing {python} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def dpkg_status(eng: Engine, image: str) -> str:
    """The image's /var/lib/dpkg/status (what the SBOM lists of its Debian packages)."""
    dpkg = eng.run(RunRequest(image=image, command=["cat", "/var/lib/dpkg/status"],
                              network="none"), timeout=300)  # fmt: skip
    if dpkg.returncode != 0:
        raise UserError(
            f"no SBOM: reading /var/lib/dpkg/status in {image} failed; nothing was published"
        )
    return dpkg.stdout
