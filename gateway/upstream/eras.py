"""Which era a server's plain tool calls travel in, learned from their first calls, tool by tool.

A server left to negotiate (`protocol: auto`) is spoken to in 2026-07-28 when it can. Servers that answer both eras
over HTTP do not spend the same in each, and not the same way for every tool: the SDK's stateless HTTP mode
(`stateless_http=True`) serves each 2025-era request on a transport and a task of its own, about twice the CPU of its
2026 path for a small answer, while its 2026 path serialises a result through its models, about twice the CPU of its
2025 path for a 1 MiB one (`make bench`, stateless fixture mode). A plain call (a `tools/call` whose caller can be
asked nothing and hears no log lines) means the same in both eras, so once a tool has had `LEARN_AFTER` plain calls
(a tool called less often is not worth a second session), the gateway times its next plain calls over both eras
and sends its later plain calls over the era that answered them faster: the 2025 era only when its median is
clearly lower (`MARGIN`); in a tie, or when clean times never come in, 2026 stays. A choice holds for
`RELEARN_SECONDS`, then the tool is timed again.

Times are fair only when both eras meet the same queue. So the server's plain calls take the eras in blocks of
time (`BLOCK_SECONDS`), all of one era, and a call is timed only when no call of the other era is in flight as it
starts: under a steady load each era's calls then wait behind their own era's calls only, and at low load every
call is alone.

This module holds the tally and the rule, nothing else; `gateway.upstream.legacy` opens the 2025-era session and
routes the calls.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

LEARN_AFTER = 100
"""Plain calls of a tool before its era is learned: a tool called less often is not worth a second session."""
WARMUP = 8
"""Answered plain calls per era not counted: the first calls over a fresh session or connection pay for opening it."""
SAMPLES = 24
"""Timed plain calls per era (after `WARMUP`) before a tool's era is chosen."""
PER_BLOCK = SAMPLES // 2
"""At most this many of an era's samples come from one block, so each era's come from two blocks or more."""
MARGIN = 0.85
"""The 2025 era is chosen when the median of its calls is at most this share of the 2026 median."""
BLOCK_SECONDS = 0.25
"""How long the server's learning calls keep to one era before they take the other."""
MAX_BLOCKS = 400
"""Blocks after which a tool still without enough clean times stays in 2026 (learning ends)."""
RELEARN_SECONDS = 600.0
"""How long a tool's chosen era holds before its next plain calls are timed again (a server changes, and one
noisy tally should not decide for good)."""
MAX_TOOLS = 4096
"""Tools followed per server; beyond, a tool's plain calls stay in the connection's era untimed."""


@dataclass
class ToolTally:
    """The timed plain calls of one tool, by era, until its era is chosen."""

    modern: list[float] = field(default_factory=list)
    legacy: list[float] = field(default_factory=list)
    skipped: list[int] = field(default_factory=lambda: [0, 0])  # warm-up calls left out: 2026, 2025
    per_block: dict[int, int] = field(default_factory=dict)  # samples taken from each block
    calls: int = 0
    chosen: bool | None = None
    """None while learning; then True for the 2025 era, False for 2026."""
    chosen_at: float = 0.0
    """When the era was chosen (monotonic seconds)."""
    first_block: int | None = None
    """The server's block in which the tool's first timed turn came (None: not yet)."""

    def settle(self, legacy: bool, now: float) -> None:
        """Choose the era (True: 2025) at `now`."""
        self.chosen, self.chosen_at = legacy, now

    def stale(self, now: float) -> bool:
        """Whether the chosen era has held `RELEARN_SECONDS` and the tool should be timed again."""
        return self.chosen is not None and now - self.chosen_at >= RELEARN_SECONDS

    def due(self) -> bool:
        """Count a plain call; whether the tool has had `LEARN_AFTER` of them (its era is worth learning)."""
        if self.calls < LEARN_AFTER:
            self.calls += 1
            return False
        return True

    def add(self, legacy: bool, seconds: float, block: int = 0, now: float = 0.0) -> bool | None:
        """Count one clean answered call of `block`, answered at `now`; returns the era chosen when this call
        completes the tally."""
        if self.chosen is not None:
            return None
        if self.skipped[legacy] < WARMUP:
            self.skipped[legacy] += 1
            return None
        samples = self.legacy if legacy else self.modern
        if len(samples) < SAMPLES and self.per_block.get(block, 0) < PER_BLOCK:
            samples.append(seconds)
            self.per_block[block] = self.per_block.get(block, 0) + 1
        if len(self.modern) < SAMPLES or len(self.legacy) < SAMPLES:
            return None
        chosen = statistics.median(self.legacy) <= MARGIN * statistics.median(self.modern)
        self.settle(chosen, now)
        return chosen

    @property
    def medians_ms(self) -> tuple[float, float]:
        """The medians of the 2025 and the 2026 calls, in ms (0 for an era without calls)."""
        legacy = statistics.median(self.legacy) * 1000 if self.legacy else 0.0
        modern = statistics.median(self.modern) * 1000 if self.modern else 0.0
        return round(legacy, 3), round(modern, 3)


class PlainEras:
    """One server's plain calls while some tool's era is learned: the current block, the calls in flight by era,
    and each tool's tally (for one main connection: a new connection learns afresh)."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolTally] = {}
        self.in_flight = [0, 0]
        """Plain calls to the server in flight, by era: 2026, 2025."""
        self.block = 0
        """The current block (even: 2026, odd: 2025)."""
        self._block_ends: float | None = None

    def tally(self, tool: str) -> ToolTally | None:
        """The tally of `tool` (made on first use), or None past `MAX_TOOLS` tools."""
        tally = self._tools.get(tool)
        if tally is None and len(self._tools) < MAX_TOOLS:
            tally = self._tools[tool] = ToolTally()
        return tally

    def turn(self, now: float) -> tuple[bool, int]:
        """The era a learning call starting at `now` (monotonic seconds) takes (True: 2025), and its block."""
        if self._block_ends is None or now >= self._block_ends:
            self.block += self._block_ends is not None
            self._block_ends = now + BLOCK_SECONDS
        return self.block % 2 == 1, self.block

    def clean(self, legacy: bool) -> bool:
        """Whether a call of this era starting now meets only its own era's calls."""
        return self.in_flight[not legacy] == 0

    def expired(self, tally: ToolTally) -> bool:
        """Whether `tally`'s learning has run `MAX_BLOCKS` of the server's blocks: a tool still learning then stays
        in 2026."""
        return tally.first_block is not None and self.block - tally.first_block > MAX_BLOCKS

    def renew(self, tool: str) -> ToolTally:
        """A fresh tally for `tool`, due at once (its era is learned again)."""
        tally = self._tools[tool] = ToolTally(calls=LEARN_AFTER)
        return tally

    def chosen(self) -> dict[str, bool]:
        """Every tool whose era is chosen: True for the 2025 era."""
        return {tool: t.chosen for tool, t in self._tools.items() if t.chosen is not None}
