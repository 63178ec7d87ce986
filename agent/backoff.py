"""Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff And Jitter").

delay(n) = uniform(0, min(cap, base * 2**n)); ``reset()`` after a success.
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

    def reset(self) -> None:
        self.failures = 0
