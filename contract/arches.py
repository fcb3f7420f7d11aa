"""The facts of recipes/arches.yaml, as code in the images reads them (standard library only).

The images carry a JSON rendering of recipes/arches.yaml as ``contract/arches.json``, written when
the validate layer's build context is staged (attnforge/build.py), so that nothing in an image
needs PyYAML; ``$ATTNFORGE_ARCHES_JSON`` names another rendering. A source tree has none: there
the YAML is read by the caller (attnforge_kernels.device.configs.arch_facts, with PyYAML) and handed
to ``from_mapping``. Families come from these facts (an arch's own entry, else the `neighbours:`
entry that lists it), never from a guess on the name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JSON_NAME = "arches.json"
ENV = "ATTNFORGE_ARCHES_JSON"


@dataclass(frozen=True)
class ArchFacts:
    """recipes/arches.yaml's `arches:` (name -> facts) and `neighbours:` (arches it lacks)."""

    arches: Mapping[str, Mapping[str, Any]]
    neighbours: tuple[Mapping[str, Any], ...] = field(default=())

    def neighbour(self, name: str) -> Mapping[str, Any] | None:
        """The `neighbours:` entry listing an arch the recipes lack, if any."""
        return next((n for n in self.neighbours if name in n.get("arches", ())), None)

    def family(self, target: str) -> str | None:
        """The family of a target id (``gfx1151``, ``gfx942:sramecc+:xnack-``): the arch's own,
        else its neighbour's; None for an arch the facts do not know."""
        name = target.split(":")[0].strip().lower()
        if name in self.arches:
            return self.arches[name].get("family")
        n = self.neighbour(name)
        return n.get("family") if n else None


def from_mapping(data: Mapping[str, Any]) -> ArchFacts:
    """The facts of a parsed arches.yaml (or of its JSON rendering)."""
    return ArchFacts(dict(data.get("arches") or {}), tuple(data.get("neighbours") or ()))


def render(data: Mapping[str, Any]) -> str:
    """The JSON rendering of a parsed arches.yaml that the images carry."""
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def rendered_path() -> Path:
    """Where this process looks for the rendering: $ATTNFORGE_ARCHES_JSON, else beside this module."""
    return Path(os.environ.get(ENV) or Path(__file__).with_name(JSON_NAME))


def load() -> ArchFacts | None:
    """The facts from the rendering, or None where there is none (a source tree)."""
    path = rendered_path()
    if not path.is_file():
        return None
    try:
        return from_mapping(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a rendering of recipes/arches.yaml ({exc})") from None
