"""Exponential backoff with jitter, shared by everything that retries a remote call.

Used by the binder's cluster clients (NATS request/reply to the state service, the Kubernetes API) and by
`shared.kubeapi` (informers reconnecting, write-back calls). Pure: the caller sleeps, this only says how
long.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Attempt n (0-based) waits `min(cap, base * 2**n)` scaled by a random factor in [1 - jitter, 1], so
    that many clients retrying against one restarting server spread out instead of arriving together."""

    attempts: int = 5
    base: float = 0.1
    cap: float = 2.0
    jitter: float = 0.5

    def delay(self, attempt: int, rng: random.Random) -> float:
        ceiling = min(self.cap, self.base * 2.0**attempt)
        return ceiling * (1.0 - self.jitter * rng.random())
