"""Order inside a gang, as specifications: KAI's kubeflow and ray plugins place a job's coordinator (the
Kubeflow master or MPI launcher, the Ray head) before its workers, and, the order reversed, take its
workers before it when the job has pods to give up. Read from KAI's ``plugins/kubeflow/kubeflow.go`` and
``plugins/ray/ray.go``: the role label alone decides between two pods (any other value, or none, ties);
both plugins rank above ``taskorder`` (1200 and 1100 against 900), so the role decides before the
task-priority label, and age decides last."""

from __future__ import annotations

import msgspec
import pytest

from shared.core.policy import PluginConfig, Policy
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.core.tasks import (
    KUBEFLOW_ORDER,
    KUBEFLOW_ROLE_LABEL,
    RAY_ORDER,
    RAY_ROLE_LABEL,
    JobState,
    TaskState,
    task_order_key,
)
from shared.model import Pod, PodGroup, PodStatus, Snapshot
from tests import builders
from tests.builders import flat_queues, gang, gpu_nodes

ALLOCATE = Policy(actions=("allocate",))
PREEMPT = Policy(actions=("preempt",))

Labels = dict[str, str]
KF_MASTER: Labels = {KUBEFLOW_ROLE_LABEL: "master"}
KF_LAUNCHER: Labels = {KUBEFLOW_ROLE_LABEL: "launcher"}
KF_WORKER: Labels = {KUBEFLOW_ROLE_LABEL: "worker"}
RAY_HEAD: Labels = {RAY_ROLE_LABEL: "head"}
RAY_WORKER: Labels = {RAY_ROLE_LABEL: "worker"}
NONE: Labels = {}


def elastic_job(
    roles: list[Labels],
    *,
    priorities: list[int | None] | None = None,
    status: PodStatus = PodStatus.PENDING,
    nodes: list[str] | None = None,
    name: str = "train",
    priority: int = 50,
) -> tuple[PodGroup, list[Pod]]:
    """One podgroup whose pods (one GPU each, created in list order) form an elastic gang of one: the
    task order alone says which is placed, or given up, first."""
    pg, pods = gang(
        name, "team", len(roles), 1.0, min_available=1, status=status, nodes=nodes, priority=priority
    )
    task_priorities = priorities or [None] * len(roles)
    out = [
        msgspec.structs.replace(pod, labels=labels, creation_time=float(i), task_priority=task_priorities[i])
        for i, (pod, labels) in enumerate(zip(pods, roles, strict=True))
    ]
    return pg, out


def snapshot(*workloads: tuple[PodGroup, list[Pod]], gpus: int = 1) -> Snapshot:
    return builders.snapshot(gpu_nodes(1, gpus=gpus), *workloads, queues=flat_queues(["team"]))


def bound_pods(result: CycleResult) -> list[str]:
    return [b.name for p in result.binds for b in p.bindings]


@pytest.mark.parametrize(
    ("roles", "first"),
    [
        pytest.param(
            [KF_WORKER, KF_WORKER, KF_MASTER], "train-2", id="a PyTorchJob's master before its older workers"
        ),
        pytest.param([KF_WORKER, KF_LAUNCHER], "train-1", id="an MPIJob's launcher before its older worker"),
        pytest.param([RAY_WORKER, RAY_WORKER, RAY_HEAD], "train-2", id="a Ray head before its older workers"),
        pytest.param([NONE, KF_MASTER], "train-1", id="a master before an older pod with no role"),
        pytest.param([NONE, RAY_HEAD], "train-1", id="a Ray head before an older pod with no role"),
        pytest.param(
            [KF_WORKER, NONE], "train-0", id="a worker ties with a pod with no role: the older first"
        ),
        pytest.param([NONE, NONE], "train-0", id="without role labels the older pod first"),
        pytest.param(
            [KF_WORKER, {KUBEFLOW_ROLE_LABEL: "chief"}],
            "train-0",
            id="only master and launcher are Kubeflow's coordinators",
        ),
        pytest.param(
            [RAY_WORKER, {RAY_ROLE_LABEL: "Head"}],
            "train-0",
            id="the role is compared as written: Head is not head",
        ),
        pytest.param(
            [NONE, {KUBEFLOW_ROLE_LABEL: "master", RAY_ROLE_LABEL: "head"}],
            "train-1",
            id="a pod with both labels is first for both",
        ),
        pytest.param(
            [RAY_HEAD, KF_MASTER], "train-1", id="kubeflow ranks above ray: the master before an older head"
        ),
    ],
)
def test_when_one_pod_fits_the_coordinator_is_placed(roles: list[Labels], first: str) -> None:
    result = schedule(snapshot(elastic_job(roles)), 0.0, ALLOCATE)
    assert bound_pods(result) == [first]


def test_the_role_decides_before_the_task_priority_label() -> None:
    job = elastic_job([KF_WORKER, KF_MASTER], priorities=[10, None])
    assert bound_pods(schedule(snapshot(job), 0.0, ALLOCATE)) == ["train-1"]


def test_among_workers_the_task_priority_label_still_decides() -> None:
    job = elastic_job([KF_WORKER, KF_WORKER], priorities=[None, 5])
    assert bound_pods(schedule(snapshot(job), 0.0, ALLOCATE)) == ["train-1"]


@pytest.mark.parametrize(
    ("left_out", "roles", "first"),
    [
        pytest.param(
            "kubeflow", [KF_WORKER, KF_MASTER], "train-0", id="without kubeflow a master waits its turn"
        ),
        pytest.param("ray", [RAY_WORKER, RAY_HEAD], "train-0", id="without ray a head waits its turn"),
        pytest.param("ray", [KF_WORKER, KF_MASTER], "train-1", id="without ray the master still leads"),
    ],
)
def test_a_policy_without_the_plugin_orders_by_age(left_out: str, roles: list[Labels], first: str) -> None:
    names = (
        "predicates",
        "proportion",
        "priority",
        "elastic",
        "kubeflow",
        "ray",
        "subgrouporder",
        "taskorder",
    )
    plugins = tuple(PluginConfig(name=n) for n in names if n != left_out)
    policy = Policy(actions=("allocate",), plugins=plugins)
    assert bound_pods(schedule(snapshot(elastic_job(roles)), 0.0, policy)) == [first]


def test_a_victim_gives_up_its_workers_before_its_master() -> None:
    """Three GPUs, all held by an elastic training job (gang of one); a job of higher priority in the same
    queue needs one: preempt takes one pod of the victim, a worker, the youngest first (the task order
    reversed), never the master."""
    running = elastic_job(
        [KF_MASTER, KF_WORKER, KF_WORKER], status=PodStatus.RUNNING, nodes=["node-00000"] * 3, priority=10
    )
    attacker = gang("urgent", "team", 1, 1.0, priority=80)
    result = schedule(snapshot(running, attacker, gpus=3), 0.0, PREEMPT)
    assert [e.name for e in result.evictions] == ["train-2"]


def test_a_victim_whose_master_is_youngest_still_keeps_it() -> None:
    running = elastic_job(
        [KF_WORKER, KF_WORKER, KF_MASTER], status=PodStatus.RUNNING, nodes=["node-00000"] * 3, priority=10
    )
    attacker = gang("urgent", "team", 1, 1.0, priority=80)
    result = schedule(snapshot(running, attacker, gpus=3), 0.0, PREEMPT)
    assert [e.name for e in result.evictions] == ["train-1"]


@pytest.mark.parametrize(
    ("order", "labels", "key"),
    [
        (KUBEFLOW_ORDER, KF_MASTER, (0,)),
        (KUBEFLOW_ORDER, KF_LAUNCHER, (0,)),
        (KUBEFLOW_ORDER, KF_WORKER, (1,)),
        (KUBEFLOW_ORDER, RAY_HEAD, (1,)),
        (KUBEFLOW_ORDER, NONE, (1,)),
        (RAY_ORDER, RAY_HEAD, (0,)),
        (RAY_ORDER, RAY_WORKER, (1,)),
        (RAY_ORDER, KF_MASTER, (1,)),
        (RAY_ORDER, NONE, (1,)),
    ],
)
def test_each_plugin_keys_a_pod_by_its_own_label_only(
    order: object, labels: Labels, key: tuple[int, ...]
) -> None:
    pg, (pod,) = gang("one", "team", 1)
    task = TaskState(msgspec.structs.replace(pod, labels=labels), JobState(pg))
    assert order.task_key(task) == key  # type: ignore[attr-defined]


def test_kais_default_keys_outside_a_session_put_the_coordinator_first() -> None:
    pg, pods = elastic_job([KF_WORKER, RAY_HEAD, KF_MASTER])
    job = JobState(pg)
    tasks = [TaskState(p, job) for p in pods]
    assert [t.name for t in sorted(tasks, key=task_order_key)] == ["train-2", "train-1", "train-0"]
