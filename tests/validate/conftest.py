"""Shared helpers for the validate tests: running the CLI and a small JSON Schema checker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMA = json.loads((REPO / "validate" / "report.schema.json").read_text())


def run_validate(*args: str, env: dict | None = None, cwd: Path = REPO, timeout: float = 240):
    """Run ``python -m validate ARGS`` as a user would; returns the CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    full_env.pop("VALIDATE_EXTRA_CHECKS", None)
    full_env.pop("VALIDATE_PRELUDE", None)
    full_env.pop("USE_HUB_KERNELS", None)  # transformers' Hub switch: a test sets it, not the host
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "validate", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def schema_errors(value, schema=SCHEMA, path="$", root=SCHEMA) -> list[str]:
    """The subset of JSON Schema that report.schema.json uses (no third-party validator here)."""
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        return schema_errors(value, root["$defs"][name], path, root)
    errors: list[str] = []
    if "oneOf" in schema:
        ok = [s for s in schema["oneOf"] if not schema_errors(value, s, path, root)]
        return [] if len(ok) == 1 else [f"{path}: matches {len(ok)} of oneOf"]
    types = schema.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        pytypes = {
            "object": dict,
            "array": list,
            "string": str,
            "boolean": bool,
            "null": type(None),
            "integer": int,
            "number": (int, float),
        }
        fits = any(
            isinstance(value, pytypes[t])
            and not (t in ("integer", "number") and isinstance(value, bool))
            for t in types
        )
        if not fits:
            return [f"{path}: {type(value).__name__} is not {types}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        errors.append(f"{path}: {value} < {schema['minimum']}")
    if "pattern" in schema and isinstance(value, str):
        import re

        if not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing {key}")
        props = schema.get("properties", {})
        for key, sub in value.items():
            if key in props:
                errors += schema_errors(sub, props[key], f"{path}.{key}", root)
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += schema_errors(sub, schema["additionalProperties"], f"{path}.{key}", root)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += schema_errors(item, schema["items"], f"{path}[{i}]", root)
    return errors


@pytest.fixture
def fixture_report():
    return json.loads((FIXTURES / "h200_report.json").read_text())


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(name="run_validate", scope="session")
def run_validate_fixture():
    return run_validate


@pytest.fixture(name="schema_errors", scope="session")
def schema_errors_fixture():
    return schema_errors
