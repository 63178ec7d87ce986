"""Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff And Jitter").

delay(n) = uniform(0, min(cap, base * 2**n)); ``reset()`` after a success. A console that answers
503 or 429 with ``Retry-After`` is not asked again sooner than that (up to the cap).

``jitter="equal"`` draws from the upper half, uniform(c/2, c), for restarts that must not come at
once (the activity supervisor restarting a loop that crashed).
"""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    def __init__(self, base: float = 0.5, cap: float = 60.0, rand: Callable[[], float] = random.random,
                 jitter: str = "full"):
        if base <= 0 or cap <= 0:
            raise ValueError("backoff base and cap must be positive")
        if jitter not in ("full", "equal"):
            raise ValueError("backoff jitter must be 'full' or 'equal'")
        self.base = base
        self.cap = cap
        self.rand = rand
        self.jitter = jitter
        self.failures = 0

    def ceiling(self) -> float:
        """Upper bound of the next delay."""
        return min(self.cap, self.base * (2 ** min(self.failures, 62)))

    def next_delay(self) -> float:
        ceiling = self.ceiling()
        delay = self.rand() * ceiling if self.jitter == "full" else ceiling * (0.5 + 0.5 * self.rand())
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
