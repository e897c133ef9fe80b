"""Exponential backoff with jitter, for retrying a call the server could not answer."""

from __future__ import annotations

import random
from collections.abc import Callable


class Backoff:
    """Delays for successive retries: ``initial_seconds × factor^n``, capped at
    ``max_seconds``, with "equal jitter" (each delay drawn from [d/2, d]) so that many
    workers cut off together do not come back in lockstep.

    ``next_delay(retry_after=…)`` never returns less than a server's ``Retry-After``
    (capped at ``max_retry_after_seconds``). ``reset()`` after a call that worked.
    ``rng`` returns a float in [0, 1) (``random.random``); tests pass a fixed one.
    """

    def __init__(self, *, initial_seconds: float = 0.5, max_seconds: float = 30.0, factor: float = 2.0,
                 max_retry_after_seconds: float = 300.0, rng: Callable[[], float] = random.random) -> None:
        if initial_seconds <= 0 or max_seconds < initial_seconds or factor < 1:
            raise ValueError("backoff needs 0 < initial_seconds <= max_seconds and factor >= 1")
        self.initial_seconds = initial_seconds
        self.max_seconds = max_seconds
        self.factor = factor
        self.max_retry_after_seconds = max_retry_after_seconds
        self._rng = rng
        self.failures = 0  # consecutive failures since the last reset

    def next_delay(self, *, retry_after: float | None = None) -> float:
        """The seconds to wait before the next try, counting one more failure."""
        # The exponent stops growing once the cap is reached: a server down for days must not
        # overflow a float (2.0 ** 1100 does).
        ceiling = min(self.max_seconds, self.initial_seconds * self.factor ** min(self.failures, 64))
        self.failures += 1
        delay = ceiling / 2 + self._rng() * ceiling / 2
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_retry_after_seconds))
        return delay

    def reset(self) -> None:
        """Forget the failures: the next delay starts from ``initial_seconds`` again."""
        self.failures = 0

    def copy(self) -> Backoff:
        """A fresh Backoff with the same settings (one per call being retried)."""
        return Backoff(initial_seconds=self.initial_seconds, max_seconds=self.max_seconds, factor=self.factor,
                       max_retry_after_seconds=self.max_retry_after_seconds, rng=self._rng)
