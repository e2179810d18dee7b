"""The garbage collector's settings for Kairos's long-running processes.

Called once at start by every service (`shared.bus.service.main`), by kubesim (`tools.kubesim.__main__`)
and by the `kairos` command's own process (`tools.cli.main`, where the in-process benchmark runs the core,
so both sides of the benchmark's overhead factor run under the same settings).

CPython's default collects its youngest generation every 700 net allocations. A scheduling session
allocates an object per pod, pod set, podgroup and node (tens of thousands per cycle) that all live until
the session ends, and the replica's records and the informers' objects live far longer: almost nothing a
young collection examines is garbage, yet each one walks it, and every tenth pushes the survivors on. On
a session of 5,000 nodes and 11,000 pods that was 40 % of its build time (84 ms against 49 ms with the
collector off; docs/performance.md). Reference counting still frees everything acyclic at once; only
reference cycles wait the longer interval.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net allocations between collections of the youngest generation (CPython's default: 700)."""


def tune() -> None:
    """Collect the youngest generation every `YOUNG_THRESHOLD` allocations, and move what is alive at
    start-up (modules, classes, configuration) out of every later collection's walk."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, oldest)
