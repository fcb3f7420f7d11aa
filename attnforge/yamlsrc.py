"""YAML loading that remembers where each value came from, for errors with line numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import RecipeError

Loc = tuple[Any, ...]


@dataclass
class Source:
    """A parsed YAML document and the line of every key/item path in it."""

    file: str
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)

    def line_of(self, loc: Loc) -> int | None:
        """The line of the deepest known prefix of loc."""
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), None)


# libyaml's parser where PyYAML has it (its nodes carry the same marks), else PyYAML's own; a
# document it refuses is parsed again by PyYAML's, whose error wording the messages quote.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _scalar(node: yaml.Node, constructor: yaml.SafeLoader) -> Any:
    """A scalar node's value, built by the safe loader's constructor for the tag the parse gave
    it: what `yaml.safe_load(yaml.serialize(node))` gives, without writing the node out as YAML
    and parsing it again (half of the recipes' load time, paid by every invoke task that reads
    them). A node that cannot be built goes the long way, for the very error it raises there."""
    try:
        return constructor.construct_object(node, deep=True)
    except yaml.YAMLError:
        return yaml.safe_load(yaml.serialize(node))
    finally:
        constructor.constructed_objects.clear()
        constructor.recursive_objects.clear()


def _to_python(
    node: yaml.Node, loc: Loc, lines: dict[Loc, int], file: str, constructor: yaml.SafeLoader
) -> Any:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise RecipeError(
                    file, "YAML merge keys (<<) are not supported: write the keys out",
                    line=key_node.start_mark.line + 1, field=".".join(map(str, loc)) or None,
                )  # fmt: skip
            key = (
                _scalar(key_node, constructor)
                if key_node.tag != "tag:yaml.org,2002:str"
                else key_node.value
            )
            if key in out:
                raise RecipeError(
                    file, "duplicate key", line=key_node.start_mark.line + 1, field=str(key)
                )
            out[key] = _to_python(value_node, (*loc, key), lines, file, constructor)
            lines[(*loc, key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _to_python(item, (*loc, i), lines, file, constructor)
            for i, item in enumerate(node.value)
        ]
    return _scalar(node, constructor)


def load(path: Path, display: str | None = None) -> Source:
    """Parse one YAML file; malformed YAML becomes a RecipeError with the line."""
    name = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(name, f"cannot read: {exc.strerror}") from None
    try:
        try:
            node = yaml.compose(text, Loader=_FAST_LOADER)
        except yaml.YAMLError:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise RecipeError(
            name, f"malformed YAML: {problem}", line=mark.line + 1 if mark else None
        ) from None
    lines: dict[Loc, int] = {}
    # one constructor a file (its bookkeeping is per call: not shared between threads)
    constructor = yaml.SafeLoader("")
    data = None if node is None else _to_python(node, (), lines, name, constructor)
    return Source(name, data, lines)
