"""Errors a user can fix: printed as sentences, never as tracebacks (unless --debug)."""

from __future__ import annotations

from collections.abc import Iterable


class UserError(Exception):
    """A problem with the user's input or environment; its message is the whole story."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class RecipeError(UserError):
    """A recipe file is malformed: names the file, the line and the field."""

    def __init__(
        self,
        file: str,
        message: str,
        *,
        line: int | None = None,
        field: str | None = None,
        choices: Iterable[str] | None = None,
    ) -> None:
        where = file if line is None else f"{file}:{line}"
        text = f"{where}: {field + ': ' if field else ''}{message}"
        if choices is not None:
            text += f" (valid: {', '.join(sorted(choices)) or 'none'})"
        super().__init__(text)
        self.file, self.line, self.field = file, line, field


def unknown(kind: str, name: str, choices: Iterable[str]) -> UserError:
    """Error for an unknown arch, stack, layer...: lists the valid ones."""
    plural = f"{kind}es" if kind.endswith(("ch", "sh", "s", "x")) else f"{kind}s"
    return UserError(f"unknown {kind} {name!r}; valid {plural}: {', '.join(sorted(choices))}")
