"""The chaos run: the whole Kubernetes-path stack under load while replicas die, nats-server restarts and
the API server misbehaves; then the independent checker's verdict.

`run(options)` starts the simulated API server, nats-server and at least two replicas of every service
(`tools.stack.supervisor.start_stack`), creates the workload's queues through the API, then, wave by wave, a
third of a wave of pods and PodGroups (`tools.chaos.workload`), one fault once binding is under way, a
third while it is on and the last third once it is over:

- `kill`: SIGKILL one random replica of a service, start it again a second later (as a kubelet would);
- `nats-kill`: nats-server killed (SIGKILL) and started on the same port with the same JetStream store;
- `api-500`, `api-429`, `api-slow`: a fault plan on the simulated API server (`/kubesim/faults`) for a few
  seconds: the first two binding calls, then half of them and a tenth of everything else answer 500; a third of all requests
  answer 429 with Retry-After; half the answers come half a second late;
- `drop-watch`: every open watch closed at once; `watch-410`: the watches closed and their resumes
  answered 410 Gone, so every informer lists again;
- `budget-refusal`: a preemption a PodDisruptionBudget refuses (`tools.chaos.scenarios`): the victim must
  stay while the budget holds (the binder reports the refusal and does not push it through), and the
  preemptor must be bound once the budget is deleted; either failing is a violation (`budget-broken`,
  `budget-stuck`);
- `terminating-sharer`: a GPU sharer deleted with a grace period while its container takes
  `fault_seconds` + 6 s to stop, on a node of one GPU; a whole-GPU pod created meanwhile must not get the node
  until the sharer has stopped (`sharer-overlapped`) and must get it then (`sharer-stuck`).

For each fault it records when it happened and how long until the system made progress again: the next
pod bound (seen on a watch of pods) after the fault began and after it ended, and, for a killed replica
or a killed nats-server, until every replica sent a ready heartbeat again. Once the work is done (every
pod that fits bound, every other one told why not, as the API shows; or, short of that, nothing bound for
`quiet` seconds) it reads the API server (pods, nodes, PodGroups, Queues, Events, the
binding record), the ledger's claims from JetStream and the binders' outcomes it heard, and hands them to
`tools.chaos.checker.check`. Called by `kairos chaos` and the CI test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from shared.bus.connection import Bus, connect
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import HEARTBEATS, OUTCOMES
from shared.errors import ConfigError, MalformedMessage, TemporaryError
from shared.kubeapi.client import Kube
from shared.kubeapi.client import connect as kube_connect
from shared.kubeapi.informer import Informer
from shared.kubeapi.paths import collection_path
from tools.chaos.checker import Observed, OutcomeSeen, Verdict, Violation, check, unexplained
from tools.chaos.scenarios import BudgetScenario, SharerScenario
from tools.chaos.workload import NAMESPACE, Group, Workload, build
from tools.stack.nats_server import CLUSTER_NAME
from tools.stack.pod_watch import pod_watch
from tools.stack.supervisor import ClusterChoice, Stack, start_stack

__all__ = [
    "PROCESS_FAULTS",
    "ChaosOptions",
    "ChaosReport",
    "ChaosRun",
    "FaultRecord",
    "run",
    "start",
    "started",
]

log = logging.getLogger("kairos.chaos")

SERVICES = ("state", "queue", "placement", "binder")
SHARER_STOP_MARGIN = 6.0
"""Seconds a terminating sharer's container takes to stop beyond `fault_seconds`."""
API_FAULTS: dict[str, list[dict[str, Any]]] = {
    "api-500": [
        {"verb": "create", "resource": "pods/binding", "status": 500, "limit": 2},
        {"verb": "create", "resource": "pods/binding", "fraction": 0.5, "status": 500},
        {"fraction": 0.1, "status": 500},
    ],
    "api-429": [{"fraction": 0.33, "status": 429, "retry_after": 1}],
    "api-slow": [{"fraction": 0.5, "delay": 0.5}],
}
FAULTS = (
    *(f"kill:{service}" for service in SERVICES),
    "nats-kill",
    *API_FAULTS,
    "drop-watch",
    "watch-410",
    "budget-refusal",
    "terminating-sharer",
)
CLUSTER_FAULTS = tuple(
    fault
    for kind in FAULTS
    for fault in (("nats-kill:follower", "nats-kill:leader") if kind == "nats-kill" else (kind,))
)
"""With a NATS cluster: one node that does not lead the work stream killed, then the node that leads it."""


PROCESS_FAULTS = tuple(kind for kind in CLUSTER_FAULTS if kind.startswith(("kill:", "nats-kill")))
"""The faults that kill a process (a replica, a nats-server): with `ChaosOptions.only`, the run of a NATS
cluster that leaves the API server's faults to the single server's run."""


def faults(options: ChaosOptions) -> tuple[str, ...]:
    """The faults a run injects, in order: every one, or those of `options.only`."""
    planned = CLUSTER_FAULTS if options.nats_cluster > 1 else FAULTS
    if options.only:
        unknown = sorted(set(options.only) - set(planned))
        if unknown:
            raise ConfigError(f"chaos faults: {', '.join(unknown)} is not one of {', '.join(planned)}")
        planned = tuple(kind for kind in planned if kind in options.only)
    return planned


class ChaosOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pods: int = 5000
    replicas: int = 2
    """Replicas of every service (at least 2: a kill must leave one standing)."""
    seed: int = 7
    fault_seconds: float = 5.0
    """How long an API-server fault stays on."""
    recover_timeout: float = 120.0
    """Seconds a fault may take to recover before the run moves on (and reports it unrecovered)."""
    quiet: float = 120.0
    """Seconds without a new bind after the last fault that end the run (at 5,000 pods on a loaded 2-core
    machine, 30 s of no binds happened while work items were still timing out and going out again)."""
    timeout: float = 1800.0
    """Seconds the whole load may take."""
    run_delay: float = 0.2
    nats_cluster: int = 1
    """nats-servers in one JetStream cluster (streams and buckets then at 3 replicas, as deploy/ runs them);
    1: a single server."""
    kill_replica: int | None = None
    """The replica a `kill:` fault kills (None: a random one). The soak always kills replica 1, so replica
    0 of every service runs the whole soak and its memory is comparable from start to end."""
    only: tuple[str, ...] = ()
    """The faults to inject, in their usual order (empty: every one)."""


class FaultRecord(msgspec.Struct, kw_only=True):
    kind: str
    target: str = ""
    at_s: float
    """When it began, seconds since the load started."""
    duration_s: float = 0.0
    """How long it was on (API faults) or how long the target was down (a kill, a restart)."""
    next_bind_s: float | None = None
    """From its start to the next pod bound (None: none before the run moved on)."""
    next_bind_after_s: float | None = None
    """From its end to the next pod bound."""
    healthy_s: float | None = None
    """From its start until every replica reported ready again (process faults)."""
    refused: int | None = None
    """`budget-refusal`: the evictions the binder reported refused while the budget held."""
    preemptor_bound_s: float | None = None
    """`budget-refusal`: from the budget's removal until the preemptor was bound."""
    waiter_bound_s: float | None = None
    """`terminating-sharer`: from the sharer's stop until the whole-GPU pod was bound."""


class ChaosReport(msgspec.Struct, kw_only=True):
    pods: int
    nodes: int
    replicas: dict[str, int]
    bound: int
    unschedulable: int
    duration_s: float
    faults: list[FaultRecord]
    violations: list[Violation]
    clean: bool
    injected: dict[str, int] = msgspec.field(default_factory=dict)
    """What the simulated API server counted (faulted requests by kind, dropped watches)."""
    outcomes: dict[str, int] = msgspec.field(default_factory=dict)
    state_dir: str = ""


def run(
    options: ChaosOptions, say: Callable[[str], None] = lambda _line: None, keep: Path | None = None
) -> ChaosReport:
    """Start a stack, run the chaos load, check, stop the stack. With `keep` the state directory (logs)
    stays there; otherwise a temporary one is removed."""
    workload = build(options.pods, waves=len(faults(options)) + 1, seed=options.seed)
    with started(options, workload.nodes, keep, say) as stack:
        say(f"chaos: {len(workload.pod_keys)} pods on {workload.nodes} nodes, in {stack.state_dir}")
        report = asyncio.run(ChaosRun(stack, workload, options, say).run())
        report.state_dir = str(stack.state_dir) if keep else ""
        return report


@contextlib.contextmanager
def started(
    options: ChaosOptions,
    nodes: int,
    keep: Path | None,
    say: Callable[[str], None],
    prefix: str = "chaos",
    env: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """`start` in `keep` (or a temporary directory `kairos-<prefix>-*`, removed afterwards), stopped when
    the block ends."""
    state_dir = keep or Path(tempfile.mkdtemp(prefix=f"kairos-{prefix}-"))
    stack = start(options, nodes, state_dir, say, env)
    try:
        yield stack
    finally:
        stack.stop(timeout=5.0)
        if keep is None:
            shutil.rmtree(state_dir, ignore_errors=True)


@dataclass
class Connections:
    """What a chaos run talks through; `close` ends them all."""

    kube: Kube
    bus: Bus
    http: aiohttp.ClientSession
    subs: list[Any]
    watching: asyncio.Task[None]

    async def close(self) -> None:
        self.watching.cancel()
        with contextlib.suppress(BaseException):
            await self.watching
        for sub in self.subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await self.http.close()
        await self.bus.close()
        await self.kube.close()


def start(
    options: ChaosOptions,
    nodes: int,
    state_dir: Path,
    say: Callable[[str], None],
    env: Mapping[str, str] | None = None,
) -> Stack:
    """The stack a chaos run breaks: kubesim with `nodes` 8-GPU nodes, NATS, `options.replicas` (at least 2)
    of every service; `env` is added to every process's environment."""
    replicas = dict.fromkeys(SERVICES, max(2, options.replicas))
    started = time.monotonic()
    stack = start_stack(
        state_dir,
        replicas=replicas,
        options={
            "queue": {"batch": "100", "period": "0.5"},
            "binder": {"conflicts": "fit"},
        },
        timeout=180.0,
        cluster=ClusterChoice(kind="kubesim", nodes=nodes, gpus_per_node=8, run_delay=options.run_delay),
        nats_cluster=options.nats_cluster,
        env=env,
    )
    say(f"chaos: stack up in {time.monotonic() - started:.1f} s, replicas {replicas}")
    return stack


class ChaosRun:
    """One chaos load against a started stack; `tools.chaos.soak.Soak` drives its faults and checker too."""

    def __init__(
        self, stack: Stack, workload: Workload, options: ChaosOptions, say: Callable[[str], None]
    ) -> None:
        self.stack = stack
        self.workload = workload
        self.options = options
        self.say = say
        self.rng = random.Random(options.seed)
        self.t0 = time.monotonic()
        self.binds: list[float] = []
        self.bound: set[str] = set()
        self.must_bind: set[str] = workload.must_bind
        """The pods (names) a correct scheduler binds; the others may stay pending with a reason."""
        self.beats: dict[str, float] = {}
        """Replica -> when its last ready heartbeat arrived."""
        self.outcomes: list[OutcomeSeen] = []
        self.faults: list[FaultRecord] = []
        self.violations: list[Violation] = []
        """What the faults themselves found wrong (the budget fault), added to the checker's verdict."""
        self._synced = asyncio.Event()

    # --- the run ----------------------------------------------------------------------------------------------
    async def open(self, kubeconfig: Path) -> Connections:
        """Connect to the API server and NATS, follow heartbeats, outcomes and the pods' binds."""
        kube = await kube_connect(str(kubeconfig))
        bus = await connect(self.stack.url, "kairos-chaos")
        http = aiohttp.ClientSession(base_url=kube.server.rstrip("/"))
        subs = await self._subscribe(bus)
        watching = asyncio.create_task(self._informer(kube).run())
        connections = Connections(kube, bus, http, subs, watching)
        try:
            await asyncio.wait_for(self._synced.wait(), 60.0)
        except BaseException:
            await connections.close()
            raise
        return connections

    def expected(self) -> list[str]:
        """Every pod the checker must find (a missing one is lost)."""
        return self.workload.pod_keys

    def _done(self) -> bool:
        return len(self.bound) >= len(self.workload.pod_keys)

    def _idle(self) -> bool:
        """Whether no bind can follow: every pod of the load that fits is bound."""
        return self.must_bind <= self.bound

    def outcome_counts(self) -> dict[str, int]:
        statuses: dict[str, int] = {}
        for o in self.outcomes:
            statuses[o.status] = statuses.get(o.status, 0) + 1
        return statuses

    async def run(self) -> ChaosReport:
        kubeconfig = self.stack.kubeconfig
        if kubeconfig is None:
            raise TemporaryError("the stack wrote no kubeconfig")
        connections = await self.open(kubeconfig)
        http, bus = connections.http, connections.bus
        try:
            for queue in self.workload.queues:
                await self._post(http, queue)
            self.t0 = time.monotonic()
            planned = faults(self.options)
            for i, wave in enumerate(self.workload.waves):
                if i >= len(planned):
                    await self._create(http, wave)
                    break
                # A third of the wave before the fault (binding is under way when it strikes), a third
                # while it is on, a third once it is over (new work the recovered system must schedule).
                third = max(1, len(wave) // 3)
                before = len(self.binds)
                creating = asyncio.create_task(self._create(http, wave[:third]))
                await self._wait_for_progress(before, 60.0)
                await self._fault(http, bus, planned[i], wave[third : 2 * third], wave[2 * third :])
                await creating
            await self._settle(http)
            duration = time.monotonic() - self.t0
            verdict, injected = await self._check(http, bus)
        finally:
            await connections.close()
        return ChaosReport(
            pods=verdict.pods,
            nodes=self.workload.nodes,
            replicas=dict.fromkeys(SERVICES, self.options.replicas),
            bound=verdict.bound,
            unschedulable=verdict.unschedulable,
            duration_s=round(duration, 1),
            faults=self.faults,
            violations=verdict.violations,
            clean=verdict.clean,
            injected=injected,
            outcomes=self.outcome_counts(),
        )

    def _now(self) -> float:
        return time.monotonic() - self.t0

    async def _wait_for_progress(self, seen: int, timeout: float) -> None:
        """Until a pod was bound after the `seen` first ones: the fault then meets binding in progress."""
        deadline = time.monotonic() + timeout
        while len(self.binds) <= seen and time.monotonic() < deadline:  # noqa: ASYNC110 -- polls a list
            await asyncio.sleep(0.1)

    async def _settle(self, http: aiohttp.ClientSession) -> None:
        """Until the end the checker looks for is reached: every pod that fits bound (`must_bind`) and every
        other one bound or told why not (`tools.chaos.checker.unexplained`, read from the API once a
        second). Short of that, until no pod was bound for `quiet` seconds (a gang the faults left no room
        for), or the run's timeout."""
        deadline = self.t0 + self.options.timeout
        looked = 0.0
        while time.monotonic() < deadline:
            last = self.binds[-1] if self.binds else self.t0
            if self._done() or time.monotonic() - last > self.options.quiet:
                return
            if self._idle() and time.monotonic() - looked >= 1.0:
                looked = time.monotonic()
                if not await self._unexplained(http):
                    return
            await asyncio.sleep(0.5)
        self.say(f"chaos: gave up waiting after {self.options.timeout:.0f} s")

    async def _unexplained(self, http: aiohttp.ClientSession) -> list[str]:
        """The expected pods still pending with no reason given (all of them while the API answers badly)."""
        lists: list[list[dict[str, Any]]] = []
        for path in (
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            f"/api/v1/namespaces/{NAMESPACE}/events",
            f"/apis/scheduling.run.ai/v2alpha2/namespaces/{NAMESPACE}/podgroups",
        ):
            try:
                async with http.get(path) as resp:
                    if resp.status != 200:
                        return self.expected()
                    lists.append((await resp.json())["items"])
            except aiohttp.ClientError:
                return self.expected()
        pods, events, podgroups = lists
        return unexplained(pods, events, podgroups, self.expected())

    # --- faults -----------------------------------------------------------------------------------------------
    async def _nats_node(self, bus: Bus, kind: str) -> int | None:
        """The cluster node a `nats-kill:leader` or `nats-kill:follower` fault kills: the one leading the
        work stream, or another (None: a single server)."""
        if self.options.nats_cluster <= 1:
            return None
        info = await bus.js.stream_info(s.WORK_STREAM)
        leader = info.cluster.leader if info.cluster is not None else None
        names = [f"{CLUSTER_NAME}-{i}" for i in range(self.options.nats_cluster)]
        leading = names.index(leader) if leader in names else 0
        if kind.endswith(":leader"):
            return leading
        return next(i for i in range(len(names)) if i != leading)

    async def _fault(
        self,
        http: aiohttp.ClientSession,
        bus: Bus,
        kind: str,
        during: tuple[Group, ...],
        after: tuple[Group, ...],
    ) -> None:
        """Inject one fault, create `during` meanwhile, undo it, create `after`, and record how long until
        pods were bound again."""
        record = FaultRecord(kind=kind, at_s=round(self._now(), 2))
        began = time.monotonic()
        binds_before = len(self.binds)
        healthy: float | None = None
        # Work created while the fault is on: its requests meet the API faults.
        creating = asyncio.create_task(self._create_soon(http, during))
        if kind.startswith("kill:"):
            service = kind.partition(":")[2]
            index = self.options.kill_replica
            if index is None:
                index = self.rng.randrange(self.options.replicas)
            target = f"{service}-{index}"
            record.target = target
            process = self.stack.processes[target]
            os.kill(process.pid, signal.SIGKILL)
            await asyncio.to_thread(process.wait)
            await asyncio.sleep(1.0)
            restarted = time.monotonic()
            self.stack.restart(target)
            record.duration_s = round(restarted - began, 2)
            healthy = await self._healthy({target}, restarted)
        elif kind.startswith("nats-kill"):
            node = await self._nats_node(bus, kind)
            record.target = "nats-server" if node is None else f"{CLUSTER_NAME}-{node}"
            await asyncio.to_thread(self.stack.restart_nats, kill=True, node=node or 0)
            restarted = time.monotonic()
            record.duration_s = round(restarted - began, 2)
            replicas = {name for name in self.stack.processes if name != "kubesim"}
            healthy = await self._healthy(replicas, restarted)
        elif kind in API_FAULTS:
            record.target = "kube-apiserver"
            await self._plan(http, API_FAULTS[kind])
            await asyncio.sleep(self.options.fault_seconds)
            await self._plan(http, [])
            record.duration_s = round(time.monotonic() - began, 2)
        elif kind == "budget-refusal":
            await self._budget(http, record)
            record.duration_s = round(time.monotonic() - began, 2)
        elif kind == "terminating-sharer":
            await self._sharer(http, record)
            record.duration_s = round(time.monotonic() - began, 2)
        else:
            record.target = "watches"
            if kind == "watch-410":
                await self._plan(http, [{"verb": "watch", "status": 410, "limit": 20}])
            async with http.post("/kubesim/faults/drop-watches") as resp:
                dropped = (await resp.json())["dropped"]
            record.target = f"{dropped} watches"
            if kind == "watch-410":
                await asyncio.sleep(self.options.fault_seconds)
                await self._plan(http, [])
            record.duration_s = round(time.monotonic() - began, 2)
        ended = time.monotonic()
        await creating
        await self._create(http, after)
        if healthy is not None:
            record.healthy_s = round(healthy - began, 2)
        deadline = began + self.options.recover_timeout
        while time.monotonic() < deadline and (len(self.binds) <= binds_before or self.binds[-1] < ended):
            if self._idle():
                break
            await asyncio.sleep(0.1)
        since = self.binds[binds_before:]
        if since:
            record.next_bind_s = round(since[0] - began, 2)
        later = [t for t in since if t >= ended]
        if later:
            record.next_bind_after_s = round(later[0] - ended, 2)
        self.faults.append(record)
        process_fault = kind.startswith(("kill:", "nats-kill"))
        healthy_text = f", healthy again {_secs(record.healthy_s)}" if process_fault else ""
        if kind == "budget-refusal":
            healthy_text = f", preemptor bound {_secs(record.preemptor_bound_s)} after the budget went"
        elif kind == "terminating-sharer":
            healthy_text = f", whole-GPU pod bound {_secs(record.waiter_bound_s)} after the sharer stopped"
        self.say(
            f"chaos: {kind} {record.target} at {record.at_s:.1f} s for {record.duration_s:.1f} s: next bind "
            f"{_secs(record.next_bind_s)}, after its end {_secs(record.next_bind_after_s)}{healthy_text}"
        )

    async def _budget(self, http: aiohttp.ClientSession, record: FaultRecord) -> None:
        scenario = BudgetScenario(http, self._post, self.options.recover_timeout)
        await scenario.arm()
        record.refused = await scenario.refused()
        await asyncio.sleep(self.options.fault_seconds)  # held on: a refusal must not be pushed through
        result = await scenario.disarm()
        record.target = f"{result.refused} eviction(s) refused"
        record.refused = result.refused
        record.preemptor_bound_s = result.preemptor_bound_s
        where = f"{scenario.namespace}/{scenario.victim}"
        if not result.victim_kept:
            self.violations.append(Violation("budget-broken", where, "evicted while its budget held"))
        if result.preemptor_bound_s is None:
            self.violations.append(
                Violation("budget-stuck", where, "the preemptor was not bound once the budget was gone")
            )

    async def _sharer(self, http: aiohttp.ClientSession, record: FaultRecord) -> None:
        # Longer than the 5 s after which the binder once took a deleted sharer's reservation back.
        stop = self.options.fault_seconds + SHARER_STOP_MARGIN
        scenario = SharerScenario(http, self._post, self.options.recover_timeout, stop)
        result = await scenario.run()
        record.target = f"sharer stopping {result.terminating_s:.1f} s"
        record.waiter_bound_s = result.whole_bound_s
        where = f"{scenario.namespace}/{scenario.whole}"
        if result.overlapped:
            self.violations.append(
                Violation("sharer-overlapped", where, "given the node's GPU while the sharer's container ran")
            )
        if result.whole_bound_s is None:
            self.violations.append(Violation("sharer-stuck", where, "not bound once the sharer had stopped"))

    async def _healthy(self, replicas: set[str], since: float) -> float | None:
        """When every replica of `replicas` had sent a ready heartbeat after `since` (None: not in time)."""
        deadline = since + self.options.recover_timeout
        while time.monotonic() < deadline:
            if all(self.beats.get(r, 0.0) > since for r in replicas):
                return max(self.beats[r] for r in replicas)
            await asyncio.sleep(0.1)
        return None

    async def _plan(self, http: aiohttp.ClientSession, rules: list[dict[str, Any]]) -> None:
        body = json.dumps({"rules": rules, "seed": self.rng.randrange(2**31)}).encode()
        async with http.post("/kubesim/faults", data=body) as resp:
            if resp.status != 200:
                raise TemporaryError(f"kubesim refused the fault plan: {await resp.text()}")

    # --- load -------------------------------------------------------------------------------------------------
    async def _create(self, http: aiohttp.ClientSession, wave: tuple[Group, ...]) -> None:
        sem = asyncio.Semaphore(16)

        async def one(group: Group) -> None:
            async with sem:
                for pod in group.pods:
                    await self._post(http, pod)
                await self._post(http, group.podgroup)

        await asyncio.gather(*(one(g) for g in wave))

    async def _create_soon(self, http: aiohttp.ClientSession, wave: tuple[Group, ...]) -> None:
        await asyncio.sleep(0.2)  # the fault first
        await self._create(http, wave)

    async def _post(self, http: aiohttp.ClientSession, manifest: dict[str, Any]) -> None:
        """Create one object; retried while the API server answers 429/5xx (a fault may be on)."""
        meta = manifest["metadata"]
        path = collection_path(manifest["apiVersion"], manifest["kind"], meta.get("namespace"))
        body = json.dumps(manifest).encode()
        for attempt in range(60):
            try:
                async with http.post(path, data=body, headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    if resp.status < 300 or resp.status == 409:
                        return
                    if resp.status != 429 and resp.status < 500:
                        raise TemporaryError(f"create {manifest['kind']} {meta['name']}: {resp.status}")
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(min(2.0, 0.1 * (attempt + 1)))
        raise TemporaryError(f"create {manifest['kind']} {meta['name']}: the API server kept failing")

    # --- observing --------------------------------------------------------------------------------------------
    def _informer(self, kube: Kube) -> Informer:
        async def on_pod(event: str, name: str, node: str) -> None:
            if event != "DELETED" and node and name not in self.bound:
                self.bound.add(name)
                self.binds.append(time.monotonic())

        informer = pod_watch(kube, NAMESPACE, on_pod)
        self._synced = informer.synced
        return informer

    async def _subscribe(self, bus: Bus) -> list[Any]:
        async def on_beat(msg: Any) -> None:
            try:
                beat = HEARTBEATS.decode(msg.subject, msg.data)
            except MalformedMessage:
                return
            if beat.ready:
                self.beats[beat.replica] = time.monotonic()

        async def on_outcome(msg: Any) -> None:
            try:
                outcome = OUTCOMES.decode(msg.subject, msg.data)
            except MalformedMessage:
                return
            self.outcomes.append(OutcomeSeen(outcome.proposal, outcome.status, tuple(outcome.bound)))

        return [
            await bus.nc.subscribe(s.HEALTH_WILDCARD, cb=on_beat),
            # From the stream: an outcome a binder published twice (its acknowledgement was lost) is stored once.
            await bus.follow(s.OUTCOMES_WILDCARD, s.OUTCOME_STREAM, on_outcome),
        ]

    # --- the verdict ------------------------------------------------------------------------------------------
    async def _check(self, http: aiohttp.ClientSession, bus: Bus) -> tuple[Verdict, dict[str, int]]:
        async def items(path: str) -> list[dict[str, Any]]:
            async with http.get(path) as resp:
                listed: list[dict[str, Any]] = (await resp.json())["items"]
                return listed

        # The stack keeps running while it is judged: the cluster is read first, the records after, so a
        # pod that shows a node had its binding call and ledger claim recorded before it was read (the
        # other order once reported a pod bound between the two reads as bound without a call).
        pods = await items(f"/api/v1/namespaces/{NAMESPACE}/pods")
        nodes = await items("/api/v1/nodes")
        podgroups = await items(f"/apis/scheduling.run.ai/v2alpha2/namespaces/{NAMESPACE}/podgroups")
        queues = await items("/apis/scheduling.run.ai/v2/queues")
        events = await items(f"/api/v1/namespaces/{NAMESPACE}/events")
        async with http.get("/kubesim/bindings") as resp:
            bindings = (await resp.json())["bindings"]
        async with http.get("/kubesim/faults") as resp:
            injected = (await resp.json())["injected"]
        replica = StateReplica(bus)
        await replica.start(timeout=60.0)
        try:
            claims = {claim.pod: claim.node for claim in replica.claims.values()}
        finally:
            await replica.stop()
        observed = Observed(
            pods=pods,
            nodes=nodes,
            podgroups=podgroups,
            queues=queues,
            events=events,
            bindings=bindings,
            claims=claims,
            outcomes=self.outcomes,
            expected=self.expected(),
        )
        verdict = check(observed)
        verdict.violations.extend(self.violations)
        return verdict, injected


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"
