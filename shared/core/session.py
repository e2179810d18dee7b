"""The scheduling session: mutable state built from a snapshot, and the shared questions actions ask.

Private to the core (callers get values from `shared.core.scheduler.schedule`). `Session(snapshot, now,
policy, chains)` (opened by `shared.core.opening.open_session`, which resolves the plugin chains first)
copies the snapshot into task, job, node and queue states, computes fair shares, and answers: which nodes
have room for a task, is a job within its queue's capacity (the chains' quota checks), what a task counts
for in its queue. Actions change the state only through `shared.core.statement.Statement`s (which sit above the
session and call `record` on commit); node filters (`shared.core.predicates`) and scores
(`shared.core.scoring`) also sit above it and read it. The session imports neither, so the core's modules
form no import circle.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from shared.core import bind_backoff
from shared.core.cluster import EPS, ClusterState, NodeState, empty_cluster, give_back_empty
from shared.core.dra_accounting import account as dra_accounting
from shared.core.plugins.runtime import Runtime
from shared.core.policy import Policy
from shared.core.proportion import (
    OK,
    CapacityResult,
    DeviceMemory,
    QueueState,
    Vec,
    ancestors_and_self,
    check_non_preemptible_over_quota,
    check_over_limit,
    device_memory_of,
    queue_states_from_model,
    set_fair_shares,
)
from shared.core.tasks import (
    CPU,
    GPU,
    MEM,
    PODS,
    JobState,
    OrderKeys,
    TaskState,
    close_jobs,
    open_jobs,
)
from shared.model import Snapshot, Topology
from shared.model.status import ACTIVE_USED, ALLOCATED, PodStatus, stuck_in_releasing
from shared.model.topology_aliases import resolve_aliases

if TYPE_CHECKING:
    from shared.core.plugins.chain import Chains


@dataclass(frozen=True)
class Decisions:
    """What one committed statement decided: binds, pipelines and evictions, in order."""

    binds: tuple[tuple[TaskState, str], ...] = ()
    pipelines: tuple[tuple[TaskState, str], ...] = ()
    evictions: tuple[tuple[TaskState, str, str], ...] = ()


@dataclass
class SessionLog:
    """Everything committed in this session, in order."""

    binds: list[tuple[TaskState, str]] = field(default_factory=list)
    pipelines: list[tuple[TaskState, str]] = field(default_factory=list)
    evictions: list[tuple[TaskState, str, str]] = field(default_factory=list)


class Session:
    def __init__(
        self,
        snapshot: Snapshot,
        now: float,
        policy: Policy,
        chains: Chains[Session],
        focus: frozenset[str] | None = None,
        *,
        accounting_only: bool = False,
    ) -> None:
        """`accounting_only`: a session for readers of queue accounting and job order alone (the queue
        plan), which never place anything: its nodes hold no pods (`accepted_quota` reads a pod's node,
        not what the node holds). Putting every pod on its node is most of what building a session
        costs."""
        snapshot = dra_accounting(
            snapshot
        )  # DRA GPUs counted as KAI counts them (shared.core.dra_accounting)
        self.snapshot = snapshot
        self.now = now
        self.policy = policy
        self.chains = chains
        """The plugins this session runs, per extension point (resolved once, before the session)."""
        self.plugins: Runtime[Session] = Runtime(chains)
        """What runs the chains (`shared.core.plugins.runtime`): every plugin call of the session goes
        through it, and a plugin's exception stops there."""
        self.focus = focus
        self._fit_cache: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray]] = {}
        """Task shape -> (node versions, fit answers) of `_cached_fit_mask`."""
        self.topologies: dict[str, Topology] = {t.name: t for t in snapshot.topologies}
        self.namespace_labels: dict[str, dict[str, str]] = {ns.name: ns.labels for ns in snapshot.namespaces}
        """Namespace -> its labels, what a pod affinity term's namespace selector reads
        (`shared.core.selectors.term_selects`)."""
        self.log = SessionLog()
        self.action = ""
        """The action running now (set by the cycle runner), what `count` files a count under."""
        self.tally: Counter[tuple[str, str]] = Counter()
        """(action, what) -> how many times: podgroups tried and scheduled, scenarios simulated and
        filtered (`shared.core.result.ActionCounts`, which the shells turn into KAI's per-action series)."""
        self.action_starts: list[tuple[str, int]] = []
        """Each action run, with how many evictions the log held when it started (whose they are)."""
        # Bumped whenever a queue's allocation moves; keys cached queue-order views.
        self.alloc_version = 0
        runtime = self.plugins
        keys = OrderKeys(job=runtime.job_key, task=runtime.task_key, pod_set=runtime.pod_set_key)
        aliased = any(t.aliases for t in snapshot.topologies)  # else no podgroup has an alias to resolve
        podgroups = (
            tuple(resolve_aliases(pg, self.topologies) for pg in snapshot.podgroups)
            if aliased
            else snapshot.podgroups
        )
        # The jobs and tasks of the last session whose records are the same, taken again (`shared.core.tasks.open_jobs`).
        self.jobs, self.tasks, self._leased = open_jobs(
            podgroups, snapshot.pods, keys, keep=not aliased, setting=(snapshot.nodes, not accounting_only)
        )
        self.stuck_by_node: dict[str, list[str]] = {}
        """Node -> the pods on it stuck in releasing (namespace/name), for the fit errors that say so."""
        stuck_after = policy.stuck_in_releasing_threshold
        pending: set[str] = set()
        for task in self.tasks.values():
            status = task.status
            if status == PodStatus.PENDING:
                pending.add(task.job.key)
            elif status == PodStatus.RELEASING:
                pod = task.pod
                if stuck_in_releasing(status, pod.releasing_since, now, stuck_after):
                    # KAI v0.17: it holds its resources as a running pod does (never as releasing ones, so
                    # nothing is pipelined onto them) and is no victim (not active-allocated).
                    task.status = PodStatus.STUCK_IN_RELEASING
                    if pod.node is not None:
                        named = f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name
                        self.stuck_by_node.setdefault(pod.node, []).append(named)
        self.maybe_pending: list[JobState] = [job for key, job in self.jobs.items() if key in pending]
        """The jobs with a pending pod when the session opened, in job order: the only ones that can have
        one later (no statement sets a pod pending; undoing one puts back a pod that was), so what asks
        every job for a pending pod asks these."""
        self._accounting_only = accounting_only
        if accounting_only:
            # No pods on the nodes: the same as the last such session's, kept while the node records are.
            self.cluster = empty_cluster(snapshot.nodes, policy.tie_break_seed)
        else:
            # Nodes take their pods in pod-key order (KAI adds them sorted by UID).
            names = {nd.name for nd in snapshot.nodes}
            placed = (
                task
                for key in sorted(self.tasks)
                if (task := self.tasks[key]).status in ACTIVE_USED and task.node in names
            )
            self.cluster = ClusterState(snapshot.nodes, policy.tie_break_seed, placed)
        self.affinity_cache: dict[object, object] = {}
        """Inter-pod affinity's answers per cluster generation (`shared.core.pod_affinity`)."""
        self.device_memory: DeviceMemory = device_memory_of(snapshot.nodes, policy.min_node_gpu_memory_mib)
        """The GPU memory per device that turns gpu-memory requests into queue quota (KAI v0.17)."""
        self.queues: dict[str, QueueState] = queue_states_from_model(snapshot.queues)
        self._queue_chains: dict[str, list[QueueState]] = {}
        self.total: Vec = [
            float(self.cluster.alloc[GPU].sum()) + self.cluster.mig_gpus,
            float(self.cluster.alloc[CPU].sum()),
            float(self.cluster.alloc[MEM].sum()),
        ]
        if not accounting_only:
            bind_backoff.hold(self.jobs.values(), now)
        self._init_queue_usage()
        usage = {u.queue: (u.gpu, u.cpu, u.memory) for u in policy.queue_usage}
        set_fair_shares(self.queues, self.total, usage, policy.k_value)

    def close(self) -> None:
        """Break the session's reference cycles (each task and its job and pod set, each node and its
        cluster), so that it is freed as soon as its last reference goes rather than by the collector's
        pass over its objects (`shared.core.cycle.collector_paused`: about 30 ms for a session of 5,000
        nodes and 11,000 pods, against 5 ms). For the core's entry points, once they have read what they
        return: the session cannot be used afterwards. The jobs and tasks go back to the memo that lends
        them (`shared.core.tasks.close_jobs`), an accounting-only session's empty nodes to theirs
        (`shared.core.cluster.give_back_empty`)."""
        close_jobs(self.tasks, self._leased)
        if self._accounting_only:
            give_back_empty(self.cluster)
        else:
            for node in self.cluster.order:
                del node.cluster
        # What else refers to the session (a job order holding its heaps' bound methods is a cycle of its
        # own) then keeps only the session itself, not its jobs, tasks and nodes.
        self.jobs = {}
        self.tasks = {}
        self.maybe_pending = []
        self.log = SessionLog()
        del self.cluster

    @cached_property
    def any_anti_affinity(self) -> bool:
        """Whether some pod declares anti-affinity: symmetric anti-affinity needs a scan of every placed
        pod, skipped without one (asked on first need: a session that places nothing never asks)."""
        return any(t.pod.pod_anti_affinity for t in self.tasks.values())

    @cached_property
    def any_preferred_affinity(self) -> bool:
        """Whether some pod declares a preferred (scored) pod affinity or anti-affinity."""
        return any(
            t.pod.preferred_pod_affinity or t.pod.preferred_pod_anti_affinity for t in self.tasks.values()
        )

    # --- queue accounting (proportion) ------------------------------------------------------------------
    def queue_chain(self, queue: str) -> list[QueueState]:
        """The queue and its ancestors, leaf first (`ancestors_and_self`); the tree does not change within a
        session, so each queue's chain is walked once. Callers must not change the list."""
        chain = self._queue_chains.get(queue)
        if chain is None:
            chain = self._queue_chains[queue] = ancestors_and_self(self.queues, queue)
        return chain

    def _init_queue_usage(self) -> None:
        # Per element, the same additions in the same order as one `accepted_quota`/`request_quota` vector
        # per task would make: the sums come out bit for bit the same, without a list per task.
        min_gpu_memory = self.device_memory.smallest
        for job in self.jobs.values():
            chain = self.queue_chain(job.queue)
            if not chain:
                continue
            non_preemptible = not job.preemptible
            for task in job.tasks.values():
                status = task.status
                if status in ALLOCATED:
                    # `accepted_quota`, whose GPUs differ from the request only for memory and MIG requests.
                    kind = task.kind
                    gpus = self.accepted_quota(task)[0] if kind in ("memory", "mig") else task.requested_gpus
                    cpu, mem = task.cpu, task.mem
                    for q in chain:
                        allocated, requested = q.allocated, q.requested
                        allocated[0] += gpus
                        allocated[1] += cpu
                        allocated[2] += mem
                        requested[0] += gpus
                        requested[1] += cpu
                        requested[2] += mem
                        if non_preemptible:
                            held = q.allocated_non_preemptible
                            held[0] += gpus
                            held[1] += cpu
                            held[2] += mem
                elif status == PodStatus.PENDING:
                    gpus, cpu, mem = task.quota_gpus(min_gpu_memory), task.cpu, task.mem
                    for q in chain:
                        requested = q.requested
                        requested[0] += gpus
                        requested[1] += cpu
                        requested[2] += mem

    def request_quota(self, task: TaskState) -> Vec:
        """What a pending task asks of its queue: (GPU, CPU, memory), gpu-memory as a share of a device."""
        return [task.quota_gpus(self.device_memory.smallest), task.cpu, task.mem]

    def accepted_quota(self, task: TaskState) -> Vec:
        """What a placed task holds in its queue (KAI AcceptedResource): fractions as placed on its node."""
        gpus = task.requested_gpus
        if task.kind == "memory" and task.node in self.cluster.nodes:
            node = self.cluster.nodes[task.node]
            gpus = task.gpu.devices * node.gpu_fraction_on_node(task.gpu.memory_mib)
        elif task.kind == "mig":
            gpus = task.quota_gpus(self.device_memory.smallest)
        return [gpus, task.cpu, task.mem]

    def node_init_quota(self, task: TaskState, node: NodeState) -> Vec:
        """KAI `GetRequiredInitQuota`: the quota a task would take on this particular node."""
        if task.kind == "mig":
            return [task.quota_gpus(self.device_memory.smallest), task.cpu, task.mem]
        if task.kind == "regular":
            return [float(task.gpu.devices) if node.gpu_memory else 0.0, task.cpu, task.mem]
        portion = node.gpu_fraction_on_node(task.gpu_memory_on(node.gpu_memory))
        return [task.gpu.devices * portion, task.cpu, task.mem]

    def on_allocate(self, task: TaskState) -> None:
        self._move_queue(task, +1.0)

    def on_deallocate(self, task: TaskState) -> None:
        self._move_queue(task, -1.0)

    def _move_queue(self, task: TaskState, sign: float) -> None:
        self.alloc_version += 1
        v = self.accepted_quota(task)
        np_ = not task.job.preemptible
        for q in self.queue_chain(task.job.queue):
            q.version += 1
            for r in range(3):
                q.allocated[r] += sign * v[r]
                if np_:
                    q.allocated_non_preemptible[r] += sign * v[r]

    def job_capacity(self, job: JobState, tasks: list[TaskState]) -> CapacityResult:
        """Whether the job's next `tasks` fit what its queue may hold: the quota checks of the chains, the
        first refusal wins (KAI's proportion: `queue_job_capacity`)."""
        return self.plugins.job_capacity(self, job, tasks) or OK

    def task_capacity_on_node(self, task: TaskState, node: NodeState) -> CapacityResult:
        """As `job_capacity`, for one pod on one node (asked by the predicates filter)."""
        return self.plugins.node_capacity(self, task, node) or OK

    def queue_job_capacity(self, job: JobState, tasks: list[TaskState]) -> CapacityResult:
        """KAI `IsJobOverQueueCapacity`: the queue limit, and non-preemptible work only inside quota."""
        if job.queue not in self.queues:
            return CapacityResult(False, "QueueDoesNotExist", f"queue {job.queue} does not exist")
        req = self.capacity_request(tasks)
        chain = self.queue_chain(job.queue)
        result = check_over_limit(chain, req)
        if not result.ok:
            return result
        return check_non_preemptible_over_quota(chain, req, job.preemptible)

    def capacity_request(self, tasks: list[TaskState]) -> Vec:
        """What the queue limit and non-preemptible quota checks count for `tasks` before a node is chosen
        (KAI capacity_policy ``getRequiredQuota``): gpu-memory requests over the largest device, the
        smallest share they could take (KAI v0.17, #1792)."""
        largest = self.device_memory.largest
        req = [0.0, 0.0, 0.0]
        for t in tasks:
            req[0] += t.quota_gpus(largest)
            req[1] += t.cpu
            req[2] += t.mem
        return req

    def queue_node_capacity(self, task: TaskState, node: NodeState) -> CapacityResult:
        """KAI proportion's per-node check: the quota the task would take on this node."""
        chain = self.queue_chain(task.job.queue)
        req = self.node_init_quota(task, node)
        result = check_over_limit(chain, req)
        if not result.ok:
            return result
        return check_non_preemptible_over_quota(chain, req, task.job.preemptible)

    def job_init_request(self, job: JobState) -> Vec:
        """KAI `GetTasksToAllocateInitResource` (simulation flavour), as a queue quantity."""
        return job.cached("init_request", lambda: self._job_init_request(job))

    def _job_init_request(self, job: JobState) -> Vec:
        # Over the smallest device: what a gpu-memory pod could take at most (KAI v0.17).
        smallest = self.device_memory.smallest
        total = [0.0, 0.0, 0.0]
        for t in job.tasks_to_allocate(real=False):
            gpus = t.requested_gpus
            if t.kind == "memory":
                gpus += t.quota_gpus(smallest)
            elif t.kind == "mig":
                gpus = t.quota_gpus(smallest)
            total[0] += gpus
            total[1] += t.cpu
            total[2] += t.mem
        return total

    def in_focus(self, job: JobState) -> bool:
        """Whether actions should try to place this job: all jobs, or the ones a placement worker was
        given (the rest of the cluster is still seen, as victims and as load); never one KAI's scheduling
        backoff has taken off this node pool (`JobState.backed_off`: neither placed nor evicting), nor one
        whose bind back-off runs (`JobState.bind_retry_at`, `shared.core.bind_backoff`)."""
        if job.backed_off or job.bind_retry_at is not None:
            return False
        return self.focus is None or job.key in self.focus

    # --- status -----------------------------------------------------------------------------------------
    def set_status(self, task: TaskState, status: PodStatus) -> None:
        task.status = status
        task.job.version += 1

    def count(self, what: str, n: int = 1) -> None:
        """Count `n` of `what` for the running action (plain values: the core keeps no metrics)."""
        self.tally[(self.action, what)] += n

    def record(self, decisions: Decisions) -> None:
        self.log.binds.extend(decisions.binds)
        self.log.pipelines.extend(decisions.pipelines)
        self.log.evictions.extend(decisions.evictions)

    # --- node filtering and ordering -------------------------------------------------------------------
    def resource_fit_mask(self, task: TaskState, with_releasing: bool) -> np.ndarray:
        """Nodes whose idle (or idle + releasing) resources fit the task, as a boolean mask."""
        c = self.cluster
        n = len(c.order)
        if with_releasing and not c.has_releasing:
            with_releasing = False
        if task.kind == "regular" and not task.gpu.mig and not task.scalars:
            if task.is_best_effort:
                return np.ones(n, dtype=bool)
            mask = np.ones(n, dtype=bool)
            for r, need in ((CPU, task.cpu), (MEM, task.mem), (GPU, task.whole_gpus), (PODS, 1.0)):
                if need <= 0:
                    continue
                avail = c.idle[r] + c.releasing[r] if with_releasing else c.idle[r]
                mask &= avail + EPS >= need
            return mask
        return self._cached_fit_mask(task, with_releasing)

    def _cached_fit_mask(self, task: TaskState, with_releasing: bool) -> np.ndarray:
        """`NodeState.fits` on every node for shared-GPU, MIG and scalar-requesting tasks, which need each
        node's device groups or scalars: answers are kept per task shape and recomputed only on nodes that
        changed since (a session of fractional pods otherwise asks every node again for every pod)."""
        c = self.cluster
        gpu = task.gpu
        shape = (
            task.kind,
            task.cpu,
            task.mem,
            task.whole_gpus,
            gpu.devices,
            gpu.fraction,
            gpu.memory_mib,
            tuple(sorted(gpu.mig.items())),
            tuple(sorted(task.scalars.items())) if task.scalars else (),
            with_releasing,
        )
        cached = self._fit_cache.get(shape)
        if cached is None:
            result = np.array([node.fits(task, with_releasing) for node in c.order], dtype=bool)
            self._fit_cache[shape] = (c.versions.copy(), result)
            return result.copy()
        versions, result = cached
        for i in np.flatnonzero(versions != c.versions).tolist():
            result[i] = c.order[i].fits(task, with_releasing)
            versions[i] = c.versions[i]
        return result.copy()

    def shared_group_fit(self, task: TaskState) -> np.ndarray:
        """Nodes with a shared GPU device the task fits on (KAI's GPU-sharing score), as a boolean mask;
        kept per request shape and recomputed only on nodes that changed since."""
        c = self.cluster
        shape = ("groups", task.kind, task.gpu.fraction, task.gpu.memory_mib)
        cached = self._fit_cache.get(shape)
        if cached is None:
            versions = np.full(len(c.order), -1, dtype=np.int64)
            cached = (versions, np.zeros(len(c.order), dtype=bool))
            self._fit_cache[shape] = cached
        versions, result = cached
        for i in c.sharing_nodes:
            if versions[i] != c.versions[i]:
                node = c.order[i]
                result[i] = any(node.task_fits_group(task, g) for g in node.groups)
                versions[i] = c.versions[i]
        return result
