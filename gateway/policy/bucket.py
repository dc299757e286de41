"""A token bucket: `rate` tokens a second, at most `burst` saved up; and a throttle for log lines built on it."""

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


class Throttle:
    """Log lines of one kind at `rate` a second (`burst` at once); the ones held back are counted, and the
    count is told with the next line let through."""

    def __init__(self, rate: float, burst: int) -> None:
        self._bucket = TokenBucket(rate, burst)
        self._held = 0

    def admit(self) -> int | None:
        """None when this line is held back; else how many were held back since the last one let through."""
        if self._bucket.take() > 0:
            self._held += 1
            return None
        held, self._held = self._held, 0
        return held
