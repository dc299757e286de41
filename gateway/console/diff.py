"""A side-by-side diff of a pinned and an offered tool definition, line by line, for the pins page."""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from itertools import zip_longest
from typing import Any, Literal

from gateway.policy.pins import definition_lines

Kind = Literal["same", "changed", "removed", "added"]


@dataclass(frozen=True, slots=True)
class Row:
    """One line of each side (None where that side has none), and how they differ."""

    kind: Kind
    left: str | None
    right: str | None
    left_no: int | None
    right_no: int | None


def side_by_side(pinned: dict[str, Any] | None, offered: dict[str, Any] | None) -> list[Row]:
    """The two definitions as `definition_lines` shows them, aligned: equal runs side by side, a changed run
    line against line, and what one side has beyond the other on that side only (removed, added)."""
    left = [line.rstrip("\n") for line in definition_lines(pinned)]
    right = [line.rstrip("\n") for line in definition_lines(offered)]
    rows: list[Row] = []
    for op, i1, i2, j1, j2 in SequenceMatcher(a=left, b=right, autojunk=False).get_opcodes():
        if op == "equal":
            pairs = zip(range(i1, i2), range(j1, j2), strict=True)
            rows += [Row("same", left[i], right[j], i + 1, j + 1) for i, j in pairs]
            continue
        for i, j in zip_longest(range(i1, i2), range(j1, j2)):
            kind: Kind = "added" if i is None else "removed" if j is None else "changed"
            rows.append(
                Row(
                    kind,
                    left[i] if i is not None else None,
                    right[j] if j is not None else None,
                    i + 1 if i is not None else None,
                    j + 1 if j is not None else None,
                )
            )
    return rows
