"""The `{name}` templates of recipe values, filled for one arch, variant and layer.

Shared by the planner (a layer's args, pins, expectations and smoke checks) and by arch sets
(each member's smoke checks and expectations), so it sits below both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .recipes import Arch, Layer

_TEMPLATE = re.compile(r"{(\w+)}")


class Gated(Exception):
    """A layer cannot be built for this arch; the message says why (from the data)."""


def render(
    values: Mapping[str, Any], tvars: Mapping[str, Any], where: str, strict: bool = True
) -> dict[str, Any]:
    """Fill {name} templates. Strict: every name must have a value for this arch (else Gated);
    lenient (smoke code): only known names are filled, other braces are left alone."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(value, str):
            out[key] = value
            continue
        if strict:
            missing = [n for n in _TEMPLATE.findall(value) if tvars.get(n) is None]
            if missing:
                raise Gated(f"{where}.{key} needs {{{missing[0]}}}, which this arch does not have")

        def fill(m: re.Match[str]) -> str:
            name = m.group(1)
            return str(tvars[name]) if tvars.get(name) is not None else m.group(0)

        out[key] = _TEMPLATE.sub(fill, value)
    return out


def template_vars(arch: Arch, variant: str | None, layer: Layer, jobs: int) -> dict[str, Any]:
    """The names a layer's templates may use, for one arch (or arch set) and variant."""
    status = arch.aotriton_status(layer.aotriton_for(variant))
    return {
        "arch": getattr(arch, "targets", arch.name),  # an ArchSet: its members, ';'-joined
        "family": arch.family,
        "vendor": arch.vendor,
        "wave_size": arch.wave_size,
        "therock_extra": arch.therock_extra,
        "variant": variant,
        "jobs": jobs,
        "aotriton_status": status,
        "aotriton": layer.aotriton_for(variant) or "",
        "aotriton_experimental": "1" if status == "experimental" else "0",
        "harmful_code_variants": " ".join(
            arch.harmful_code_variants.variants if arch.harmful_code_variants else ()
        ),
    }
