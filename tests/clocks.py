"""A monotonic clock a spec moves by hand, for the code that takes its clock as an argument (lease
keepers, write fences, binders): a paused process's clock is one moved past a deadline without the code
running meanwhile. Shared by the fencing and lease specs."""

from __future__ import annotations


class Clock:
    """Reads `t`, which the spec sets."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
