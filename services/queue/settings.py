"""The queue service's options (`--set key=value`, `kairos serve queue --set ...`) as one typed value.

Read once by `services.queue.service.body` (`QueueSettings.from_options(ctx.config.options)`, the project's
options path as for the placement service) and handed to `services.queue.shards` and the `Dispatcher`.
Bad options raise `ConfigError` naming the option, so the service refuses to start.
"""

from __future__ import annotations

import msgspec

from shared.errors import ConfigError


class QueueSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The queue service's `--set key=value` options."""

    batch: int | None = None
    """`all` (None): one whole-cycle work item per cycle, KAI's one session per cycle. `N`: pending
    podgroups N per work item, for parallel placement replicas."""
    period: float = 1.0
    """Seconds between cycles when nothing changes (KAI's schedule period)."""
    debounce: float = 0.075
    """A change starts a cycle once the replica has been quiet this long (a burst of writes: one cycle)."""
    work_timeout: float = 10.0
    """Seconds a work item stays in flight without an outcome before its podgroups may be dispatched again."""
    admin_timeout: float = 60.0
    """Seconds an admin cycle waits for earlier work to finish and for its own outcome."""
    max_inflight: int = 64
    """At most this many work items in flight (batch=N); the rest wait for outcomes."""
    window: int = 4
    """Work items in flight at first (batch=N). The window then adapts to how fast outcomes come back, up
    to `max_inflight`: one more per window of outcomes that return within half the work timeout, one less
    per window of slower ones, half after a timeout. Items the placement and binder replicas cannot get to
    only wait in their streams, and a timeout there would dispatch their podgroups twice."""
    cycles: str = "auto"
    """`auto`: cycles on changes and every period. `admin`: only on `admin.<shard>.cycle` requests (the
    conformance runner and step-by-step demos drive the cycles); fair shares are still published."""
    gpu_usage_scoring: bool = False
    """`Policy.gpu_usage_scoring` of the work items: fractional pods prefer the least used GPUs (live
    telemetry). Off like KAI unless asked; `kairos up` asks."""
    usage_save: float = 10.0
    """Seconds between writes of the usage ledger (time-based fair share) to KV: a crashed leader loses at
    most this much of the record; a stopped one writes it before it lets the lease go."""

    @classmethod
    def from_options(cls, options: dict[str, str]) -> QueueSettings:
        raw: dict[str, object] = dict(options)
        batch = options.get("batch", "all")
        if batch == "all":
            raw["batch"] = None
        else:
            try:
                raw["batch"] = int(batch)
            except ValueError:
                raise ConfigError(
                    f"queue: option 'batch': expected 'all' or a number, got {batch!r}"
                ) from None
        try:
            settings = msgspec.convert(raw, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"queue: options: {exc}") from exc
        if settings.batch is not None and settings.batch < 1:
            raise ConfigError(f"queue: option 'batch': must be >= 1, got {settings.batch}")
        if settings.cycles not in ("auto", "admin"):
            raise ConfigError(f"queue: option 'cycles': expected 'auto' or 'admin', got {settings.cycles!r}")
        for name in ("period", "debounce", "work_timeout", "admin_timeout", "usage_save"):
            if getattr(settings, name) <= 0:
                raise ConfigError(f"queue: option {name!r}: must be > 0")
        if settings.max_inflight < 1:
            raise ConfigError("queue: option 'max_inflight': must be >= 1")
        if settings.window < 1:
            raise ConfigError("queue: option 'window': must be >= 1")
        return settings
