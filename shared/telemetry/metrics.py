"""Prometheus metrics of one Kairos service process, in KAI Scheduler's names wherever KAI has one.

Who calls it: the service runner (`shared.bus.service`) makes one `ServiceMetrics` per process, before it
connects, and serves `ServiceMetrics.expose()` on `GET /metrics` of the health port
(`shared.bus.health_http`); the runner's own series (ready, heartbeat counters, messages per subject
family) come from the `ServiceContext` it attaches. Each service shell then adds its own set on the same
registry: `PlacementMetrics`, `BinderMetrics`, `QueueMetrics`, `StateMetrics`, `GpuAgentMetrics`. The core
never imports this module (import-linter forbids `prometheus_client` there): per-action timings reach it
through `schedule(..., around_action=...)`, a callback whose clock is read here, in the shell.

Every process has its own `CollectorRegistry`, never prometheus-client's global one, so tests can run
several services in one process. Names: `kai_<name>` where KAI Scheduler exports the same quantity (KAI's
default metrics namespace is `kai`, its names, label names, units and buckets unchanged, so a KAI user's
dashboards keep working), `kairos_<name>` for Kairos's own. docs/metrics.md lists every series.

Much of what a service counts is already in its `Counters` (the heartbeat's counters): those are read at
scrape time, all of them as `kairos_service_counter_total{name}` and the important ones again under a name
of their own (`Derived`), so the shells count each thing once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter as _Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from shared.contracts.events import QueueFairShare
from shared.contracts.subjects import DEFAULT_SHARD

if TYPE_CHECKING:
    from shared.core.result import ActionCounts
    from shared.model import PodGroup

KAI = "kai"
"""KAI Scheduler's default metrics namespace (`--metrics-namespace`, constants.DefaultMetricsNamespace)."""
KAI_LATENCY_BUCKETS_MS: tuple[float, ...] = tuple(5.0 * 2**i for i in range(10))
"""KAI's `prometheus.ExponentialBuckets(5, 2, 10)`: 5, 10, 20, ... 2560 ms (then +Inf)."""
SECONDS_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)
"""Kairos's own latency histograms, in seconds (Prometheus's base unit) from 1 ms to 30 s."""
KAI_SEARCH_BUCKETS_S: tuple[float, ...] = tuple(0.001 * 2**i for i in range(16))
"""KAI's `prometheus.ExponentialBuckets(0.001, 2, 16)` for `scenario_search_duration_seconds`: 1 ms ... 32.768 s."""
SEARCH_ACTIONS = ("consolidation", "reclaim", "preempt")
"""The actions that search for victims (KAI's scenario-search budget keys, less `default`)."""
SEARCH_GENERATOR = "accumulated"
"""The one victim-scenario generator Kairos runs (KAI's accumulated search, `shared.core.solver.builder`)."""
DEFAULT_NODE_POOL = "default"
"""KAI's node-pool name for objects without the node-pool label (`DefaultNodePoolName`)."""

MILLI_CPU_PER_CORE = 1000.0
BYTES_PER_GB = 1e9
"""KAI's `MemoryToGB` (decimal gigabytes) for `queue_fair_share_memory_gb`."""
UNLIMITED = -1.0

COUNTER_GAUGES = frozenset({"unhealthy_devices"})
"""Heartbeat counters that are set, not added to (a gauge): never exposed as a Prometheus counter."""

_SUBJECT_KIND_TOKENS = {"events": 3, "cluster": 3, "state": 3, "gpu": 3}
"""Subject families whose third token is a bounded kind (event kind, cluster operation, ...): kept."""

# Go's client writes no `_created` series; without them the exposition matches KAI's series one for one.
disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus-client leaves it unannotated


def subject_family(subject: str) -> str:
    """The bounded part of a subject, for a label: `kairos.work`, `kairos.proposals`, `kairos.outcomes`,
    `kairos.events.pod-bound`, `kairos.cluster.bind`, ... (never a shard, pod or replica name)."""
    tokens = subject.split(".")
    if len(tokens) < 2:
        return subject
    return ".".join(tokens[: _SUBJECT_KIND_TOKENS.get(tokens[1], 2)])


class CounterSource(Protocol):
    """What the runner's collector reads: `shared.bus.middleware.Counters`."""

    @property
    def by_subject(self) -> Mapping[tuple[str, str], int]:
        """(outcome, subject family) -> messages the middleware handled so."""
        ...

    def items(self) -> Iterable[tuple[str, int]]: ...

    def __getitem__(self, key: str, /) -> int:
        """0 for a name never counted (as `collections.Counter` answers)."""
        ...


@dataclass(frozen=True)
class Derived:
    """A series read from the service's `Counters` at scrape time, under a name of its own.

    One counter (`key`), or one label whose values map to counters (`keys`: (label value, counter name)),
    or every counter whose name ends in `suffix` (the label value is the rest of the name)."""

    name: str
    help: str
    key: str = ""
    label: str = ""
    keys: tuple[tuple[str, str], ...] = ()
    suffix: str = ""
    gauge: bool = False

    def family(self, counters: CounterSource) -> Metric:
        labels = [self.label] if self.label else []
        family: CounterMetricFamily | GaugeMetricFamily
        if self.gauge:
            family = GaugeMetricFamily(self.name, self.help, labels=labels)
        else:
            family = CounterMetricFamily(self.name, self.help, labels=labels)
        if self.key:
            family.add_metric([], counters[self.key])
        for value, key in self.keys:
            family.add_metric([value], counters[key])
        if self.suffix:
            for key, count in sorted(counters.items()):
                if key.endswith(self.suffix) and len(key) > len(self.suffix):
                    family.add_metric([key.removesuffix(self.suffix)], count)
        return family


class _FromCounters(Collector):
    def __init__(self, counters: CounterSource, derived: Iterable[Derived]) -> None:
        self.counters = counters
        self.derived = tuple(derived)

    def collect(self) -> Iterable[Metric]:
        return [d.family(self.counters) for d in self.derived]


class _FromCallback(Collector):
    """Series computed at scrape time by a function (objects per kind, informer relists)."""

    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return list(self._collect())


class KaiCounter:
    """A counter under one of KAI's names that do not end in `_total` (`podgroups_scheduled_by_action`,
    `total_preemption_attempts`, ...): Go's client writes a counter's name as given, prometheus-client
    always appends `_total`, so these are written by `ServiceMetrics.expose` itself, in the same text
    format, and a query written for KAI finds them under KAI's name."""

    def __init__(self, name: str, help_: str, labels: tuple[str, ...] = ()) -> None:
        self.name = name
        self.help = help_
        self.labels = labels
        self._values: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()
        if not labels:
            self._values[()] = 0.0

    def inc(self, *values: str, amount: float = 1.0) -> None:
        if len(values) != len(self.labels):
            raise ValueError(f"{self.name}: labels {self.labels}, got values {values}")
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up, got {amount}")
        with self._lock:
            self._values[values] = self._values.get(values, 0.0) + amount

    def value(self, *values: str) -> float:
        return self._values.get(values, 0.0)

    def text(self) -> str:
        """The family in the text format 0.0.4, as Go's client writes it."""
        help_ = self.help.replace("\\", r"\\").replace("\n", r"\n")
        lines = [f"# HELP {self.name} {help_}\n", f"# TYPE {self.name} counter\n"]
        with self._lock:
            items = sorted(self._values.items())
        for values, count in items:
            pairs = ",".join(
                f'{k}="{_escape_label(v)}"' for k, v in sorted(zip(self.labels, values, strict=True))
            )
            labels = f"{{{pairs}}}" if pairs else ""
            value = floatToGoString(count)  # type: ignore[no-untyped-call]  # unannotated upstream
            lines.append(f"{self.name}{labels} {value}\n")
        return "".join(lines)


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class ServiceMetrics:
    """One process's registry and the runner's own series; `attach` once the service context exists."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._counters: CounterSource | None = None
        self._ready: Callable[[], bool] = lambda: False
        self._info: dict[str, str] = {}
        self._served: Callable[[], Iterable[str]] = tuple
        self._restricted = False
        self.kai_counters: list[KaiCounter] = []
        """KAI's counters named without `_total`, written by `expose` after the registry's families."""
        self.registry.register(_FromCallback(self._runner_series))
        # The process's own: resident memory and CPU (process_*), and the collector's work per generation
        # (python_gc_*): how an operator watches a long-running replica's memory.
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def attach(
        self,
        service: str,
        replica: str,
        shard: str | None,
        counters: CounterSource,
        ready: Callable[[], bool],
    ) -> None:
        """Read `counters` and `ready` from now on (the runner calls it for its `ServiceContext`); `shard` is
        the replica's `--shard` text, None when it was started without one."""
        self._counters = counters
        self._ready = ready
        # Not `service`: a scrape through a ServiceMonitor adds the Kubernetes Service as label `service`.
        self._info = {"kairos_service": service, "replica": replica}
        # Until the service says what it serves (`serving`): the shard it was started for, `default` when
        # unrestricted; `--shard default` is a restriction too, and says so.
        self._served = lambda: (shard or DEFAULT_SHARD,)
        self._restricted = shard is not None

    def serving(self, shards: Callable[[], Iterable[str]], *, restricted: bool) -> None:
        """From now on `kairos_service_info` has one series per shard `shards()` names at each scrape (the
        shards the replica serves, as they come and go), each saying whether the replica is `restricted` to
        some shards (its `--shard`) or serves every shard there is. Called by the services that serve per
        shard: placement and the binder (`shared.bus.shard_consumers.ShardLoops.serve`), the queue."""
        self._served = shards
        self._restricted = restricted

    @property
    def counters(self) -> CounterSource:
        if self._counters is None:
            raise RuntimeError("service metrics: not attached to a service context yet")
        return self._counters

    def derive(self, derived: Iterable[Derived]) -> None:
        """Expose these counters under their own names (each service's set calls it once)."""
        self.registry.register(_FromCounters(self.counters, derived))

    def collect_with(self, collect: Callable[[], Iterable[Metric]]) -> None:
        """Add series computed by `collect` at every scrape."""
        self.registry.register(_FromCallback(collect))

    def expose(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type: format 0.0.4, what KAI's Go client serves
        and every Prometheus reads (prometheus-client's "latest" label, 1.0.0, older servers refuse)."""
        body = generate_latest(self.registry)
        if self.kai_counters:
            body += "".join(c.text() for c in self.kai_counters).encode()
        return body, CONTENT_TYPE_PLAIN_0_0_4

    def kai_counter(self, name: str, help_: str, labels: tuple[str, ...] = ()) -> KaiCounter:
        """A `KaiCounter` exposed with this process's series."""
        counter = KaiCounter(name, help_, labels)
        self.kai_counters.append(counter)
        return counter

    def _runner_series(self) -> Iterator[Metric]:
        ready = GaugeMetricFamily("kairos_service_ready", "1 while the service reports ready, else 0")
        ready.add_metric([], 1.0 if self._ready() else 0.0)
        yield ready
        if self._info:
            info = GaugeMetricFamily(
                "kairos_service_info",
                "Always 1: which service and replica this process is, one series per shard it serves, and "
                "whether its --shard restricts it",
                labels=[*self._info, "shard", "restricted"],
            )
            restricted = "true" if self._restricted else "false"
            for shard in sorted(set(self._served())):
                info.add_metric([*self._info.values(), shard, restricted], 1.0)
            yield info
        counters = self._counters
        if counters is None:
            return
        every = CounterMetricFamily(
            "kairos_service_counter_total",
            "Every counter of the service's heartbeat, by name (messages, proposals, writes, errors...)",
            labels=["name"],
        )
        gauges = GaugeMetricFamily(
            "kairos_service_gauge",
            "Heartbeat values that are set rather than counted, by name",
            labels=["name"],
        )
        for name, value in sorted(counters.items()):
            (gauges if name in COUNTER_GAUGES else every).add_metric([name], value)
        yield every
        yield gauges
        messages = CounterMetricFamily(
            "kairos_messages_total",
            "Messages through the bus middleware by subject family and outcome (handled, malformed, errors)",
            labels=["subject", "outcome"],
        )
        for (outcome, family), count in sorted(
            counters.by_subject.items(), key=lambda kv: (kv[0][1], kv[0][0])
        ):
            messages.add_metric([family, outcome], count)
        yield messages
        dropped = CounterMetricFamily(
            "kairos_malformed_messages_dropped_total",
            "Messages dropped because they did not decode (every path: middleware, requests, KV records)",
        )
        dropped.add_metric([], counters["malformed"])
        yield dropped
        pending = GaugeMetricFamily(
            "kairos_nats_consumer_pending_messages",
            "Messages still pending on a JetStream consumer behind the last one this process was delivered",
            labels=["stream", "consumer"],
        )
        age = GaugeMetricFamily(
            "kairos_nats_consumer_message_age_seconds",
            "Seconds the last message a JetStream consumer delivered here had waited in its stream",
            labels=["stream", "consumer"],
        )
        lags: Mapping[tuple[str, str], tuple[int, float]] = getattr(counters, "consumer_lag", {})
        for (stream, consumer), (behind, seconds) in sorted(lags.items()):
            pending.add_metric([stream, consumer], behind)
            age.add_metric([stream, consumer], seconds)
        yield pending
        yield age


def _ms(seconds: float) -> float:
    return seconds * 1000.0


# --- placement -----------------------------------------------------------------------------------------------
class PlacementMetrics:
    """KAI's scheduler latencies (a work item is one of KAI's cycles) and what each work item placed."""

    DERIVED = (
        Derived("kairos_placement_work_items_total", "Work items taken from the stream", key="work_items"),
        Derived("kairos_placement_proposals_total", "Proposals published", key="proposals"),
        Derived(
            "kairos_placement_work_items_skipped_total",
            "Work items not run, by why: fenced (a superseded leader's), replica_behind (handed back)",
            label="reason",
            keys=(("fenced", "fenced"), ("replica_behind", "replica_behind")),
        ),
    )

    def __init__(self, metrics: ServiceMetrics) -> None:
        r = metrics.registry
        self.e2e = Gauge(
            f"{KAI}_e2e_scheduling_latency_milliseconds",
            "Milliseconds the last work item took, from taking it off the stream to publishing its proposal",
            registry=r,
        )
        self.action = Gauge(
            f"{KAI}_action_scheduling_latency_milliseconds",
            "Milliseconds the action took in the last session that ran it",
            ["action"],
            registry=r,
        )
        self.task = Histogram(
            f"{KAI}_task_scheduling_latency_milliseconds",
            "Milliseconds from a pod's creation to the proposal that binds it",
            buckets=KAI_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self.item = Histogram(
            "kairos_placement_work_item_seconds",
            "Seconds from taking a work item to its proposal published (the distribution of kai_e2e_...)",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self.cycle = Gauge(
            "kairos_placement_cycle_podgroups",
            "Podgroups of the last work item by outcome: placed, pipelined, pending (left with a reason)",
            ["outcome"],
            registry=r,
        )
        self.podgroups = Counter(
            "kairos_placement_podgroups_total",
            "Podgroups of every work item by outcome: placed, pipelined, pending",
            ["outcome"],
            registry=r,
        )
        self.pending_reasons = Gauge(
            "kairos_placement_pending_podgroups",
            "Podgroups the last work item left pending, by the reason of their fit errors",
            ["reason"],
            registry=r,
        )
        self.open_session = Gauge(
            f"{KAI}_open_session_latency_milliseconds",
            "Milliseconds the last work item's session took to open (snapshot to plugins and fair shares)",
            registry=r,
        )
        self.close_session = Gauge(
            f"{KAI}_close_session_latency_milliseconds",
            "Milliseconds the last work item's session took to close (results read out, proposal built)",
            registry=r,
        )
        self.plugin = Gauge(
            f"{KAI}_plugin_scheduling_latency_milliseconds",
            "Milliseconds a plugin took to set up for the last session (OnSessionOpen)",
            ["plugin", "OnSession"],
            registry=r,
        )
        self.scheduled_by_action = metrics.kai_counter(
            f"{KAI}_podgroups_scheduled_by_action",
            "Podgroups each action scheduled (its statement committed)",
            ("action",),
        )
        self.acted_on_by_action = metrics.kai_counter(
            f"{KAI}_podgroups_acted_on_by_action",
            "Podgroups each action tried to make room for (the victim search ran)",
            ("action",),
        )
        self.scenarios_simulated = metrics.kai_counter(
            f"{KAI}_scenarios_simulation_by_action",
            "Victim scenarios each action simulated",
            ("action",),
        )
        self.scenarios_filtered = metrics.kai_counter(
            f"{KAI}_scenarios_filtered_by_action",
            "Victim scenarios each action ruled out without simulating them",
            ("action",),
        )
        self.preemption_attempts = metrics.kai_counter(
            f"{KAI}_total_preemption_attempts",
            "Podgroups the preempt action made room for (statements committed)",
        )
        self.evicted_pods = Counter(
            f"{KAI}_pod_group_evicted_pods_total",
            "Pods evicted, per podgroup and the action that evicted them",
            ["podgroup", "namespace", "uid", "nodepool", "action"],
            registry=r,
        )
        self.search_jobs = Counter(
            f"{KAI}_scenario_search_jobs_total",
            "Podgroups the victim search ran for, by action and result (solved, generators_exhausted)",
            ["action", "result", "reduced_budget"],
            registry=r,
        )
        self.search_scenarios = Counter(
            f"{KAI}_scenario_search_scenarios_total",
            "Victim scenarios by state: emitted (built), simulated, validator_rejected",
            ["action", "generator", "state"],
            registry=r,
        )
        self.search_exhausted = Counter(
            f"{KAI}_scenario_search_action_budget_exhausted_total",
            "Times an action's search budget ran out (never: Kairos's search has no wall-clock budget)",
            ["action"],
            registry=r,
        )
        self.search_duration = Histogram(
            f"{KAI}_scenario_search_duration_seconds",
            "Seconds of a generator's search attempt (not observed: Kairos's core reads no clock)",
            ["action", "generator", "result"],
            buckets=KAI_SEARCH_BUCKETS_S,
            registry=r,
        )
        action_budget = Gauge(
            f"{KAI}_scenario_search_action_budget_configured_seconds",
            "An action's scenario-search budget in seconds; 0: unlimited (Kairos's search has none)",
            ["action"],
            registry=r,
        )
        job_budget = Gauge(
            f"{KAI}_scenario_search_job_budget_configured_seconds",
            "The per-job scenario-search budget in seconds; 0: unlimited (Kairos's search has none)",
            registry=r,
        )
        generator_budget = Gauge(
            f"{KAI}_scenario_search_generator_budget_configured_seconds",
            "A generator's scenario-search budget in seconds; 0: unlimited (Kairos's search has none)",
            ["generator"],
            registry=r,
        )
        job_budget.set(0)
        generator_budget.labels(SEARCH_GENERATOR).set(0)
        for action in SEARCH_ACTIONS:
            action_budget.labels(action).set(0)
            self.search_exhausted.labels(action)
        metrics.derive(self.DERIVED)

    def session_clock(self) -> SessionClock:
        """A clock for one work item: its `action` is the core's `around_action`."""
        return SessionClock(self)

    def observe_pending(self, reasons: Mapping[str, int]) -> None:
        """The last work item's pending podgroups per fit-error reason (a reason gone since reads 0)."""
        self.pending_reasons.clear()
        for reason, count in reasons.items():
            self.pending_reasons.labels(reason).set(count)

    def plugin_opened(self, plugin: str, seconds: float) -> None:
        """A plugin was built for a session in `seconds` (Kairos's OnSessionOpen of a plugin)."""
        self.plugin.labels(plugin, "OnSessionOpen").set(_ms(seconds))

    def observe_actions(
        self, actions: Iterable[ActionCounts], podgroups: Mapping[str, PodGroup], nodepool: str
    ) -> None:
        """What each action of a cycle did (`CycleResult.actions`) into KAI's per-action series;
        `podgroups` names each evicted podgroup (key -> the snapshot's podgroup), `nodepool` the shard's."""
        pool = nodepool or DEFAULT_NODE_POOL
        for counts in actions:
            a = counts.action
            self.scheduled_by_action.inc(a, amount=counts.scheduled)
            self.acted_on_by_action.inc(a, amount=counts.considered)
            self.scenarios_simulated.inc(a, amount=counts.scenarios_simulated)
            self.scenarios_filtered.inc(a, amount=counts.scenarios_filtered)
            if a == "preempt":
                self.preemption_attempts.inc(amount=counts.scheduled)
            if counts.considered:
                exhausted = counts.searches_exhausted
                self.search_jobs.labels(a, "solved", "false").inc(counts.considered - exhausted)
                self.search_jobs.labels(a, "generators_exhausted", "false").inc(exhausted)
            emitted = counts.scenarios_simulated + counts.scenarios_filtered
            for state, n in (
                ("emitted", emitted),
                ("simulated", counts.scenarios_simulated),
                ("validator_rejected", counts.scenarios_rejected),
            ):
                if n:
                    self.search_scenarios.labels(a, SEARCH_GENERATOR, state).inc(n)
            for key, n in counts.evicted.items():
                pg = podgroups.get(key)
                name, namespace, uid = (pg.name, pg.namespace, pg.uid) if pg is not None else (key, "", "")
                self.evicted_pods.labels(name, namespace, uid, pool, a).inc(n)

    @contextlib.contextmanager
    def action_timer(self, name: str) -> Iterator[None]:
        """`schedule`'s `around_action`: the action's wall time into KAI's per-action gauge."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.action.labels(name).set(_ms(time.perf_counter() - start))

    def observe_item(
        self,
        seconds: float,
        *,
        placed: int,
        pipelined: int,
        pending: int,
        task_latencies: Iterable[float] = (),
    ) -> None:
        """A work item's proposal was published `seconds` after the item was taken; `task_latencies` are
        the seconds from each bound pod's creation to now."""
        self.e2e.set(_ms(seconds))
        self.item.observe(seconds)
        for outcome, count in (("placed", placed), ("pipelined", pipelined), ("pending", pending)):
            self.cycle.labels(outcome).set(count)
            self.podgroups.labels(outcome).inc(count)
        for latency in task_latencies:
            self.task.observe(_ms(max(0.0, latency)))


class SessionClock:
    """KAI's open and close session latencies of one work item, read around the core's actions: open is
    from the clock's start to the first action, close from the last action's end to `finish` (reading
    the result out and building the proposal). Each action's time goes to KAI's per-action gauge."""

    def __init__(self, placement: PlacementMetrics) -> None:
        self.placement = placement
        self.started = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None

    @contextlib.contextmanager
    def action(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        if self.first is None:
            self.first = start
        try:
            yield
        finally:
            self.last = time.perf_counter()
            self.placement.action.labels(name).set(_ms(self.last - start))

    def finish(self) -> None:
        end = time.perf_counter()
        opened = self.first if self.first is not None else end
        self.placement.open_session.set(_ms(opened - self.started))
        self.placement.close_session.set(_ms(end - (self.last if self.last is not None else opened)))


# --- binder --------------------------------------------------------------------------------------------------
_BIND_STARTED: ContextVar[float | None] = ContextVar("kairos_bind_started", default=None)


class BinderMetrics:
    """KAI's bind latency, and what the commit protocol did: outcomes, compare-and-set writes, retries."""

    DERIVED = (
        Derived(
            "kairos_binder_proposals_total",
            "Proposals by outcome: committed, conflict (a ledger key moved), fenced (superseded term), failed",
            label="status",
            keys=(
                ("committed", "committed"),
                ("conflict", "conflicts"),
                ("fenced", "fenced"),
                ("failed", "failed"),
            ),
        ),
        Derived(
            "kairos_binder_cluster_retries_total",
            "Cluster calls asked again after no answer, by operation (bind, evict)",
            label="operation",
            suffix="_retries",
        ),
        Derived("kairos_binder_recovered_pods_total", "Pods the recovery scan bound again", key="recovered"),
        Derived(
            "kairos_binder_recovery_rollbacks_total",
            "Half-written commits the recovery scan removed",
            key="recovery_rollbacks",
        ),
    )

    def __init__(self, metrics: ServiceMetrics) -> None:
        r = metrics.registry
        self.bind = Histogram(
            f"{KAI}_task_bind_latency_milliseconds",
            "Milliseconds from the binder taking a proposal to the cluster answering one of its binds",
            buckets=KAI_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self.cas = Counter(
            "kairos_binder_ledger_cas_total",
            "Compare-and-set writes to the ledger by operation (create, update, delete) and result (ok, conflict)",
            ["operation", "result"],
            registry=r,
        )
        self.proposal_seconds = Histogram(
            "kairos_binder_proposal_seconds",
            "Seconds to process one proposal: fence, claims, reservations, cluster calls, events, outcome",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        metrics.derive(self.DERIVED)

    @contextlib.contextmanager
    def proposal(self) -> Iterator[None]:
        """Around one proposal: binds answered inside it (in this task or tasks it starts) are timed from
        here; the recovery scan's binds, in their own task, are not."""
        start = time.perf_counter()
        token = _BIND_STARTED.set(start)
        try:
            yield
        finally:
            _BIND_STARTED.reset(token)
            self.proposal_seconds.observe(time.perf_counter() - start)

    def bind_answered(self) -> None:
        """A pod's bind was answered (success): observe since its proposal was taken."""
        start = _BIND_STARTED.get()
        if start is not None:
            self.bind.observe(_ms(time.perf_counter() - start))

    def cas_attempt(self, operation: str, ok: bool) -> None:
        self.cas.labels(operation, "ok" if ok else "conflict").inc()


# --- queue ---------------------------------------------------------------------------------------------------
def _cores(millis: float) -> float:
    return millis if millis == UNLIMITED else millis / MILLI_CPU_PER_CORE


QUEUE_LABELS = ("queue_name", "queue_metadata_name", "queue_display_name")
"""The labels of every queue series, KAI v0.17's: `queue_metadata_name` is the Queue object's name (the
stable key to join on), `queue_display_name` its ``spec.displayName`` ("" when unset), and `queue_name`
what KAI always had there: on the scheduler's fair-share series the display name when one is set, else the
object's name; on the queue controller's series (info, quota, allocated, requested) the object's name."""


def queue_labels(name: str, display_name: str, *, scheduler: bool) -> tuple[str, str, str]:
    """The values of `QUEUE_LABELS` for a queue, on a scheduler series or a queue controller one."""
    legacy = (display_name or name) if scheduler else name
    return legacy, name, display_name


class QueueMetrics:
    """KAI's queue fair share (scheduler) and quota / allocation (queue controller) per queue, Kairos's
    requested, and the leader's lease, cycles and work round trip. Only the leader sets queue series; a
    replica that loses the lease clears them, so two replicas never report the same queue. Every queue
    series carries `QUEUE_LABELS`."""

    DERIVED = (
        Derived("kairos_queue_cycles_total", "Scheduling cycles the leader ran", key="cycles"),
        Derived(
            "kairos_queue_work_items_dispatched_total", "Work items published to placement", key="work_items"
        ),
        Derived(
            "kairos_queue_work_timeouts_total", "Work items that got no outcome in time", key="work_timeouts"
        ),
        Derived(
            "kairos_queue_outcomes_total", "Outcomes received for this leader's work items", key="outcomes"
        ),
        Derived(
            "kairos_queue_fair_share_events_total",
            "queue-fair-share events published (a queue's numbers changed)",
            key="fair_share_events",
        ),
    )

    def __init__(self, metrics: ServiceMetrics) -> None:
        r = metrics.registry

        def queue_gauge(name: str, help_: str) -> Gauge:
            return Gauge(name, help_, QUEUE_LABELS, registry=r)

        self.fair_share = {
            "cpu": queue_gauge(f"{KAI}_queue_fair_share_cpu_cores", "A queue's fair share of CPU, in cores"),
            "memory": queue_gauge(
                f"{KAI}_queue_fair_share_memory_gb",
                "A queue's fair share of memory, in gigabytes (10^9 bytes)",
            ),
            "gpu": queue_gauge(f"{KAI}_queue_fair_share_gpu", "A queue's fair share of GPUs, in devices"),
        }
        self.allocated = {
            "cpu": queue_gauge(
                f"{KAI}_queue_allocated_cpu_cores", "CPU held by a queue's allocated pods, in cores"
            ),
            "memory": queue_gauge(
                f"{KAI}_queue_allocated_memory_bytes", "Memory held by a queue's allocated pods, in bytes"
            ),
            "gpu": queue_gauge(f"{KAI}_queue_allocated_gpus", "GPUs held by a queue's allocated pods"),
        }
        self.quota = {
            "cpu": queue_gauge(
                f"{KAI}_queue_quota_cpu_cores", "A queue's CPU quota, in cores (-1: unlimited)"
            ),
            "memory": queue_gauge(
                f"{KAI}_queue_quota_memory_bytes", "A queue's memory quota, in bytes (-1: unlimited)"
            ),
            "gpu": queue_gauge(
                f"{KAI}_queue_deserved_gpus", "A queue's GPU quota (its deserved GPUs; -1: unlimited)"
            ),
        }
        self.requested = {
            "cpu": queue_gauge(
                "kairos_queue_requested_cpu_cores", "CPU requested by the queue's pods, in cores"
            ),
            "memory": queue_gauge(
                "kairos_queue_requested_memory_bytes", "Memory requested by the queue's pods"
            ),
            "gpu": queue_gauge("kairos_queue_requested_gpus", "GPUs requested by the queue's pods"),
        }
        self.usage = {
            "cpu": queue_gauge(
                f"{KAI}_queue_cpu_usage",
                "A queue's decayed CPU usage over the usage window, as a fraction of the cluster's CPU",
            ),
            "memory": queue_gauge(
                f"{KAI}_queue_memory_usage",
                "A queue's decayed memory usage over the usage window, as a fraction of the cluster's memory",
            ),
            "gpu": queue_gauge(
                f"{KAI}_queue_gpu_usage",
                "A queue's decayed GPU usage over the usage window, as a fraction of the cluster's GPUs",
            ),
        }
        self.usage_query = Histogram(
            f"{KAI}_usage_query_latency_milliseconds",
            "Milliseconds to read the queues' usage for a cycle (the usage ledger; time-based fair share)",
            buckets=KAI_LATENCY_BUCKETS_MS,
            registry=r,
        )
        self.info = queue_gauge(f"{KAI}_queue_info", "1 for every queue the leader knows")
        self.pending = Gauge(
            "kairos_queue_pending_podgroups", "Podgroups with pods to place at the last cycle", registry=r
        )
        self.leader = Gauge(
            "kairos_queue_leader", "1 while this replica holds the shard lease, else 0", registry=r
        )
        self.term = Gauge(
            "kairos_queue_lease_term", "The shard lease's term this replica last held", registry=r
        )
        self.lease_changes = Counter(
            "kairos_queue_lease_changes_total",
            "Leadership changes of this replica: acquired, lost",
            ["change"],
            registry=r,
        )
        self.round_trip = Histogram(
            "kairos_queue_work_round_trip_seconds",
            "Bus lag: seconds from publishing a work item to its outcome arriving (placement, binder, NATS)",
            buckets=SECONDS_BUCKETS,
            registry=r,
        )
        self._queue_gauges = (
            *self.fair_share.values(),
            *self.allocated.values(),
            *self.quota.values(),
            *self.requested.values(),
            *self.usage.values(),
            self.info,
        )
        metrics.derive(self.DERIVED)

    def observe_plan(
        self,
        shares: Iterable[QueueFairShare],
        pending: int,
        display_names: Mapping[str, str] | None = None,
    ) -> None:
        """A cycle's fair shares (as published in `queue-fair-share` events: GPUs, millicores, bytes);
        `display_names`: each queue's ``spec.displayName`` where it has one."""
        self.clear()
        names = display_names or {}
        for share in shares:
            s = queue_labels(share.queue, names.get(share.queue, ""), scheduler=True)
            q = queue_labels(share.queue, names.get(share.queue, ""), scheduler=False)
            self.info.labels(*q).set(1)
            self.fair_share["cpu"].labels(*s).set(share.fair_share.get("cpu", 0.0) / MILLI_CPU_PER_CORE)
            self.fair_share["memory"].labels(*s).set(share.fair_share.get("memory", 0.0) / BYTES_PER_GB)
            self.fair_share["gpu"].labels(*s).set(share.fair_share.get("gpu", 0.0))
            self.allocated["cpu"].labels(*q).set(share.allocated.get("cpu", 0.0) / MILLI_CPU_PER_CORE)
            self.allocated["memory"].labels(*q).set(share.allocated.get("memory", 0.0))
            self.allocated["gpu"].labels(*q).set(share.allocated.get("gpu", 0.0))
            self.quota["cpu"].labels(*q).set(_cores(share.deserved.get("cpu", 0.0)))
            self.quota["memory"].labels(*q).set(share.deserved.get("memory", 0.0))
            self.quota["gpu"].labels(*q).set(share.deserved.get("gpu", 0.0))
            self.requested["cpu"].labels(*q).set(share.requested.get("cpu", 0.0) / MILLI_CPU_PER_CORE)
            self.requested["memory"].labels(*q).set(share.requested.get("memory", 0.0))
            self.requested["gpu"].labels(*q).set(share.requested.get("gpu", 0.0))
            if share.usage:  # time-based fair share on (KAI sets usage only with a usage database)
                for resource, gauge in self.usage.items():
                    gauge.labels(*s).set(share.usage.get(resource, 0.0))
        self.pending.set(pending)

    def clear(self) -> None:
        """Forget every queue (a queue deleted since, or leadership lost)."""
        for gauge in self._queue_gauges:
            gauge.clear()
        self.pending.set(0)

    def leadership(self, leading: bool, term: int) -> None:
        self.leader.set(1 if leading else 0)
        self.lease_changes.labels("acquired" if leading else "lost").inc()
        if leading:
            self.term.set(term)
        else:
            self.clear()

    def work_round_trip(self, seconds: float) -> None:
        self.round_trip.observe(max(0.0, seconds))

    def usage_queried(self, seconds: float) -> None:
        """The queues' usage was read for a cycle in `seconds` (KAI's usage database query)."""
        self.usage_query.observe(_ms(max(0.0, seconds)))


# --- state ---------------------------------------------------------------------------------------------------
class InformerLike(Protocol):
    """`shared.kubeapi.informer.Informer` as the metrics read it."""

    @property
    def what(self) -> str: ...

    @property
    def relists(self) -> int: ...

    @property
    def errors(self) -> int: ...


class StateMetrics:
    """What the state service mirrors and writes: objects per kind, KV writes, informers, write-back,
    the pod-grouper and snapshot requests."""

    DERIVED = (
        Derived(
            "kairos_state_kv_writes_total",
            "Writes to KV by bucket: state (objects put or deleted), ledger (reservations and claims cleaned)",
            label="bucket",
            keys=(("state", "state_writes"), ("ledger", "ledger_writes")),
        ),
        Derived("kairos_state_kv_write_errors_total", "Batches of KV writes that failed", key="write_errors"),
        Derived(
            "kairos_state_ledger_conflicts_total",
            "Ledger clean-ups that lost a compare-and-set and were retried",
            key="ledger_conflicts",
        ),
        Derived(
            "kairos_state_writeback_total",
            "Writes into Kubernetes by kind: event (Events created), status (PodGroup, Queue and pod status patches)",
            label="kind",
            keys=(("event", "kube_events"), ("status", "kube_status_patches")),
        ),
        Derived(
            "kairos_state_podgrouper_total",
            "Pod-grouper passes by result: grouped (pod annotated), refused (cannot group), api_error",
            label="result",
            keys=(
                ("grouped", "pods_grouped"),
                ("refused", "podgrouper_refused"),
                ("api_error", "podgrouper_api_errors"),
            ),
        ),
        Derived("kairos_state_snapshot_requests_total", "Snapshot requests answered", key="snapshots"),
        Derived(
            "kairos_state_kube_changes_total", "Mirrored Kubernetes changes written to KV", key="kube_changes"
        ),
    )

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._objects: Callable[[], Mapping[str, int]] = dict
        self._revision: Callable[[], int] = lambda: 0
        self._informers: Callable[[], Iterable[InformerLike]] = tuple
        metrics.derive(self.DERIVED)
        metrics.collect_with(self._collect)

    def watch(
        self,
        *,
        objects: Callable[[], Mapping[str, int]] | None = None,
        revision: Callable[[], int] | None = None,
        informers: Callable[[], Iterable[InformerLike]] | None = None,
    ) -> None:
        """Where the scrape-time series come from: objects per kind in KV, the replica's revision, the
        Kubernetes source's informers (none while this replica does not own the source)."""
        if objects is not None:
            self._objects = objects
        if revision is not None:
            self._revision = revision
        if informers is not None:
            self._informers = informers

    def _collect(self) -> Iterator[Metric]:
        objects = GaugeMetricFamily(
            "kairos_state_objects",
            "Objects in the state KV by kind (node, pod, podgroup, queue, topology, namespace)",
            labels=["kind"],
        )
        for kind, count in sorted(self._objects().items()):
            objects.add_metric([kind], count)
        yield objects
        revision = GaugeMetricFamily(
            "kairos_state_revision", "The state KV revision this replica has applied"
        )
        revision.add_metric([], self._revision())
        yield revision
        relists = CounterMetricFamily(
            "kairos_state_informer_relists_total",
            "Full lists by resource (start, 410 Gone, resync)",
            labels=["resource"],
        )
        errors = CounterMetricFamily(
            "kairos_state_informer_errors_total",
            "List or watch calls that failed, by resource",
            labels=["resource"],
        )
        for informer in self._informers():
            relists.add_metric([informer.what], informer.relists)
            errors.add_metric([informer.what], informer.errors)
        yield relists
        yield errors


def count_kinds(kinds: Iterable[str]) -> dict[str, int]:
    """Objects per kind, for `StateMetrics.watch(objects=...)`."""
    return dict(_Tally(kinds))


# --- GPU agent -----------------------------------------------------------------------------------------------
class GpuAgentMetrics:
    DERIVED = (
        Derived("kairos_gpu_inventories_published_total", "Inventories published", key="inventories"),
        Derived(
            "kairos_gpu_inventory_publish_failures_total",
            "Inventories NATS did not take",
            key="publish_failures",
        ),
        Derived(
            "kairos_gpu_unhealthy_devices",
            "Devices NVML reports unhealthy at the last reading",
            key="unhealthy_devices",
            gauge=True,
        ),
    )

    def __init__(self, metrics: ServiceMetrics) -> None:
        metrics.derive(self.DERIVED)
