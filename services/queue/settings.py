"""The queue service's options (`--set key=value`, `kairos serve queue --set ...`) as one typed value.

Read once by `services.queue.service.body` (`QueueSettings.from_options(ctx.config.options)`) through the
project's one options path, `shared.options.read_options`: the bounds are in the fields' types, and a bad
option raises a `ConfigError` naming the option and the value (``service queue: option 'period': expected
a number > 0.0, got '-1'``), so the service refuses to start. Handed to `services.queue.shards` and the
`Dispatcher`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.options import Count, Seconds, none_as, read_options

OWNER = "service queue"
"""Who refuses a bad option, as the service runner names the service."""


class QueueSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The queue service's `--set key=value` options."""

    batch: Annotated[Count | None, none_as("all")] = None
    """`all` (None): one whole-cycle work item per cycle, KAI's one session per cycle. `N`: pending
    podgroups N per work item, for parallel placement replicas."""
    period: Seconds = 1.0
    """Seconds between cycles when nothing changes (KAI's schedule period)."""
    debounce: Seconds = 0.075
    """A change starts a cycle once the replica has been quiet this long (a burst of writes: one cycle)."""
    work_timeout: Seconds = 10.0
    """Seconds a work item stays in flight without an outcome before its podgroups may be dispatched again."""
    admin_timeout: Seconds = 60.0
    """Seconds an admin cycle waits for earlier work to finish and for its own outcome."""
    max_inflight: Count = 64
    """At most this many work items in flight (batch=N); the rest wait for outcomes."""
    window: Count = 4
    """Work items in flight at first (batch=N). The window then adapts to how fast outcomes come back, up
    to `max_inflight`: one more per window of outcomes that return within half the work timeout, one less
    per window of slower ones, half after a timeout. Items the placement and binder replicas cannot get to
    only wait in their streams, and a timeout there would dispatch their podgroups twice."""
    cycles: Literal["auto", "admin"] = "auto"
    """`auto`: cycles on changes and every period. `admin`: only on `admin.<shard>.cycle` requests (the
    conformance runner and step-by-step demos drive the cycles); fair shares are still published."""
    gpu_usage_scoring: bool = False
    """`Policy.gpu_usage_scoring` of the work items: fractional pods prefer the least used GPUs (live
    telemetry). Off like KAI unless asked; `kairos up` asks."""
    usage_save: Seconds = 10.0
    """Seconds between writes of the usage ledger (time-based fair share) to KV: a crashed leader loses at
    most this much of the record; a stopped one writes it before it lets the lease go."""

    @classmethod
    def from_options(cls, options: dict[str, str]) -> QueueSettings:
        """The options given as text; a `ConfigError` naming the option and the value when one is refused."""
        return read_options(OWNER, cls, options)
