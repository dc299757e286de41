"""Labels a tool carries: what its annotations say, whether it is gated, and how far to trust it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Trust = Literal["trusted", "outside"]

META_PREFIX = "manifold/"


@dataclass(frozen=True, slots=True)
class Labels:
    """Derived labels of one tool. `None` means the upstream gave no such hint."""

    read_only: bool | None
    idempotent: bool | None
    destructive: bool | None
    open_world: bool | None
    gated: bool
    trust: Trust

    @property
    def retryable(self) -> bool:
        """Whether a transient failure may be retried: read-only or idempotent tools only."""
        return bool(self.read_only) or bool(self.idempotent)

    def names(self) -> list[str]:
        """Short words for the labels that hold, for people (`read-only`, `gated`, `outside`, ...)."""
        words = [
            word
            for word, on in (
                ("read-only", self.read_only),
                ("idempotent", self.idempotent),
                ("destructive", self.destructive),
                ("open-world", self.open_world),
                ("gated", self.gated),
            )
            if on
        ]
        return [*words, self.trust]


def _hint(annotations: Mapping[str, Any], key: str) -> bool | None:
    value = annotations.get(key)
    return value if isinstance(value, bool) else None


def labels_for(annotations: Mapping[str, Any] | None, *, trusted: bool, gated: bool | None) -> Labels:
    """Labels from a tool's wire annotations and its server's `trusted` / `gated` options.

    A read-only tool is also idempotent; a tool is gated unless it is read-only, and the
    server's `gated` option overrides that rule.
    """
    hints = annotations or {}
    read_only = _hint(hints, "readOnlyHint")
    idempotent = True if read_only else _hint(hints, "idempotentHint")
    return Labels(
        read_only=read_only,
        idempotent=idempotent,
        destructive=_hint(hints, "destructiveHint"),
        open_world=_hint(hints, "openWorldHint"),
        gated=(not read_only) if gated is None else gated,
        trust="trusted" if trusted else "outside",
    )
