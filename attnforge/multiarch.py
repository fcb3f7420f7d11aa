"""One image for several arches: `--arch gfx1151,gfx1100` (or `--arch family:rdna3`).

Publishers ship one image with device code for several gfx targets (vLLM's ROCm base image,
TheRock's release images). Here an arch set is one more entry of the recipes' arches, an
`ArchSet`, so planning, building, validating and publishing take it where they take an arch:

- its name, the members sorted and joined by "_" (gfx1100_gfx1151), is what image tags, report
  folders and the cache key (`BuildInput.arch`) carry: another set is another image;
- `{arch}` in build args renders as the members joined by ";" (PYTORCH_ROCM_ARCH, GPU_ARCHS,
  AOTRITON_TARGET_ARCH and CK's GPU_TARGETS all take that list) and `{therock_extra}` as the
  members' pip extras joined by "," (`torch[device-gfx1100,device-gfx1151]`);
- a layer or variant is gated in for the set only where every member is (recipes.selectors_match);
- AOTriton's experimental knob is set where any member needs it (it only enables arches that
  AOTriton marks experimental, so it changes nothing for the others);
- every smoke check that names the arch runs once per member, so the device-code check requires
  each arch's code objects in the one image;
- each member has its own expectations, and validation runs per member on that member's GPU,
  leaving one stamp per member; `invoke publish` pushes the set's image only when every member's
  stamp passed on that exact image id.

Builds of ROCm sets need AMD's indexes and validation needs each GPU: unverified here (no AMD GPU
or AMD index in CI); the plan, the keys and the publish gate are tested.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import UserError, unknown
from .recipes import AotritonSupport, Arch, Recipes, aotriton_key
from .templates import render, template_vars


class ArchSet(Arch):
    """Several arches built into one image; behaves as an Arch for planning."""

    members: tuple[Arch, ...]

    @property
    def targets(self) -> str:
        """What `{arch}` renders as in build args: the members' names joined by ';'."""
        return ";".join(m.name for m in self.members)

    def aotriton_status(self, version: str | None) -> str:
        statuses = [m.aotriton_status(version) for m in self.members]
        if "none" in statuses:
            return "none"
        return "experimental" if "experimental" in statuses else "supported"


def is_set(arch: str | None) -> bool:
    """Whether an --arch value names several arches: a comma list, a family, or a set's own
    name as tags and report folders carry it (gfx1100_gfx1151)."""
    return bool(arch) and ("," in arch or "_" in arch or arch.startswith("family:"))


def members_of(recipes: Recipes, spec: str) -> list[str]:
    """The arch names a `--arch` value lists: names separated by commas, or `family:<f>`;
    sorted, so gfx1151,gfx1100 and gfx1100,gfx1151 are one set."""
    names: list[str] = []
    for part in (p.strip() for p in spec.replace("_", ",").split(",")):
        if not part:
            raise UserError(f"--arch {spec!r}: an empty arch name between commas")
        if part.startswith("family:"):
            family = part.partition(":")[2]
            found = [n for n, a in recipes.arches.items() if a.family == family]
            if not found:
                families = sorted({a.family for a in recipes.arches.values() if a.vendor == "amd"})
                raise UserError(
                    f"unknown family {family!r}; valid AMD families: {', '.join(families)}"
                )
            names += found
        elif part in recipes.arches and not isinstance(recipes.arches[part], ArchSet):
            names.append(part)
        else:
            raise unknown("arch", part, [n for n, a in recipes.arches.items() if not isinstance(a, ArchSet)])  # fmt: skip
    names = sorted(set(names))
    if len(names) < 2:
        raise UserError(
            f"--arch {spec!r} names one arch ({names[0]}); give it alone, or list several"
        )
    vendors = {recipes.arches[n].vendor for n in names}
    if vendors != {"amd"}:
        raise UserError(
            f"--arch {spec!r}: one image for several arches is for AMD arches only "
            f"({', '.join(f'{n} is {recipes.arches[n].vendor}' for n in names if recipes.arches[n].vendor != 'amd')})"
        )
    return names


def arch_set(recipes: Recipes, names: list[str]) -> ArchSet:
    members = tuple(recipes.arches[n] for n in names)
    families = sorted({m.family for m in members})
    waves = {m.wave_size for m in members}
    extras = [m.therock_extra for m in members]
    aot = [m.aotriton for m in members]
    aotriton = None
    if all(aot):
        aotriton = AotritonSupport(
            since=max((a.since for a in aot), key=aotriton_key),
            experimental=sorted({t for a in aot for t in a.experimental}),
        )
    return ArchSet(
        name="_".join(names),
        description="one image for " + ", ".join(f"{m.name} ({m.description})" for m in members),
        vendor="amd",
        family=families[0] if len(families) == 1 else "+".join(families),
        wave_size=waves.pop() if len(waves) == 1 else None,
        matrix_unit=None,
        lds_bytes=min((m.lds_bytes for m in members if m.lds_bytes), default=None),
        therock_extra=",".join(e for e in extras if e) if all(extras) else None,
        aotriton=aotriton,
        members=members,
    )


def register(recipes: Recipes, spec: str) -> str:
    """Add the set `spec` names to recipes.arches (once) and return its name: from then on every
    task takes it as an arch."""
    names = members_of(recipes, spec)
    name = "_".join(names)
    if name not in recipes.arches:
        recipes.arches[name] = arch_set(recipes, names)
    return name


def member_smoke(
    layer, variant: str | None, arch: ArchSet, args: Mapping[str, Any], jobs: int, where: str
) -> tuple[dict[str, Any], ...]:
    """A layer's smoke checks for a set: a check that names the arch once per member (named for
    it), any other once."""
    arch_keys = ("{arch}", "{therock_extra}", "{family}", "{wave_size}", "{aotriton")
    checks: list[dict[str, Any]] = []
    for check in layer.smoke:
        raw = check.model_dump(exclude_none=True)
        per_member = any(k in str(v) for v in raw.values() for k in arch_keys)
        for member in arch.members if per_member else (arch,):
            tvars = {**template_vars(member, variant, layer, jobs), **args}
            if member is arch:
                tvars["arch"] = arch.targets
            rendered = render(raw, tvars, where, strict=False)
            if per_member:
                rendered["name"] = f"{rendered['name']} [{member.name}]"
            checks.append(rendered)
    return tuple(checks)


def member_expect(recipes: Recipes, plan, member: str, jobs: int = 2) -> dict[str, Any]:
    """What validation holds the set's image to on one member's GPU: the stack's expectations
    and each built layer's, rendered for that member with the variant the set's plan chose."""
    arch = recipes.arches[member]
    stack = recipes.stacks[plan.stack]
    expect = render(
        stack.expect, {"arch": arch.name, "family": arch.family, "vendor": arch.vendor},
        "recipes/stacks.yaml: expect", strict=False,
    )  # fmt: skip
    for step in plan.steps:
        if not step.runs:
            continue
        layer = recipes.layers[step.layer]
        vspec = layer.variants.get(step.variant) if step.variant else None
        raw = {**layer.expect, **(vspec.expect if vspec else {})}
        expect.update(render(raw, template_vars(arch, step.variant, layer, jobs), "", strict=False))
    return expect


# ---------------------------------------------------------------------------- publishing a set


def member_reports(reports: Path, member: str) -> Path:
    """Where `invoke validate` of a set's image on one member's GPU leaves its report and
    stamp: reports/<set>/<stack>/<member>/."""
    return reports / member


def host_member(arch: ArchSet, host_arch: str) -> str:
    """The member a host validates the set's image as: its own GPU's arch."""
    names = [m.name for m in arch.members]
    if host_arch not in names:
        raise UserError(
            f"the {arch.name} image is validated on a GPU of each of its arches "
            f"({', '.join(names)}); this host's is {host_arch}",
            hint="run `invoke validate --arch " + arch.name + "` on a runner with one of them "
            "(the workflow's matrix runs one job per member)",
        )
    return host_arch


def common_expect(recipes: Recipes, plan, jobs: int) -> dict[str, Any]:
    """The expectations every member shares (a set's plan shows these; each member's
    validation adds its own, member_expect)."""
    arch = recipes.arches[plan.arch]
    per = [member_expect(recipes, plan, m.name, jobs) for m in arch.members]
    return {k: v for k, v in per[0].items() if all(p.get(k) == v for p in per[1:])}


def publish_refusals(image_id: str, stamps: Mapping[str, dict | None]) -> list[str]:
    """Why a set's image may not be published: a sentence per member that was not validated,
    was validated on another image, or failed. Empty: every member passed on this image."""
    why = []
    for member, record in stamps.items():
        if record is None:
            why.append(f"{member} was never validated on it")
        elif record.get("image_id") != image_id:
            why.append(
                f"{member} was validated on another image ({str(record.get('image_id'))[:19]})"
            )
        elif not record.get("passed"):
            why.append(f"{member} failed validation (exit {record.get('exit')})")
    return why
