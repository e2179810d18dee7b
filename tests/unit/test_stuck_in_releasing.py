"""StuckInReleasing (KAI v0.17): a Running pod whose deletion was asked longer ago than the scheduler's
threshold (2m by default, `Policy.stuck_in_releasing_threshold`) keeps its resources as a running pod does,
no pending pod is pipelined onto them, and it is no victim; a pod deleted more recently is Releasing, and
pending pods may be pipelined onto what it frees. The core decides from the pod's deletion time and the
cycle's `now`, never a clock."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.contracts.events import PodUnschedulable
from shared.core.policy import Policy
from shared.core.result import CycleResult
from shared.core.scheduler import schedule
from shared.errors import InvalidObject
from shared.explain import Facts, explain
from shared.kube import keys, translate, wire
from shared.kube.scheduling_shard import policy_of, shard_config
from shared.model import Pod, PodGroup, PodStatus, Snapshot
from shared.model.status import ACTIVE_ALLOCATED, ACTIVE_USED, stuck_in_releasing
from tests import builders
from tests.builders import flat_queues, gang, gpu_nodes, shard_manifest

NOW = 100_000.0
ALLOCATE = Policy(actions=("allocate",))


@pytest.mark.parametrize(
    ("status", "deleted_ago", "threshold", "stuck"),
    [
        pytest.param(PodStatus.RELEASING, 121.0, 120.0, True, id="deleted 121 s ago, threshold 120 s: stuck"),
        pytest.param(PodStatus.RELEASING, 120.0, 120.0, False, id="exactly the threshold: still releasing"),
        pytest.param(PodStatus.RELEASING, 5.0, 120.0, False, id="deleted 5 s ago: releasing"),
        pytest.param(PodStatus.RELEASING, None, 120.0, False, id="deleted while pending: never stuck"),
        pytest.param(PodStatus.RELEASING, 1.0, 0.0, True, id="threshold 0: stuck as soon as deleted"),
        pytest.param(PodStatus.RUNNING, 600.0, 120.0, False, id="a running pod is not releasing"),
    ],
)
def test_a_running_pod_is_stuck_once_its_deletion_is_older_than_the_threshold(
    status: PodStatus, deleted_ago: float | None, threshold: float, stuck: bool
) -> None:
    since = None if deleted_ago is None else NOW - deleted_ago
    assert stuck_in_releasing(status, since, NOW, threshold) == stuck


def test_a_stuck_pod_holds_its_resources_and_is_never_a_victim() -> None:
    assert PodStatus.STUCK_IN_RELEASING in ACTIVE_USED
    assert PodStatus.STUCK_IN_RELEASING not in ACTIVE_ALLOCATED


# --- translation -----------------------------------------------------------------------------------------
def _pod_doc(phase: str, deletion: str | None) -> dict[str, Any]:
    manifest = builders.pod_manifest(
        "train-0", "team", node="n1", annotations={keys.PODGROUP_ANNOTATION: "train"}, requests={"cpu": "1"}
    )
    deleted = {"deletionTimestamp": deletion} if deletion is not None else {}
    return builders.stored(manifest, uid="uid-0", resource_version=None, status={"phase": phase}, **deleted)


@pytest.mark.parametrize(
    ("phase", "deletion", "status", "since"),
    [
        pytest.param(
            "Running", "2026-01-01T00:02:00Z", PodStatus.RELEASING, 1767225720.0, id="running, deleted"
        ),
        pytest.param("Pending", "2026-01-01T00:02:00Z", PodStatus.RELEASING, None, id="pending, deleted"),
        pytest.param("Running", None, PodStatus.RUNNING, None, id="running"),
    ],
)
def test_translate_carries_when_a_running_pod_s_deletion_was_asked(
    phase: str, deletion: str | None, status: PodStatus, since: float | None
) -> None:
    pod = translate.pod_of(wire.convert(wire.Pod, _pod_doc(phase, deletion)))
    assert (pod.status, pod.releasing_since) == (status, since)


def test_a_malformed_deletion_timestamp_names_the_pod_and_its_field() -> None:
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(wire.convert(wire.Pod, _pod_doc("Running", "a while ago")))
    assert (info.value.kind, info.value.name, info.value.field) == (
        "Pod",
        "team/train-0",
        "metadata.deletionTimestamp",
    )


@given(st.text(max_size=40))
def test_any_deletion_timestamp_is_read_or_refused_by_field(text: str) -> None:
    refused: InvalidObject | None = None
    pod: Pod | None = None
    try:
        pod = translate.pod_of(wire.convert(wire.Pod, _pod_doc("Running", text)))
    except InvalidObject as exc:
        refused = exc
    if refused is not None:
        assert refused.field == "metadata.deletionTimestamp"
    else:
        assert pod is not None
        assert pod.releasing_since is not None


# --- the core ----------------------------------------------------------------------------------------------
def _holder(status: PodStatus, deleted_ago: float | None, queue: str = "team") -> tuple[PodGroup, list[Pod]]:
    """One 1-GPU pod on node-00000 in `status`, whose deletion (if any) was asked `deleted_ago` s before now."""
    pg, pods = gang("holder", queue, 1, priority=10, status=status, nodes=["node-00000"])
    since = None if deleted_ago is None else NOW - deleted_ago
    return pg, [msgspec.structs.replace(p, releasing_since=since) for p in pods]


def _cluster(*groups: tuple[PodGroup, list[Pod]], queues: tuple[str, ...] = ("team",)) -> Snapshot:
    return builders.snapshot(gpu_nodes(1, gpus=1), *groups, queues=flat_queues(queues))


def _waiting(queue: str = "team", priority: int = 50) -> tuple[PodGroup, list[Pod]]:
    return gang("waiting", queue, 1, priority=priority, created=NOW - 60)


def _statuses(result: CycleResult) -> dict[str, str]:
    assert result.view is not None
    return {t.name: t.status for t in result.view.tasks}


@pytest.mark.parametrize(
    ("deleted_ago", "threshold", "holder", "pipelined"),
    [
        pytest.param(30.0, 120.0, "Releasing", True, id="deleted 30 s ago: the waiting pod is pipelined"),
        pytest.param(
            600.0, 120.0, "StuckInReleasing", False, id="deleted 10 min ago: stuck, nothing pipelined"
        ),
        pytest.param(600.0, 3600.0, "Releasing", True, id="a threshold of 1 h: still releasing"),
    ],
)
def test_nothing_is_pipelined_onto_what_a_stuck_pod_holds(
    deleted_ago: float, threshold: float, holder: str, pipelined: bool
) -> None:
    policy = msgspec.structs.replace(ALLOCATE, stuck_in_releasing_threshold=threshold)
    snapshot = _cluster(_holder(PodStatus.RELEASING, deleted_ago), _waiting())
    result = schedule(snapshot, NOW, policy, want_view=True)
    assert _statuses(result)["holder-0"] == holder
    assert bool(result.pipelined) == pipelined
    # Before any action: a stuck pod's GPU is used, a releasing pod's is being released.
    before = schedule(snapshot, NOW, msgspec.structs.replace(policy, actions=()), want_view=True).view
    assert before is not None
    (node,) = before.nodes
    assert (node.idle_gpus, node.releasing_gpus) == (0.0, 0.0 if holder == "StuckInReleasing" else 1.0)


def test_a_pending_job_says_which_stuck_pods_hold_the_nodes_it_could_not_use() -> None:
    result = schedule(_cluster(_holder(PodStatus.RELEASING, 600.0), _waiting()), NOW, ALLOCATE)
    (pending,) = (p for p in result.pending if p.podgroup.endswith("waiting"))
    assert "pods stuck in releasing hold resources on node-00000 (holder-0)" in pending.message
    assert "nothing is pipelined onto them" in pending.message


@pytest.mark.parametrize(
    ("deleted_ago", "evicted"),
    [
        pytest.param(None, ["holder-0"], id="a running pod over its queue's share is reclaimed"),
        pytest.param(600.0, [], id="a stuck pod is no victim"),
    ],
)
def test_reclaim_takes_no_stuck_pod(deleted_ago: float | None, evicted: list[str]) -> None:
    status = PodStatus.RUNNING if deleted_ago is None else PodStatus.RELEASING
    snapshot = _cluster(_holder(status, deleted_ago, "over"), _waiting("owed"), queues=("over", "owed"))
    queues = tuple(
        msgspec.structs.replace(q, gpu=msgspec.structs.replace(q.gpu, quota=1.0)) if q.name == "owed" else q
        for q in snapshot.queues
    )
    result = schedule(
        msgspec.structs.replace(snapshot, queues=queues), NOW, Policy(actions=("allocate", "reclaim"))
    )
    assert [e.name for e in result.evictions] == evicted


def test_preempt_evicts_the_running_sibling_of_a_stuck_pod_and_leaves_the_stuck_one() -> None:
    pg, pods = gang("mixed", "team", 2, priority=10, status=PodStatus.RUNNING, nodes=["node-00000"] * 2)
    pods[1] = msgspec.structs.replace(pods[1], status=PodStatus.RELEASING, releasing_since=NOW - 600)
    snapshot = Snapshot(
        nodes=tuple(gpu_nodes(1, gpus=2)),
        queues=tuple(flat_queues(["team"])),
        podgroups=(pg, _waiting(priority=80)[0]),
        pods=(*pods, *_waiting(priority=80)[1]),
    )
    result = schedule(snapshot, NOW, Policy(actions=("allocate", "preempt")), want_view=True)
    assert [e.name for e in result.evictions] == ["mixed-0"]
    assert _statuses(result)["mixed-1"] == "StuckInReleasing"


@pytest.mark.parametrize("threshold", [-1.0, float("inf"), float("nan")])
def test_a_threshold_that_is_not_a_finite_non_negative_number_is_refused_by_field(threshold: float) -> None:
    with pytest.raises(ValueError, match="stuck_in_releasing_threshold"):
        Policy(stuck_in_releasing_threshold=threshold)


# --- kairos explain -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("deleted_ago", "status", "words"),
    [
        pytest.param(600.0, "StuckInReleasing on node-00000", "stuck in releasing: deleted at", id="stuck"),
        pytest.param(30.0, "Releasing on node-00000", "pending pods may be pipelined onto them", id="going"),
    ],
)
def test_kairos_explain_says_whether_a_deleted_pod_is_stuck(
    deleted_ago: float, status: str, words: str
) -> None:
    pg, (pod,) = _holder(PodStatus.RELEASING, deleted_ago)
    answer = explain(
        Facts(namespace=pod.namespace, name=pod.name, pod=pod, podgroup=pg, members=[pod], now=NOW)
    )
    assert answer.status == status
    assert any(words in reason for reason in answer.reasons)


def test_kairos_explain_names_the_stuck_pods_that_keep_a_pending_pod_out() -> None:
    snapshot = _cluster(_holder(PodStatus.RELEASING, 600.0), _waiting())
    result = schedule(snapshot, NOW, ALLOCATE)
    waiting = next(pg for pg in snapshot.podgroups if pg.name == "waiting")
    status = result.podgroups[waiting.key]
    assert "StuckInReleasing" in status.reasons
    pod = next(p for p in snapshot.pods if p.podgroup == waiting.key)
    event = PodUnschedulable(
        time=NOW,
        namespace=waiting.namespace,
        podgroup=waiting.name,
        queue=waiting.queue,
        message=status.fit_error or "",
        reasons=list(status.reasons),
    )
    facts = Facts(
        namespace="", name=pod.name, pod=pod, podgroup=waiting, members=[pod], nodes=1, unschedulable=event
    )
    assert any(
        "StuckInReleasing: pods stuck in releasing hold resources" in r for r in explain(facts).reasons
    )


# --- configuration ------------------------------------------------------------------------------------------
def _shard(args: dict[str, str]) -> wire.SchedulingShard:
    return wire.convert(wire.SchedulingShard, shard_manifest(args=args))


def test_a_scheduling_shard_sets_the_threshold_as_kai_s_flag_does() -> None:
    config = shard_config(_shard({"stuck-in-releasing-threshold": "5m"}))
    assert policy_of(config).stuck_in_releasing_threshold == 300.0
    assert config.not_applied == ()
    assert Policy().stuck_in_releasing_threshold == 120.0


def test_a_negative_threshold_in_a_scheduling_shard_names_its_field() -> None:
    with pytest.raises(InvalidObject) as info:
        shard_config(_shard({"stuck-in-releasing-threshold": "-1m"}))
    assert info.value.field == "spec.args.stuck-in-releasing-threshold"


def test_kairos_explain_judges_a_pod_stuck_by_its_own_shard_s_threshold() -> None:
    """`kairos explain` reads the threshold of the shard whose node pool the pod's label names, else the
    default shard's, else KAI's 2 minutes (tools.cli.explain.stuck_after)."""
    from shared.contracts.messages import ShardRecord
    from tools.cli.explain import stuck_after

    def record(shard: str, threshold: str, pool: str = "") -> ShardRecord:
        body = _shard({"stuck-in-releasing-threshold": threshold})
        if pool:
            body = msgspec.structs.replace(
                body, spec=msgspec.structs.replace(body.spec, partition_label_value=pool)
            )
        return ShardRecord(shard=shard, config=shard_config(body))

    shards = [record("default", "5m"), record("pool-a", "30s", pool="pool-a")]
    in_pool_a = Pod(name="p", namespace="ns", podgroup="ns/g", labels={keys.NODE_POOL_LABEL: "pool-a"})
    elsewhere = Pod(name="q", namespace="ns", podgroup="ns/g")
    assert stuck_after(shards, in_pool_a) == 30.0
    assert stuck_after(shards, elsewhere) == 300.0
    assert stuck_after([], elsewhere) == 120.0
