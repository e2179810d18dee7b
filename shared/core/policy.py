"""Scheduling policy: the knobs of one scheduling cycle, as a typed msgspec Struct.

Defaults are KAI's production defaults unless noted; the conformance runner overrides a few to match
KAI's test harness (predicates off for cases without mocks, zero staleness grace, unlimited
consolidation preemptees). Decoding a policy with `msgspec.convert` names the offending field.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from shared.model.status import DEFAULT_STUCK_IN_RELEASING_THRESHOLD

Placement = Literal["binpack", "spread"]
ReclaimStrategy = Literal["maintain-fair-share", "guarantee-deserved-quota"]
Argument = str | int | float | bool
"""A plugin argument's value (durations in seconds, already parsed by the shell that read them)."""


class PluginConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One entry of `Policy.plugins`: a registry plugin, whether it runs, its priority and arguments."""

    name: str
    enabled: bool = True
    priority: int | None = None
    """Higher runs first, ties by name; None: the registry's default priority (KAI's)."""
    arguments: dict[str, Argument] = msgspec.field(default_factory=dict)
    """Only the arguments the plugin takes (`PluginSpec.arguments`); missing ones take its defaults."""
    disabled: tuple[str, ...] = ()
    """Extension points of the plugin left out of the chains (`EXTENSION_POINTS`: KAI's per-plugin
    ``disableJobOrder``, ``disableNodeOrder``, ...); the plugin's other points still run."""


EXTENSION_POINTS = (
    "node_filter",
    "node_score",
    "device_order",
    "job_order",
    "task_order",
    "pod_set_order",
    "queue_order",
    "quota_check",
    "victim_filter",
)
"""The extension points a plugin fills (`shared.core.plugins.registry.Plugin`'s fields)."""


class QueueUsage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One queue's historical usage as a fraction of the cluster's capacity over the usage window, per
    resource (`shared.core.usage.usage_fractions`; KAI's usage database)."""

    queue: str
    gpu: float = 0.0
    cpu: float = 0.0
    memory: float = 0.0


class Policy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    actions: tuple[str, ...] = ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")
    """Actions run in this order each cycle (KAI's default order)."""
    predicates: bool = True
    """Node filters beyond resource fit (affinity, taints, MIG type, queue capacity on the node)."""
    gpu_placement: Placement = "binpack"
    cpu_placement: Placement = "binpack"
    gpu_device_placement: Placement = "binpack"
    """Which shared device a fractional pod lands on: the fullest fitting one (binpack) or the emptiest."""
    reclaim_strategy: ReclaimStrategy = "maintain-fair-share"
    """KAI's default: a victim queue may lose resources while it stays above its allocatable share (the
    larger of deserved quota and fair share), and always when that gives a queue below its deserved
    quota what it deserves. "guarantee-deserved-quota" keeps only the second rule (queues reclaim only
    up to their deserved quota)."""
    reclaimer_utilization_multiplier: float = 1.0
    """A reclaimer may take resources only while its saturation times this stays below the victim's; >= 1."""
    allow_consolidating_reclaim: bool = True
    max_consolidation_preemptees: int = 16
    """How many running jobs one consolidation attempt may consider moving (KAI admits one more than
    this); -1 = unlimited (KAI's test harness), 0 turns consolidation off."""
    staleness_grace_period: float = 60.0
    """Seconds a gang may stay below its min member before stale-gang eviction."""
    preempt_min_runtime: float = 0.0
    reclaim_min_runtime: float = 0.0
    """Seconds after its last start during which a job may not be preempted / reclaimed; queues may
    override them (`Queue.preempt_min_runtime`, `Queue.reclaim_min_runtime`)."""
    min_node_gpu_memory_mib: int | None = None
    """The GPU memory per device that turns a pending gpu-memory request into GPUs of queue quota (KAI
    ``MinNodeGPUMemoryMiB``). None (the default): the smallest among the cluster's GPU nodes, each cycle
    (KAI v0.17, `shared.core.proportion.device_memory_of`); a number fixes it (KAI before v0.17 fixed it
    at 100). The queue limit and non-preemptible quota checks always use the largest (KAI v0.17, #1792)."""
    stuck_in_releasing_threshold: float = DEFAULT_STUCK_IN_RELEASING_THRESHOLD
    """Seconds after its deletion was asked that a still Running pod counts as StuckInReleasing (KAI
    v0.17's ``--stuck-in-releasing-threshold``, 2m): it keeps its resources, no pending pod is pipelined
    onto them, and it is no victim (`shared.model.status.stuck_in_releasing`)."""
    k_value: float = 1.0
    """KAI's proportion ``kValue``: how much historical usage (`queue_usage`) shifts over-quota shares."""
    queue_usage: tuple[QueueUsage, ...] = ()
    """Time-based fair share: each queue's decayed usage over the shard's usage window, which makes the
    over-quota weight `max(0, n + k_value * (n - usage))` (`shared.core.fair_share`). Empty (the default):
    no usage, the plain weights. The queue leader fills it from its usage ledger when the shard's
    SchedulingShard has a usageDBConfig, so its work items carry the same numbers to placement."""
    gpu_usage_scoring: bool = False
    """Fractional and GPU-memory pods prefer the devices and nodes with the lowest measured use and memory
    pressure (`Node.gpu_devices`, live telemetry). Off by default: KAI has no such score, and the
    conformance corpus must place as KAI does; `kairos up` turns it on."""
    plugins: tuple[PluginConfig, ...] | None = None
    """The plugins the session runs (`shared.core.plugins`): None for the registry's defaults (KAI's
    default plugins, with the switches above as their arguments: today's behaviour); a list replaces the
    defaults as KAI's scheduler conf replaces its tiers: only its enabled entries run, in priority order.
    Either way `predicates=False` leaves the predicates plugin out, and the placement switches are the
    defaults of nodeplacement's arguments. Names and arguments are checked against the registry when a
    session resolves its chains (`PluginConfigError` naming the plugin and the argument)."""
    tie_break_seed: int | None = None
    """Nodes with equal scores are tried by name (KAI's order) when None; otherwise in an order shuffled by
    this seed. Parallel placement workers pass different seeds so that, on a cluster of equal nodes, they
    start filling different nodes instead of all proposing the same ones."""
    queue_depth_per_action: dict[str, int] = msgspec.field(default_factory=dict)
    """KAI's ``queueDepthPerAction``: action name -> how many jobs of each leaf queue the action considers
    in one session (`queue_depth`). An action without an entry considers them all (the default: no
    entry, KAI's ``QueueCapacityInfinite``); 0 makes it consider none. allocate, consolidation, reclaim and
    preempt read it; stale-gang eviction orders no jobs and ignores its entry, as KAI does. Victims are
    never bounded (`shared.core.ordering`)."""

    def queue_depth(self, action: str) -> int | None:
        """How many jobs of each leaf queue `action` considers in one session; None: all of them."""
        return self.queue_depth_per_action.get(action)

    def __post_init__(self) -> None:
        if self.reclaimer_utilization_multiplier < 1.0:
            raise ValueError("policy: field 'reclaimer_utilization_multiplier' must be >= 1")
        unknown = [a for a in self.actions if a not in KNOWN_ACTIONS]
        if unknown:
            raise ValueError(f"policy: field 'actions': unknown action {unknown[0]!r}")
        if not (math.isfinite(self.stuck_in_releasing_threshold) and self.stuck_in_releasing_threshold >= 0):
            raise ValueError("policy: field 'stuck_in_releasing_threshold' must be a finite number >= 0")
        if self.min_node_gpu_memory_mib is not None and self.min_node_gpu_memory_mib <= 0:
            raise ValueError("policy: field 'min_node_gpu_memory_mib' must be > 0")
        for u in self.queue_usage:
            if not all(math.isfinite(v) and v >= 0 for v in (u.gpu, u.cpu, u.memory)):
                raise ValueError(f"policy: field 'queue_usage': queue {u.queue!r}: must be finite and >= 0")
        names = [p.name for p in self.plugins or ()]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"policy: field 'plugins': plugin {twice[0]!r} is listed twice")
        for action, depth in self.queue_depth_per_action.items():
            at = f"policy: field 'queue_depth_per_action': action {action!r}"
            if action not in KNOWN_ACTIONS:
                raise ValueError(f"{at}: not a known action ({', '.join(KNOWN_ACTIONS)})")
            if depth < 0:
                raise ValueError(f"{at}: depth {depth} is negative")


KNOWN_ACTIONS = ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")
