"""A token bucket: `rate` tokens a second, at most `burst` saved up."""

from __future__ import annotations

import time


class TokenBucket:
    """Lets an event pass when a token is left; says how long until the next one otherwise."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    def take(self) -> float:
        """0 when the event may pass (a token is spent), else the seconds until a token is there."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
