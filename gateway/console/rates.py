"""Call rate and error rate, read from the process's own metrics (`manifold_tool_calls_total`): the change
since a reading at least `window` seconds old (or the oldest one kept, when none is that old yet)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from gateway.observe.metrics import Metrics

WINDOW = 60.0
EVERY = 5.0  # at most one reading kept per this many seconds


@dataclass(frozen=True, slots=True)
class Reading:
    """Calls counted so far, in total and by outcome."""

    at: float
    by_outcome: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.by_outcome.values())

    @property
    def errors(self) -> float:
        """Calls whose outcome is not `ok`."""
        return sum(n for outcome, n in self.by_outcome.items() if outcome != "ok")


@dataclass(frozen=True, slots=True)
class Rates:
    """Calls per minute, the share of them that did not end `ok`, and over how many seconds."""

    per_minute: float
    error_share: float | None  # None when there were no calls
    seconds: float
    by_outcome: dict[str, int]


def read_calls(metrics: Metrics) -> Reading:
    """The tool-call counters now, summed by outcome."""
    by_outcome: dict[str, float] = {}
    for family in metrics.tool_calls.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                outcome = sample.labels["outcome"]
                by_outcome[outcome] = by_outcome.get(outcome, 0.0) + sample.value
    return Reading(time.monotonic(), by_outcome)


class CallRates:
    """Readings of the call counters, taken when asked (no task of its own)."""

    def __init__(self, metrics: Metrics, window: float = WINDOW) -> None:
        self._metrics, self._window = metrics, window
        self._readings: deque[Reading] = deque([read_calls(metrics)])

    def now(self) -> Rates:
        """The rates since the reference reading."""
        current = read_calls(self._metrics)
        if current.at - self._readings[-1].at >= EVERY:
            self._readings.append(current)
        while len(self._readings) > 1 and self._readings[1].at <= current.at - self._window:
            self._readings.popleft()
        since = self._readings[0]
        seconds = current.at - since.at
        calls = current.total - since.total
        errors = current.errors - since.errors
        outcomes = {k: int(v - since.by_outcome.get(k, 0.0)) for k, v in sorted(current.by_outcome.items())}
        return Rates(
            per_minute=calls * 60.0 / seconds if seconds > 0 else 0.0,
            error_share=errors / calls if calls > 0 else None,
            seconds=seconds,
            by_outcome={k: v for k, v in outcomes.items() if v},
        )
