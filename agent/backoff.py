"""Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff And Jitter").

delay(n) = uniform(0, min(cap, base * 2**n)); ``reset()`` after a success. A console that answers
503 or 429 with ``Retry-After`` is not asked again sooner than that (up to the cap).
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    def __init__(self, base: float = 0.5, cap: float = 60.0, rand: Callable[[], float] = random.random):
        if base <= 0 or cap <= 0:
            raise ValueError("backoff base and cap must be positive")
        self.base = base
        self.cap = cap
        self.rand = rand
        self.failures = 0

    def ceiling(self) -> float:
        """Upper bound of the next delay."""
        return min(self.cap, self.base * (2 ** min(self.failures, 62)))

    def next_delay(self) -> float:
        delay = self.rand() * self.ceiling()
        self.failures += 1
        return delay

    def after(self, retry_after_s: float) -> float:
        """The next delay, but at least `retry_after_s` (capped): what the console asked for."""
        return max(self.next_delay(), min(retry_after_s, self.cap))

    def reset(self) -> None:
        self.failures = 0


def retry_after_s(value: str | None) -> float:
    """Seconds of a ``Retry-After`` header in its delay-seconds form; 0 when absent or another form
    (an HTTP date from a console whose clock may differ from ours is not worth trusting)."""
    if value is None:
        return 0.0
    value = value.strip()
    return float(value) if value.isdigit() else 0.0
