"""A SchedulingShard (kai.scheduler/v1) as the configuration of one Kairos shard, and the `Policy` its
cycles run with; pure and deterministic.

`shard_config` reads the wire object as KAI's operator does: the shard's plugins and actions are KAI's
defaults for its placement strategy (``gpupack`` or ``gpuspread`` after ``placementStrategy.gpu``,
``gpusharingorder`` only with GPU binpack, ``consolidation`` only when neither strategy is spread;
``kValue`` and ``minRuntime`` become the ``proportion`` and ``minruntime`` arguments), merged with the
spec's overrides (``enabled`` and ``priority`` per field, ``arguments`` as a whole; a plugin or action
enabled that is not a default starts at priority 0), then ordered by priority, highest first, ties by
name. `policy_of` turns the result into the `Policy` every cycle of the shard should use (with
``queueDepthPerAction`` as `Policy.queue_depth_per_action`), and `usage_params` its usageDBConfig into
the time-based fair share's `UsageParams` (None: off).

Bad input raises `InvalidObject("SchedulingShard", name, field, problem)` naming the field
(``spec.placementStrategy.gpu``): a placement other than binpack or spread, a negative or non-finite
kValue, a malformed or negative duration, an unknown plugin or action, an argument a plugin does not take,
a queue depth for an action that does not run, a malformed usageDBConfig. (Unknown fields are refused
when the object is decoded, `shared.kube.wire`.)

What is valid but the policy cannot honour yet is *reported, not refused*: `ShardConfig.not_applied`
lists each such field with the reason, and the rest of the configuration applies. These are:

- in ``usageDBConfig``: ``clientType`` and the connection (Kairos records usage itself, in JetStream, and
  queries no usage database), a ``cron`` window type (the sliding window applies), ``waitTimeout`` and
  ``extraParams`` (a usage database's settings); the usage parameters themselves apply (`usage_params`);
- ``args``: the scheduler flags the policy has no switch for (``allow-consolidating-reclaim``,
  ``max-consolidation-preemptees``, ``default-staleness-grace-period`` and KAI v0.17's
  ``stuck-in-releasing-threshold`` map);
- ``minruntime``'s ``reclaimResolveMethod: queue`` (Kairos resolves by lca);
- ``scenarioSearchBudgets`` (KAI v0.16, alpha there): wall-clock budgets of the victim search; Kairos's core
  reads no clock, so its search is bounded by its own limits instead (checked as KAI checks them: Go
  durations >= 0, 0 unlimited; action keys ``default``, ``consolidation``, ``reclaim``, ``preempt``;
  generator keys ``default``, ``NodeLocalGreedy``, ``MultiNodeGang``; a minimum job search below the maximum
  unless that is unlimited);
- ``goMemLimitRatio`` (in (0, 1]) and ``goMemLimit`` (a quantity) (KAI v0.17): the Go runtime's soft memory
  limit of KAI's scheduler; Kairos's services are Python processes.

A bad value in one of these last fields (which KAI would refuse) is reported the same way, naming the field
and the problem, instead of refusing the shard: it changes nothing Kairos does.

Plugins disabled, priorities and GPU device orders are honoured: `policy_of` gives the policy the enabled
plugins as `Policy.plugins` (`ShardConfig.policy_plugins`), which the core's registry runs in priority
order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal, cast

import msgspec

from shared.core.plugins.priorities import KNOWN_PRIORITIES
from shared.core.policy import KNOWN_ACTIONS, Placement, PluginConfig, Policy
from shared.core.usage import UsageParams
from shared.errors import InvalidObject
from shared.kube import kai_plugins, values, wire
from shared.kube.kai_plugins import DEFAULT_PRIORITIES, PLACEMENTS, ExtraPlugin, PluginEntry
from shared.kube.quantity import parse_quantity, parse_time
from shared.kube.values import shown

__all__ = [
    "DEFAULT_ACTION_PRIORITIES",
    "NotApplied",
    "PluginSetting",
    "ShardConfig",
    "UsageDb",
    "policy_of",
    "shard_config",
    "usage_params",
]

KIND = wire.SchedulingShard.KIND

DEFAULT_ACTION_PRIORITIES: Mapping[str, int] = {
    "allocate": 500,
    "consolidation": 400,
    "reclaim": 300,
    "preempt": 200,
    "stalegangeviction": 100,
}
"""KAI's actions and their default priorities (higher runs first; KAI operator's defaults)."""

_BASE_PLUGINS = tuple(
    name for name in DEFAULT_PRIORITIES if name not in ("gpupack", "gpuspread", "gpusharingorder")
)
"""The plugins every shard starts with, whatever its placement strategy."""

WindowType = Literal["sliding", "tumbling", "cron"]
_WINDOW_TYPES = ("sliding", "tumbling", "cron")

_ARGS: Mapping[str, str] = {
    "allow-consolidating-reclaim": "allow_consolidating_reclaim",
    "max-consolidation-preemptees": "max_consolidation_preemptees",
    "default-staleness-grace-period": "staleness_grace_period",
    "stuck-in-releasing-threshold": "stuck_in_releasing_threshold",
}
"""KAI scheduler flags (``spec.args``) that are policy fields."""


class NotApplied(msgspec.Struct, frozen=True, kw_only=True):
    """A valid setting of the shard that Kairos does not honour (yet): the field and why."""

    field: str
    reason: str


class PluginSetting(msgspec.Struct, frozen=True, kw_only=True):
    """One enabled plugin of the shard, after merging the spec's override with KAI's default."""

    name: str
    priority: int
    arguments: dict[str, str] = msgspec.field(default_factory=dict)


class UsageDb(msgspec.Struct, frozen=True, kw_only=True):
    """usageDBConfig, checked; durations in seconds (None: KAI's default)."""

    client_type: str
    connection_string: str = ""
    connection_string_env_var: str = ""
    half_life_period: float | None = None
    """0 or None: usage does not decay."""
    window_size: float | None = None
    window_type: WindowType | None = None
    tumbling_window_start_time: float | None = None
    cron_string: str = ""
    fetch_interval: float | None = None
    staleness_period: float | None = None
    wait_timeout: float | None = None
    extra_params: dict[str, str] = msgspec.field(default_factory=dict)


class ShardConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What a SchedulingShard configures, checked and merged with KAI's defaults; `policy_of` reads it.

    ``policy_changes`` are the `Policy` fields the shard sets (the rest keep the caller's base);
    ``not_applied`` what the shard asks that Kairos does not honour, each with its reason. Carried in KV
    inside `ShardRecord`, so it ignores fields it does not know: a reader older than the writer keeps
    the shard's configuration instead of dropping the record as malformed.
    """

    name: str
    partition_label_value: str = ""
    gpu_placement: Placement = "binpack"
    cpu_placement: Placement = "binpack"
    actions: tuple[str, ...] = ("allocate", "consolidation", "reclaim", "preempt", "stalegangeviction")
    """The enabled actions, in the order they run."""
    plugins: tuple[PluginSetting, ...] = ()
    """The enabled plugins, highest priority first."""
    queue_depth_per_action: dict[str, int] = msgspec.field(default_factory=dict)
    usage_db: UsageDb | None = None
    args: dict[str, str] = msgspec.field(default_factory=dict)
    policy_changes: dict[str, float | int | bool | str | tuple[str, ...]] = msgspec.field(
        default_factory=dict
    )
    policy_plugins: tuple[PluginConfig, ...] | None = None
    """The enabled plugins as the core's `Policy.plugins` (arguments parsed); None in a record written
    before the core had a plugin registry (the policy then keeps KAI's defaults)."""
    not_applied: tuple[NotApplied, ...] = ()


def policy_of(config: ShardConfig, base: Policy | None = None) -> Policy:
    """The policy every cycle of the shard runs with: `base` (KAI's defaults when None) with the shard's
    settings; validated as any decoded Policy is."""
    fields = msgspec.structs.asdict(base or Policy())
    fields.update(config.policy_changes)
    if config.queue_depth_per_action:
        fields["queue_depth_per_action"] = dict(config.queue_depth_per_action)
    if config.policy_plugins is not None:
        fields["plugins"] = msgspec.to_builtins(config.policy_plugins)
    return msgspec.convert(fields, Policy)


class _Reader:
    """Reads one shard; every error names it."""

    def __init__(self, shard: wire.SchedulingShard) -> None:
        self.name = wire.object_name(shard.metadata.namespace, shard.metadata.name)
        self.spec = shard.spec
        self.notes: list[NotApplied] = []
        self.changes: dict[str, float | int | bool | str | tuple[str, ...]] = {}
        self.core_plugins: tuple[PluginConfig, ...] = ()
        self.extra: dict[str, ExtraPlugin] = {}

    def error(self, field: str, problem: str) -> InvalidObject:
        return InvalidObject(KIND, self.name, field, problem)

    def note(self, field: str, reason: str) -> None:
        self.notes.append(NotApplied(field=field, reason=reason))

    def duration(self, field: str, text: str | None) -> float | None:
        return None if text is None else kai_plugins.duration(text, field, self.error)


def shard_config(
    shard: wire.SchedulingShard, extra_plugins: Mapping[str, ExtraPlugin] | None = None
) -> ShardConfig:
    """The shard's configuration; raises `InvalidObject` naming the field for bad input (module docstring).
    `extra_plugins` are the plugins beyond KAI's the services have installed (entry points), which the
    spec may enable and give arguments like KAI's own."""
    r = _Reader(shard)
    r.extra = dict(extra_plugins or {})
    spec = shard.spec
    gpu, cpu = _placement(r, spec.placement_strategy)
    if spec.k_value is not None:
        kai_plugins.k_value(spec.k_value, "spec.kValue", r.error)
    minimum = spec.min_runtime or wire.MinRuntime()
    r.duration("spec.minRuntime.preemptMinRuntime", minimum.preempt_min_runtime)
    r.duration("spec.minRuntime.reclaimMinRuntime", minimum.reclaim_min_runtime)

    plugins = _plugins(r, gpu, cpu)
    actions = _actions(r, gpu, cpu)
    r.changes["actions"] = actions
    for name, depth in spec.queue_depth_per_action.items():
        at = f"spec.queueDepthPerAction.{name}"
        if name not in actions:
            raise r.error(at, f"{name!r} is not one of the shard's actions ({', '.join(actions)})")
        if depth < 0:
            raise r.error(at, f"depth {depth} is negative")
    usage_db = _usage_db(r, spec.usage_db_config)
    if usage_db is not None:
        _usage_notes(r, usage_db)
    _args(r, spec.args)
    for not_applied in (_scenario_search_budgets, _go_memory):
        try:
            not_applied(r, spec)
        except InvalidObject as exc:
            # A bad value in a field Kairos does not apply must not keep the rest of the shard from applying.
            r.note(exc.field, f"invalid, ignored (Kairos does not apply it): {exc.problem}")
    return ShardConfig(
        name=r.name,
        partition_label_value=spec.partition_label_value,
        gpu_placement=gpu,
        cpu_placement=cpu,
        actions=actions,
        plugins=plugins,
        queue_depth_per_action=dict(spec.queue_depth_per_action),
        usage_db=usage_db,
        args=dict(spec.args),
        policy_changes=r.changes,
        policy_plugins=r.core_plugins,
        not_applied=tuple(r.notes),
    )


def _placement(r: _Reader, strategy: wire.PlacementStrategy | None) -> tuple[Placement, Placement]:
    strategy = strategy or wire.PlacementStrategy()
    out: list[Placement] = []
    for key, value in (("gpu", strategy.gpu), ("cpu", strategy.cpu)):
        if value is None:
            out.append("binpack")
        elif value in PLACEMENTS:
            out.append(cast("Placement", value))
        else:
            raise r.error(
                f"spec.placementStrategy.{key}", f"{value!r}, expected one of {', '.join(PLACEMENTS)}"
            )
    return out[0], out[1]


class _Plugin(msgspec.Struct, kw_only=True):
    enabled: bool
    priority: int
    arguments: dict[str, str]
    argument_fields: dict[str, str] = msgspec.field(default_factory=dict)
    """Where a default argument came from in the spec (``spec.kValue``)."""
    arguments_field: str = ""


def _default_plugins(r: _Reader, gpu: Placement, cpu: Placement) -> dict[str, _Plugin]:
    spec = r.spec
    plugins = {
        name: _Plugin(enabled=True, priority=DEFAULT_PRIORITIES[name], arguments={}) for name in _BASE_PLUGINS
    }
    if spec.k_value is not None:
        plugins["proportion"].arguments = {"kValue": repr(float(spec.k_value))}
        plugins["proportion"].argument_fields = {"kValue": "spec.kValue"}
    minimum = spec.min_runtime or wire.MinRuntime()
    for key, value, field in (
        ("defaultPreemptMinRuntime", minimum.preempt_min_runtime, "spec.minRuntime.preemptMinRuntime"),
        ("defaultReclaimMinRuntime", minimum.reclaim_min_runtime, "spec.minRuntime.reclaimMinRuntime"),
    ):
        if value is not None:
            plugins["minruntime"].arguments[key] = value
            plugins["minruntime"].argument_fields[key] = field
    device = "gpupack" if gpu == "binpack" else "gpuspread"
    plugins[device] = _Plugin(enabled=True, priority=DEFAULT_PRIORITIES[device], arguments={})
    plugins["nodeplacement"].arguments = {"gpu": gpu, "cpu": cpu}
    plugins["nodeplacement"].argument_fields = {
        "gpu": "spec.placementStrategy.gpu",
        "cpu": "spec.placementStrategy.cpu",
    }
    if gpu == "binpack":
        plugins["gpusharingorder"] = _Plugin(
            enabled=True, priority=DEFAULT_PRIORITIES["gpusharingorder"], arguments={}
        )
    return plugins


def _plugins(r: _Reader, gpu: Placement, cpu: Placement) -> tuple[PluginSetting, ...]:
    plugins = _default_plugins(r, gpu, cpu)
    for name, override in r.spec.plugins.items():
        at = f"spec.plugins.{name}"
        if name not in KNOWN_PRIORITIES and name not in r.extra:
            raise r.error(at, kai_plugins.unknown_plugin(name, r.extra))
        installed = r.extra.get(name)
        start = KNOWN_PRIORITIES.get(name, 0) if installed is None else installed.priority
        plugin = plugins.setdefault(name, _Plugin(enabled=True, priority=start, arguments={}))
        if override.enabled is not None:
            plugin.enabled = override.enabled
        if override.priority is not None:
            plugin.priority = override.priority
        if override.arguments is not None:
            plugin.arguments = dict(override.arguments)
            plugin.argument_fields = {}
            plugin.arguments_field = f"{at}.arguments"
    enabled = sorted(
        ((n, p) for n, p in plugins.items() if p.enabled), key=lambda item: (-item[1].priority, item[0])
    )
    entries = [
        PluginEntry(
            name=name,
            arguments=plugin.arguments,
            priority=plugin.priority,
            name_field=f"spec.plugins.{name}",
            arguments_field=plugin.arguments_field or f"spec.plugins.{name}.arguments",
            argument_fields=plugin.argument_fields,
        )
        for name, plugin in enabled
    ]
    switches = kai_plugins.plugin_switches(entries, r.error, r.extra)
    # The strategy's policy fields are the defaults of the plugins that carry it; with those plugins
    # disabled, no placement score runs (the registry runs exactly the enabled list).
    r.changes.update(gpu_placement=gpu, cpu_placement=cpu, gpu_device_placement=gpu)
    r.changes.update({k: v for k, v in switches.changes.items() if isinstance(v, float | int | bool | str)})
    for item in switches.unexpressible:
        r.note(item.field, item.reason)
    r.core_plugins = switches.plugins
    return tuple(PluginSetting(name=n, priority=p.priority, arguments=p.arguments) for n, p in enabled)


def _actions(r: _Reader, gpu: Placement, cpu: Placement) -> tuple[str, ...]:
    actions = {name: [True, priority] for name, priority in DEFAULT_ACTION_PRIORITIES.items()}
    if "spread" in (gpu, cpu):
        del actions["consolidation"]
    for name, override in r.spec.actions.items():
        if name not in KNOWN_ACTIONS:
            raise r.error(
                f"spec.actions.{name}",
                f"action {name!r} is not one Kairos implements ({', '.join(KNOWN_ACTIONS)})",
            )
        action = actions.setdefault(name, [True, 0])
        if override.enabled is not None:
            action[0] = override.enabled
        if override.priority is not None:
            action[1] = override.priority
    enabled = [(name, int(priority)) for name, (on, priority) in actions.items() if on]
    return tuple(name for name, _ in sorted(enabled, key=lambda item: (-item[1], item[0])))


def _usage_db(r: _Reader, config: wire.UsageDBConfig | None) -> UsageDb | None:
    if config is None:
        return None
    at = "spec.usageDBConfig"
    if not config.client_type:
        raise r.error(f"{at}.clientType", "required: the kind of usage database (e.g. prometheus)")
    params = config.usage_params or wire.UsageParams()
    p = f"{at}.usageParams"
    if params.window_type is not None and params.window_type not in _WINDOW_TYPES:
        raise r.error(
            f"{p}.windowType", f"{params.window_type!r}, expected one of {', '.join(_WINDOW_TYPES)}"
        )
    start = None
    if params.tumbling_window_start_time is not None:
        try:
            start = parse_time(params.tumbling_window_start_time)
        except ValueError as exc:
            raise r.error(f"{p}.tumblingWindowStartTime", str(exc)) from None
    window_type = cast("WindowType | None", params.window_type)
    return UsageDb(
        client_type=config.client_type,
        connection_string=config.connection_string,
        connection_string_env_var=config.connection_string_env_var,
        half_life_period=r.duration(f"{p}.halfLifePeriod", params.half_life_period),
        window_size=r.duration(f"{p}.windowSize", params.window_size),
        window_type=window_type,
        tumbling_window_start_time=start,
        cron_string=params.cron_string,
        fetch_interval=r.duration(f"{p}.fetchInterval", params.fetch_interval),
        staleness_period=r.duration(f"{p}.stalenessPeriod", params.staleness_period),
        wait_timeout=r.duration(f"{p}.waitTimeout", params.wait_timeout),
        extra_params=dict(params.extra_params),
    )


def _usage_notes(r: _Reader, db: UsageDb) -> None:
    at = "spec.usageDBConfig"
    r.note(
        f"{at}.clientType",
        f"Kairos records each queue's usage itself (KV kairos_usage, from its own scheduling) instead of"
        f" querying {db.client_type}; the usage parameters apply",
    )
    if db.window_type == "cron":
        r.note(f"{at}.usageParams.windowType", "cron windows are not supported: the sliding window applies")
    if db.wait_timeout is not None:
        r.note(f"{at}.usageParams.waitTimeout", "no usage database to wait for: the record is Kairos's own")
    if db.extra_params:
        r.note(f"{at}.usageParams.extraParams", "a usage database's settings: the record is Kairos's own")


def usage_params(db: UsageDb | None) -> UsageParams | None:
    """The time-based fair share's parameters from a checked usageDBConfig (KAI's defaults for what it
    leaves out; a staleness period shorter than the fetch interval is the fetch interval, as in KAI);
    None without a usageDBConfig (time-based fair share off)."""
    if db is None:
        return None
    base = UsageParams()
    fetch = db.fetch_interval or base.fetch_interval
    return UsageParams(
        half_life=db.half_life_period or 0.0,
        window=db.window_size or base.window,
        window_type="tumbling" if db.window_type == "tumbling" else "sliding",
        tumbling_start=db.tumbling_window_start_time or 0.0,
        fetch_interval=fetch,
        staleness=max(db.staleness_period if db.staleness_period is not None else base.staleness, fetch),
    )


def _args(r: _Reader, args: Mapping[str, str]) -> None:
    for flag, text in args.items():
        at = f"spec.args.{flag}"
        field = _ARGS.get(flag)
        if field is None:
            r.note(at, "not a scheduler flag Kairos's policy has a switch for")
        elif field == "allow_consolidating_reclaim":
            try:
                r.changes[field] = values.boolean(text)
            except values.InvalidValueError as exc:
                raise r.error(at, str(exc)) from None
        elif field == "max_consolidation_preemptees":
            try:
                r.changes[field] = values.whole(
                    text, low=-1, high=values.INT32_MAX, what="-1 (unlimited) or a count"
                )
            except values.InvalidValueError as exc:
                raise r.error(at, str(exc)) from None
        else:
            r.changes[field] = r.duration(at, text) or 0.0


SEARCH_BUDGET_ACTIONS = ("default", "consolidation", "reclaim", "preempt")
"""The keys of ``maxActionSearchDuration``: the actions that search for victims, and the fallback."""
SEARCH_GENERATORS = ("default", "NodeLocalGreedy", "MultiNodeGang")
"""The keys of ``maxGeneratorSearchDuration``: KAI's scenario generators, and the fallback."""
DEFAULT_MAX_JOB_SEARCH = 240.0
"""KAI's ``maxJobSearchDuration`` when the shard gives none (4m)."""


def _scenario_search_budgets(r: _Reader, spec: wire.SchedulingShardSpec) -> None:
    """Checked as KAI checks them, then reported as not applied (module docstring)."""
    budgets = spec.scenario_search_budgets
    if budgets is None:
        return
    at = "spec.scenarioSearchBudgets"
    for field, by_name, names in (
        ("maxActionSearchDuration", budgets.max_action_search_duration, SEARCH_BUDGET_ACTIONS),
        ("maxGeneratorSearchDuration", budgets.max_generator_search_duration, SEARCH_GENERATORS),
    ):
        for name, text in by_name.items():
            if name not in names:
                raise r.error(f"{at}.{field}.{name}", f"{name!r} is not one of {', '.join(names)}")
            r.duration(f"{at}.{field}.{name}", text)
    longest = r.duration(f"{at}.maxJobSearchDuration", budgets.max_job_search_duration)
    shortest = r.duration(f"{at}.minJobSearchDuration", budgets.min_job_search_duration)
    longest = DEFAULT_MAX_JOB_SEARCH if longest is None else longest
    if shortest and longest and shortest >= longest:
        raise r.error(
            f"{at}.minJobSearchDuration",
            f"{budgets.min_job_search_duration!r} must be below maxJobSearchDuration ({longest:g}s) unless that"
            " is 0 (unlimited)",
        )
    r.note(
        at,
        "Kairos's victim search has no wall-clock budget (its core reads no clock): it is bounded by its own"
        " limits (max-consolidation-preemptees, queueDepthPerAction) and gives the same answer however busy"
        " the machine is",
    )


def _go_memory(r: _Reader, spec: wire.SchedulingShardSpec) -> None:
    """Checked as KAI checks them, then reported as not applied: no Go runtime runs Kairos's scheduler."""
    ratio = spec.go_mem_limit_ratio
    if ratio is not None:
        if not (math.isfinite(ratio) and 0 < ratio <= 1):
            raise r.error("spec.goMemLimitRatio", f"must be in the range (0, 1], got {ratio!r}")
        r.note("spec.goMemLimitRatio", "a Go runtime setting: Kairos's services are Python processes")
    if spec.go_mem_limit is not None:
        try:
            amount = parse_quantity(spec.go_mem_limit)
        except (ValueError, ArithmeticError) as exc:
            raise r.error("spec.goMemLimit", str(exc)) from None
        if amount <= 0:
            raise r.error("spec.goMemLimit", f"must be positive, got {shown(spec.go_mem_limit)}")
        r.note("spec.goMemLimit", "a Go runtime setting: Kairos's services are Python processes")
