"""Capped exponential backoff with jitter: the wait before the next try, doubling up to a cap."""

from __future__ import annotations

import math
import random


class Backoff:
    """`first`, then doubling up to `cap`, each scaled by a random factor from `jitter`.

    With `healthy_after`, a try that stayed healthy that long starts the sequence afresh.
    """

    def __init__(
        self, first: float, cap: float, *, jitter: tuple[float, float] = (0.5, 1.0), healthy_after: float = math.inf
    ) -> None:
        self.first, self.cap, self.jitter, self.healthy_after = first, cap, jitter, healthy_after
        self._next = first

    def delay(self, healthy_for: float = 0.0) -> float:
        """The wait before the next try, given how long the last one stayed healthy."""
        if healthy_for >= self.healthy_after:
            self._next = self.first
        delay = self._next
        self._next = min(self._next * 2, self.cap)
        return delay * random.uniform(*self.jitter)
