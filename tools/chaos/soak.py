"""The soak: the chaos stack under a steady churn of jobs for many minutes, with a fault every few minutes,
while every process's resident memory is sampled.

`soak(options, chaos)` starts the same stack as a chaos run (`tools.chaos.runner.started`: kubesim, NATS,
two or more replicas of every service) and then, for `minutes`:

- **churn**: `rate` podgroups a second arrive through the API (the chaos mix of `tools.chaos.workload`),
  each pod labelled `kairos.io/run-seconds` so kubesim's node simulator lets it succeed that long after it
  started; a podgroup whose pods all succeeded is deleted (pods and PodGroup), as a Job's
  `ttlSecondsAfterFinished: 0` would, so the cluster holds a steady population rather than a growing one;
- **faults**: the chaos run's faults (`tools.chaos.runner.faults`), spread evenly over the soak, each one
  once; a `kill:` fault always kills replica 1, so replica 0 of every service lives through the whole soak;
- **memory**: the RSS of every process (each replica, kubesim, each nats-server) every `sample_every`
  seconds, read with psutil.

Then the arrivals stop, the work left settles (every pod that fits bound, every other one told why not;
or no new bind for `quiet` seconds), and the chaos checker
judges the cluster (`tools.chaos.checker`; the pods the soak deleted after they succeeded are not lost).
The memory verdict compares each service's replica 0 at the end (the median of the last minute's
samples) with its value after `baseline` seconds (the median of the samples within 30 s of it; 5 minutes,
or a third of a shorter soak): within `tolerance` (10 %) both ways. Called by `kairos chaos --soak` and the
CI test of the short form.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import signal
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psutil

from shared.telemetry import heap
from tools.chaos.checker import Violation
from tools.chaos.runner import SERVICES, ChaosOptions, ChaosRun, FaultRecord, faults, started
from tools.chaos.workload import MEAN_GPUS, NAMESPACE, QUEUES, Workload, churn_group, may_stay_pending
from tools.stack.supervisor import Stack

__all__ = ["MemoryVerdict", "RssSample", "SoakOptions", "SoakReport", "judge_memory", "soak"]

MEASURED_REPLICA = 0
KILLED_REPLICA = 1
BASELINE_SECONDS = 300.0
WINDOW_SECONDS = 30.0
END_WINDOW_SECONDS = 60.0
SETTLE_SECONDS = 300.0
"""How long the work left when the arrivals stop may take to settle (the last pods run up to 90 s)."""


class SoakOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    minutes: float
    """How long jobs keep arriving."""
    rate: float = 2.0
    """Podgroups arriving per second."""
    run_seconds: tuple[int, int] = (30, 90)
    """Each pod runs a time drawn from this range (inclusive), then succeeds."""
    sample_every: float = 10.0
    """Seconds between two RSS samples of every process."""
    tolerance: float = 0.10
    """How far a service's RSS at the end may be from its value after the baseline time."""
    reap_every: float = 5.0
    """Seconds between two sweeps that delete the podgroups whose pods all succeeded."""
    heap_dir: str = ""
    """Where the measured replicas of `heap_of` write heap snapshots (`shared.telemetry.heap`): one at
    the baseline time and one when the arrivals stop. Empty: none taken, nothing traced."""
    heap_of: tuple[str, ...] = ("state",)
    """The services whose measured replica traces its allocations (tracing costs each of them CPU)."""


class RssSample(msgspec.Struct, frozen=True, array_like=True):
    at_s: float
    process: str
    pid: int
    rss: int
    """Bytes."""


class MemoryVerdict(msgspec.Struct, frozen=True, kw_only=True):
    process: str
    baseline_mib: float | None
    end_mib: float | None
    change: float | None
    """(end - baseline) / baseline; None when either is missing."""
    ok: bool
    detail: str = ""


class SoakReport(msgspec.Struct, kw_only=True):
    minutes: float
    nodes: int
    replicas: dict[str, int]
    created_pods: int
    created_groups: int
    succeeded_and_deleted_pods: int
    bound: int
    unschedulable: int
    duration_s: float
    faults: list[FaultRecord]
    violations: list[Violation]
    memory: list[MemoryVerdict]
    samples: list[RssSample]
    baseline_s: float
    injected: dict[str, int] = msgspec.field(default_factory=dict)
    outcomes: dict[str, int] = msgspec.field(default_factory=dict)
    state_dir: str = ""
    heap: dict[str, tuple[str, str]] = msgspec.field(default_factory=dict)
    """Measured replica -> its heap snapshots at the baseline and at the end (`kairos heap-diff` reads
    them); empty without `heap_dir`."""

    @property
    def clean(self) -> bool:
        return not self.violations

    @property
    def memory_ok(self) -> bool:
        return all(m.ok for m in self.memory)


def nodes_for(options: SoakOptions) -> int:
    """Nodes that hold the steady population with room: arrivals x mean run time x mean GPUs, plus half."""
    mean_run = sum(options.run_seconds) / 2
    gpus = options.rate * mean_run * MEAN_GPUS
    return max(4, math.ceil(gpus * 1.5 / 8))


def baseline_seconds(minutes: float) -> float:
    """When the reference value is taken: after 5 minutes, or a third of a shorter soak."""
    return min(BASELINE_SECONDS, minutes * 60.0 / 3)


def judge_memory(
    samples: list[RssSample], baseline_s: float, end_s: float, tolerance: float
) -> list[MemoryVerdict]:
    """Each service's measured replica: its median RSS within `WINDOW_SECONDS` of `baseline_s` against its
    median over the last `END_WINDOW_SECONDS` before `end_s`. A replica that restarted in between (another
    pid) fails: its memory is not comparable, and it was not meant to die. Pure."""
    out: list[MemoryVerdict] = []
    by_process: dict[str, list[RssSample]] = defaultdict(list)
    for sample in samples:
        by_process[sample.process].append(sample)
    for service in SERVICES:
        name = f"{service}-{MEASURED_REPLICA}"
        mine = by_process.get(name, [])
        base = [x for x in mine if abs(x.at_s - baseline_s) <= WINDOW_SECONDS]
        end = [x for x in mine if end_s - END_WINDOW_SECONDS <= x.at_s <= end_s]
        if not base or not end:
            out.append(
                MemoryVerdict(
                    process=name,
                    baseline_mib=None,
                    end_mib=None,
                    change=None,
                    ok=False,
                    detail="no samples at the baseline or at the end",
                )
            )
            continue
        b = statistics.median(x.rss for x in base)
        e = statistics.median(x.rss for x in end)
        change = (e - b) / b
        pids = {x.pid for x in base + end}
        ok = abs(change) <= tolerance and len(pids) == 1
        detail = "" if len(pids) == 1 else f"restarted between the baseline and the end (pids {sorted(pids)})"
        out.append(
            MemoryVerdict(
                process=name,
                baseline_mib=round(b / 2**20, 1),
                end_mib=round(e / 2**20, 1),
                change=round(change, 4),
                ok=ok,
                detail=detail,
            )
        )
    return out


def soak(
    options: SoakOptions,
    chaos: ChaosOptions,
    say: Callable[[str], None] = lambda _line: None,
    keep: Path | None = None,
) -> SoakReport:
    """Start a stack, soak it, judge, stop it. With `keep` the state directory (logs) stays there."""
    nodes = nodes_for(options)
    # The run's timeout counts from the first arrival: the soak itself, then the settling after it.
    chaos = msgspec.structs.replace(
        chaos, kill_replica=KILLED_REPLICA, timeout=options.minutes * 60.0 + SETTLE_SECONDS
    )
    env: dict[str, str] = {}
    if options.heap_dir:
        env[heap.ENV_DIR] = options.heap_dir
        env[heap.ENV_REPLICAS] = ",".join(f"{service}-{MEASURED_REPLICA}" for service in options.heap_of)
    with started(chaos, nodes, keep, say, prefix="soak", env=env) as stack:
        say(
            f"soak: {options.minutes:g} min, {options.rate:g} podgroups/s running {options.run_seconds[0]}-"
            f"{options.run_seconds[1]} s, {nodes} nodes, in {stack.state_dir}"
        )
        workload = Workload(queues=QUEUES, waves=(), nodes=nodes)
        report = asyncio.run(Soak(stack, workload, chaos, say, options).soak())
        report.state_dir = str(stack.state_dir) if keep else ""
        return report


class Soak(ChaosRun):
    """A chaos run whose load is a steady churn instead of waves."""

    def __init__(
        self,
        stack: Stack,
        workload: Workload,
        chaos: ChaosOptions,
        say: Callable[[str], None],
        options: SoakOptions,
    ) -> None:
        super().__init__(stack, workload, chaos, say)
        self.soak_options = options
        self.churn_rng = random.Random(chaos.seed)
        self.created: list[str] = []
        self.groups = 0
        self.reaped: set[str] = set()
        self.samples: list[RssSample] = []
        self._processes: dict[int, psutil.Process] = {}
        self.heap: dict[str, tuple[str, str]] = {}
        self.arrived = False
        """Whether every arrival was created."""

    def _done(self) -> bool:
        return False  # a soak never runs out of work while it lasts

    def _idle(self) -> bool:
        """Once the arrivals are over, as a chaos run: every pod that fits bound. Before, work comes."""
        return self.arrived and super()._idle()

    async def soak(self) -> SoakReport:
        kubeconfig = self.stack.kubeconfig
        assert kubeconfig is not None
        session = await self.open(kubeconfig)
        http = session.http
        length = self.soak_options.minutes * 60.0
        planned = faults(self.options)
        try:
            for queue in self.workload.queues:
                await self._post(http, queue)
            self.t0 = time.monotonic()
            background = [
                asyncio.create_task(self._arrivals(http, length)),
                asyncio.create_task(self._reaper(http)),
                asyncio.create_task(self._sampler()),
                asyncio.create_task(self._heap_snapshots(length)),
            ]
            try:
                # Each fault once, evenly spread: the first after one interval, none in the last one.
                interval = length / (len(planned) + 1)
                for i, kind in enumerate(planned):
                    await self._until((i + 1) * interval)
                    await self._fault(http, session.bus, kind, (), ())
                await self._until(length)
                await background[0]
                await background[3]
                await self._settle(http)
                await self._reap(http)
                duration = time.monotonic() - self.t0
            finally:
                for task in background:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            verdict, injected = await self._check(http, session.bus)
        finally:
            await session.close()
        baseline = baseline_seconds(self.soak_options.minutes)
        return SoakReport(
            minutes=self.soak_options.minutes,
            nodes=self.workload.nodes,
            replicas=dict.fromkeys(SERVICES, self.options.replicas),
            created_pods=len(self.created),
            created_groups=self.groups,
            succeeded_and_deleted_pods=len(self.reaped),
            bound=verdict.bound,
            unschedulable=verdict.unschedulable,
            duration_s=round(duration, 1),
            faults=self.faults,
            violations=verdict.violations,
            memory=judge_memory(self.samples, baseline, length, self.soak_options.tolerance),
            samples=self.samples,
            baseline_s=baseline,
            injected=injected,
            outcomes=self.outcome_counts(),
            heap=self.heap,
        )

    def expected(self) -> list[str]:
        return [key for key in self.created if key not in self.reaped]

    async def _until(self, at: float) -> None:
        delay = self.t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    # --- churn ------------------------------------------------------------------------------------------------
    async def _arrivals(self, http: aiohttp.ClientSession, length: float) -> None:
        """`rate` podgroups a second until `length` seconds after the start, on a fixed schedule (a slow
        create does not push the later ones back)."""
        gap = 1.0 / self.soak_options.rate
        pending: set[asyncio.Task[None]] = set()
        index = 0
        while index * gap < length:
            await self._until(index * gap)
            group = churn_group(index, self.churn_rng, self.soak_options.run_seconds)
            self.created.extend(f"{NAMESPACE}/{p['metadata']['name']}" for p in group.pods)
            self.must_bind.update(p["metadata"]["name"] for p in group.pods if not may_stay_pending(p))
            self.groups += 1
            task = asyncio.create_task(self._create(http, (group,)))
            pending.add(task)
            task.add_done_callback(pending.discard)
            index += 1
        if pending:
            await asyncio.gather(*pending)
        self.arrived = True

    async def _reaper(self, http: aiohttp.ClientSession) -> None:
        while True:
            await asyncio.sleep(self.soak_options.reap_every)
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await self._reap(http)

    async def _reap(self, http: aiohttp.ClientSession) -> None:
        """Delete every podgroup whose pods all succeeded: its pods, then the PodGroup."""
        async with http.get(f"/api/v1/namespaces/{NAMESPACE}/pods") as resp:
            if resp.status != 200:
                return  # an API fault is on; the next sweep
            items: list[dict[str, Any]] = (await resp.json())["items"]
        phases: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for pod in items:
            meta = pod["metadata"]
            group = (meta.get("annotations") or {}).get("pod-group-name", "")
            phases[group].append((meta["name"], (pod.get("status") or {}).get("phase", "")))
        for group, pods in phases.items():
            if not group or any(phase != "Succeeded" for _, phase in pods):
                continue
            for name, _ in pods:
                if await self._delete(http, f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"):
                    self.reaped.add(f"{NAMESPACE}/{name}")
            await self._delete(
                http, f"/apis/scheduling.run.ai/v2alpha2/namespaces/{NAMESPACE}/podgroups/{group}"
            )

    async def _delete(self, http: aiohttp.ClientSession, path: str) -> bool:
        async with http.delete(path) as resp:
            await resp.read()
            return resp.status < 300 or resp.status == 404

    # --- memory -----------------------------------------------------------------------------------------------
    async def _heap_snapshots(self, length: float) -> None:
        """With `heap_dir`: SIGUSR2 to each traced replica at the baseline time and when the arrivals stop,
        then wait (up to a minute: a snapshot of a big heap takes seconds) for each file to be written."""
        options = self.soak_options
        if not options.heap_dir:
            return
        folder = Path(options.heap_dir)
        replicas = {f"{service}-{MEASURED_REPLICA}": service for service in options.heap_of}
        taken: dict[str, list[str]] = defaultdict(list)
        for number, at in enumerate((baseline_seconds(options.minutes), length), start=1):
            await self._until(at)
            for replica, service in replicas.items():
                process = self.stack.processes.get(replica)
                if process is None or process.poll() is not None:
                    continue
                path = heap.snapshot_path(folder, service, replica, number)
                path.unlink(missing_ok=True)
                process.send_signal(signal.SIGUSR2)
                for _ in range(600):
                    if path.is_file():
                        taken[replica].append(str(path))
                        break
                    await asyncio.sleep(0.1)
        self.heap = {replica: (paths[0], paths[1]) for replica, paths in taken.items() if len(paths) == 2}

    async def _sampler(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(self.soak_options.sample_every)

    def _sample(self) -> None:
        at = round(self._now(), 1)
        pids = {name: p.pid for name, p in self.stack.processes.items()}
        pids.update({name: node.process.pid for name, node in self.stack.nats_nodes.items()})
        for name, pid in sorted(pids.items()):
            process = self._processes.get(pid)
            if process is None:
                process = self._processes[pid] = psutil.Process(pid)
            try:
                rss = process.memory_info().rss
            except psutil.Error:  # between a kill and its restart
                continue
            self.samples.append(RssSample(at, name, pid, rss))
