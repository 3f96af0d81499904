"""One reconnect backoff for every link that retries: exponential, capped, jittered.

Jitter keeps a fleet of servers that lost the same tracker from reconnecting in lockstep.
Standard library only: the device server uses it.
"""
from __future__ import annotations

import random


class Backoff:
    """Delays ``initial * factor**n``, capped at ``maximum``, each scaled by ``1 ± jitter``."""

    def __init__(self, initial: float = 0.25, maximum: float = 10.0, *, factor: float = 2.0,
                 jitter: float = 0.2, rng: random.Random | None = None) -> None:
        if not 0 < initial <= maximum or factor < 1 or not 0 <= jitter < 1:
            raise ValueError(f"bad backoff: initial={initial} maximum={maximum} factor={factor} jitter={jitter}")
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._uniform = (rng or random.Random()).uniform
        self._current = initial

    def next(self) -> float:
        """The delay before the next attempt; each call doubles the following one, up to the cap."""
        delay = self._current * self._uniform(1 - self.jitter, 1 + self.jitter)
        self._current = min(self.maximum, self._current * self.factor)
        return delay

    def reset(self) -> None:
        """The link works again: the next failure waits ``initial`` once more."""
        self._current = self.initial
