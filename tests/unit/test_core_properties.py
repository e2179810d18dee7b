"""Invariants of the scheduling core on random clusters (hypothesis).

Whatever the workload: no node holds more than it has, no shared GPU is filled past one device, a gang
runs whole or not at all, a queue never exceeds its limit, and a statement that is discarded leaves the
session exactly as it found it.
"""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.core.opening import open_session
from shared.core.result import CycleResult
from shared.core.session import Session
from shared.core.statement import Statement
from shared.core.tasks import N_BASE
from shared.model import Pod, PodStatus
from shared.model.status import ACTIVE_USED
from tests.builders import random_simulator, step_beside
from tools.sim.simulator import Simulator


def _check_invariants(sim: Simulator, moving: frozenset[str] = frozenset()) -> None:
    nodes = {n.name: n for n in sim.nodes}
    used: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    shared: dict[tuple[str, str], float] = defaultdict(float)
    running_by_group: dict[str, int] = defaultdict(int)
    queue_gpus: dict[str, float] = defaultdict(float)
    for pod in sim.pods.values():
        if pod.status != PodStatus.RUNNING:
            continue
        assert pod.node is not None
        u = used[pod.node]
        u[0] += pod.cpu_millis
        u[1] += pod.memory_bytes
        u[3] += 1
        if pod.gpu.is_shared:
            for g in pod.gpu_groups:
                shared[(pod.node, g)] += pod.gpu.fraction
        else:
            u[2] += pod.gpu.devices
        running_by_group[pod.podgroup] += 1
        queue_gpus[sim.podgroups[pod.podgroup].queue] += pod.gpu.gpus
    for name, u in used.items():
        node = nodes[name]
        devices = u[2] + len({g for (n, g) in shared if n == name})
        assert u[0] <= node.cpu_millis + 1e-6, f"{name} over CPU"
        assert u[1] <= node.memory_bytes + 1e-6, f"{name} over memory"
        assert devices <= node.gpus + 1e-9, f"{name} over GPUs: {devices} > {node.gpus}"
        assert u[3] <= node.max_pods, f"{name} over pod slots"
    for (node_name, group), fraction in shared.items():
        assert fraction <= 1.0 + 1e-9, f"shared GPU {group} on {node_name} at {fraction}"
    for key, pg in sim.podgroups.items():
        n = running_by_group.get(key, 0)
        # Pods consolidation moves leave their node this cycle and run on the new one the next.
        n += sum(1 for pod in sim.pods.values() if pod.podgroup == key and pod.key in moving)
        # Pods that already succeeded count toward the gang, as in KAI: the last of a gang may run alone.
        done = sum(
            1 for pod in sim.pods.values() if pod.podgroup == key and pod.status == PodStatus.SUCCEEDED
        )
        min_member = sum(ps.min_available for ps in pg.root.all_pod_sets())
        assert n == 0 or n + done >= min_member, (
            f"gang {key} runs {n} (+{done} succeeded) of min {min_member}"
        )
    for q in sim.queues:
        if q.gpu.limit >= 0 and q.parent is not None:
            assert queue_gpus[q.name] <= q.gpu.limit + 1e-9, f"queue {q.name} over its GPU limit"


def _check_orders(before: dict[str, Pod], result: CycleResult) -> None:
    """Orders to the cluster name pods as the cluster holds them: an eviction a pod that occupies that
    node, once; a pipelined pod at most once."""
    evicted = [e.pod for e in result.evictions]
    assert len(evicted) == len(set(evicted)), f"a pod evicted twice: {evicted}"
    for e in result.evictions:
        pod = before[e.pod]
        assert pod.node == e.node, f"{e.pod} evicted from {e.node}, but it is on {pod.node}"
        assert pod.status in ACTIVE_USED, f"{e.pod} evicted as {pod.status}"
    pipelined = [p.pod for p in result.pipelined]
    assert len(pipelined) == len(set(pipelined)), f"a pod pipelined twice: {pipelined}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), n_nodes=st.integers(1, 6), n_jobs=st.integers(1, 14))
# Found by this property: a pod pipelined by consolidation and then taken as preempt's victim was ordered
# evicted (twice) though it never ran, and counted as a moving gang member.
@example(seed=225187, n_nodes=2, n_jobs=12)
# And: allocate bound a whole gang, reclaim then took two of its three pods as victims, and the third went
# out bound alone.
@example(seed=915604562, n_nodes=3, n_jobs=10)
# And: allocate completed a running gang on another node, consolidation then moved the gang's running pod
# there too, and the new pod's bind was held as if the moved pod had left the gang: none of it ran.
@example(seed=15536, n_nodes=4, n_jobs=14)
# And (the invariant's own mistake): allocate placed the last pending pod of a running gang, consolidation
# moved that pod to another node, pipelined; the cluster saw no eviction (the pod never ran), so the move
# was not counted. KAI decides the same (a Binding pod is a victim like a running one).
@example(seed=1824165703, n_nodes=3, n_jobs=14)
def test_cycles_keep_every_invariant(seed: int, n_nodes: int, n_jobs: int) -> None:
    sim = random_simulator(seed, n_nodes, n_jobs)
    for cycle in range(4):
        now = cycle * 60.0
        before = sim.pods
        ssn, result = step_beside(sim, now)  # its session's log tells the moves
        _check_orders(before, result)
        _check_invariants(sim, _moved(ssn))


def _moved(ssn: Session) -> frozenset[str]:
    """The pods the cycle moved: evicted (from their node, or from one an earlier action had just placed
    them on) and pipelined onto another node, where they run next cycle."""
    return frozenset(t.key for t, _, _ in ssn.log.evictions if t.status == PodStatus.PIPELINED)


def _state(ssn: Session) -> tuple[object, ...]:
    c = ssn.cluster
    arrays = tuple(np.concatenate([c.idle[r], c.used[r], c.releasing[r]]).tobytes() for r in range(N_BASE))
    tasks = tuple(
        (k, t.status, t.node, tuple(t.gpu_groups), t.is_virtual) for k, t in sorted(ssn.tasks.items())
    )
    groups = tuple(
        (
            n.name,
            tuple(
                sorted((g, s.used, s.releasing, s.allocated, s.marked_releasing) for g, s in n.groups.items())
            ),
        )
        for n in c.order
    )
    queues = tuple(
        (q.name, tuple(q.allocated), tuple(q.allocated_non_preemptible)) for q in ssn.queues.values()
    )
    return arrays, tasks, groups, queues


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n_ops=st.integers(1, 12))
def test_discard_restores_the_session_exactly(seed: int, n_ops: int) -> None:
    rng = random.Random(seed)
    sim = random_simulator(seed, 4, 8)
    sim.step(0.0)
    ssn = open_session(sim.snapshot(), 60.0, sim.policy)
    before = _state(ssn)
    stmt = Statement(ssn)
    for _ in range(n_ops):
        pending = [t for t in ssn.tasks.values() if t.status == PodStatus.PENDING and not t.is_shared]
        running = [t for t in ssn.tasks.values() if t.status == PodStatus.RUNNING]
        op = rng.choice(["allocate", "pipeline", "evict"])
        if op == "evict" and running:
            stmt.evict(rng.choice(running), "test")
        elif pending:
            # Actions only place a pod where it fits (idle for allocate, idle + releasing for pipeline);
            # KAI's shared-GPU accounting assumes as much, so the test does too.
            task = rng.choice(pending)
            releasing = op == "pipeline"
            fitting = [n for n in ssn.cluster.order if n.fits(task, with_releasing=releasing)]
            if fitting:
                node = rng.choice(fitting)
                if releasing:
                    stmt.pipeline(task, node.name, update_if_on_node=True)
                else:
                    stmt.allocate(task, node.name)
        if rng.random() < 0.3:
            cp = stmt.checkpoint()
            if running:
                stmt.evict(rng.choice([t for t in running if t.status == PodStatus.RUNNING] or running), "x")
            stmt.rollback(cp)
    stmt.discard()
    assert _state(ssn) == before
