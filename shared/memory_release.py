"""Giving freed memory back to the operating system: what keeps a long-running service's RSS flat.

Called by the service runner (`shared.bus.service`), every `ServiceConfig.memory_release_interval` seconds
(60 by default; 0 turns it off) between two awaits of the event loop, once the resident set has grown since
the last release left it (`grown`), and not while the process is busy (`due`, judged on the interval's last
`BUSY_WINDOW` seconds).

Why: a service's live Python heap stays flat under a steady churn, yet its RSS ratchets up at every burst
(a relist after a dropped watch, a slow API server that lets requests pile up, a heap snapshot) and never
comes back down (docs/chaos.md, the soak). Two things hold the freed memory. Reference cycles (an
exception's traceback and the future that raised it) wait for a full collection, which the thresholds of
`shared.gc_settings` make rare. And what is freed goes back to glibc's heap, which returns to the kernel
only what lies above its last chunk in use; `malloc_trim(0)` hands back every whole free page inside the
heap as well. So a release is a full collection, then `malloc_trim` where the C library has it (glibc;
musl and other platforms skip that step).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable

import psutil
from msgspec import Struct


class Release(Struct, frozen=True):
    """What one release did: unreachable objects the collection freed, and the resident memory before
    and after (bytes)."""

    unreachable: int
    rss_before: int
    rss_after: int

    @property
    def released(self) -> int:
        return max(0, self.rss_before - self.rss_after)


def _find_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _find_malloc_trim()


def can_trim() -> bool:
    """Whether this C library has `malloc_trim` (glibc)."""
    return _malloc_trim is not None


def resident_bytes() -> int:
    """This process's resident set (psutil)."""
    return int(psutil.Process().memory_info().rss)


def trim() -> None:
    """Give the C library's free pages back to the kernel (nothing where it has no `malloc_trim`)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


BUSY_WINDOW = 5.0
"""Seconds at the end of each interval (at most half of it) over which the runner judges whether the process
is busy: what it did in the moments before a release says what the release would interrupt; a whole
minute's average does not (a burst that began a few seconds before the release is most of a quiet minute)."""
BUSY_SHARE = 0.05
"""A process that spent more than this share of `BUSY_WINDOW` on the CPU (all its threads) is busy: an idle
service spends about 0.01 (docs/performance.md, an idle cluster), a state replica scheduling a few dozen
pods a second already more than 0.05. A release's full collection holds the event loop for as long as it
walks the heap (0.5-0.7 s in a state replica holding 5,000 nodes and 11,000 pods), every message in flight
waiting behind it."""
MAX_DEFERRALS = 5
"""How many intervals in a row a busy process puts its release off before it releases anyway."""


GROWTH_FLOOR = 8 * 2**20
"""Bytes the resident set must have grown by since the last release for another to run (at least)."""
GROWTH_SHARE = 0.02
"""...or this share of what the last release left, whichever is more."""


def grown(rss: int, after_last: int | None) -> bool:
    """Whether the resident set, `rss` bytes now, grew enough since the last release left it at `after_last`
    (None: none yet) for another release to be worth its full collection: one walks every object the
    process holds (three quarters of an idle state replica's CPU, 0.7 s a minute at 5,000 nodes and
    11,000 pods; docs/performance.md), and a resident set that did not grow has nothing to give back."""
    if after_last is None:
        return True
    return rss - after_last >= max(GROWTH_FLOOR, GROWTH_SHARE * after_last)


def busy_window(interval: float) -> float:
    """The seconds at the end of an interval of `interval` seconds that `due` is judged on: `BUSY_WINDOW`,
    or half the interval where that is shorter."""
    return min(BUSY_WINDOW, interval / 2)


def due(cpu_s: float, wall_s: float, deferred: int) -> bool:
    """Whether a release runs now, the process having used `cpu_s` seconds of CPU in the last `wall_s`
    seconds (the runner's `BUSY_WINDOW`), `deferred` releases having been put off in a row before it. Not
    while busy: a full collection then takes its time from the work and holds back every message in flight
    (two state replicas dividing SchedulingBasic's load were measured spending 3.6 % of their samples on
    one), and the burst's garbage is still live, so it would free little; a process busy at
    `MAX_DEFERRALS` intervals in a row releases all the same, so its RSS stays bounded under steady load."""
    return deferred >= MAX_DEFERRALS or wall_s <= 0 or cpu_s / wall_s <= BUSY_SHARE


def release() -> Release:
    """Collect every generation, then `trim`."""
    before = resident_bytes()
    unreachable = gc.collect()
    trim()
    return Release(unreachable=unreachable, rss_before=before, rss_after=resident_bytes())
