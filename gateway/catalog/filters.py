"""`only` / `deny` filters over a server's ORIGINAL tool names (exact names or shell globs)."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Filtered:
    """Tool names that passed, and the `only` entries that matched nothing (usually typos)."""

    kept: list[str]
    unmatched_only: list[str]


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or fnmatch.fnmatchcase(name, pattern)


def apply_filters(names: Sequence[str], only: Sequence[str] | None, deny: Sequence[str]) -> Filtered:
    """Keep names allowed by `only` (all when None), then drop those matching `deny`."""
    kept = [n for n in names if only is None or any(_matches(n, p) for p in only)]
    kept = [n for n in kept if not any(_matches(n, p) for p in deny)]
    unmatched = [p for p in only or () if not any(_matches(n, p) for n in names)]
    return Filtered(kept=kept, unmatched_only=unmatched)
