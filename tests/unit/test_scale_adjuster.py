"""KAI's node-scale-adjuster as Kairos plans it (`services.state.controllers.scaling_pods.plan`): which fractional pods
wait for a GPU node, the scaling pods that ask a cluster autoscaler for one, when they are deleted, and that
no pod a tenant writes makes it fail or ask twice. Tables from KAI's ``pkg/nodescaleadjuster`` and its docs
(``docs/gpu-sharing/autoscaling``); the options as the state service reads them."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.state.controllers.scaling_pods import (
    APP_LABEL,
    SHARED_GPU_POD_NAME,
    SHARED_GPU_POD_NAMESPACE,
    Plan,
    ScaleAdjustOptions,
    plan,
)
from services.state.service import StateOptions
from shared.errors import ConfigError
from shared.kube import keys, wire
from tests.builders import CREATED, pod_manifest, stored
from tests.hostile import HOSTILE_TEXT, LONG_DIGITS

NS = "team-a"
SCHEDULER = "kai-scheduler"
OPTIONS = ScaleAdjustOptions(enabled=True)
NOW = 1000.0


# --- builders ---------------------------------------------------------------------------------------------------
def waiting(
    name: str,
    fraction: str | None = None,
    *,
    memory: str | None = None,
    devices: str | None = None,
    namespace: str = NS,
    scheduled: tuple[str, str] | None = ("False", "Unschedulable"),
    **spec: Any,
) -> dict[str, Any]:
    """A fractional pod of Kairos's scheduler; by default Unschedulable, as Kairos's write-back leaves a pod
    it cannot place."""
    annotations: dict[str, str] = {}
    if fraction is not None:
        annotations[keys.GPU_FRACTION] = fraction
    if memory is not None:
        annotations[keys.GPU_MEMORY] = memory
    if devices is not None:
        annotations[keys.GPU_FRACTION_NUM_DEVICES] = devices
    status: dict[str, Any] = {}
    if scheduled is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": scheduled[0], "reason": scheduled[1]}]
    manifest = pod_manifest(name, namespace, annotations=annotations, scheduler=SCHEDULER, **spec)
    return stored(manifest, resource_version=None, created=None, status=status)


def scaling(
    pod: str, gpus: int = 1, *, namespace: str = NS, phase: str = "Pending", deleting: bool = False
) -> dict[str, Any]:
    """A scaling pod for `namespace/pod`, as the adjuster makes them (of no scheduler)."""
    labels = {APP_LABEL: "scaling-pod", SHARED_GPU_POD_NAME: pod, SHARED_GPU_POD_NAMESPACE: namespace}
    resources = {"requests": {keys.NVIDIA_GPU: str(gpus)}, "limits": {keys.NVIDIA_GPU: str(gpus)}}
    container = {"name": "scaling-pod", "resources": resources}
    manifest = pod_manifest(
        f"{namespace}-{pod}", OPTIONS.namespace, labels=labels, scheduler="", containers=[container]
    )
    deleted = {"deletionTimestamp": CREATED} if deleting else {}
    return stored(manifest, uid=None, resource_version=None, created=None, status={"phase": phase}, **deleted)


def cluster(*docs: dict[str, Any]) -> dict[str, wire.Pod]:
    """Pods by "namespace/name", as the state mirror holds them."""
    pods = [wire.convert(wire.Pod, doc) for doc in docs]
    return {f"{p.metadata.namespace}/{p.metadata.name}": p for p in pods}


def run(*docs: dict[str, Any], options: ScaleAdjustOptions = OPTIONS, **kw: Any) -> Plan:
    return plan(cluster(*docs), options, scheduler_name=SCHEDULER, now=NOW, **kw)


def created(result: Plan) -> list[tuple[str, int]]:
    return [(s.name, s.gpus) for s, _ in result.create]


def deleted(result: Plan) -> list[str]:
    return [s.name for s in result.delete]


# --- scale-up ----------------------------------------------------------------------------------------------------
SCALE_UP = [
    pytest.param([], [], [], id="nothing waits: no scaling pod"),
    pytest.param(
        [waiting("a", "0.7")],
        [],
        [("team-a-a", 1)],
        id="a pod of 0.7 GPU gets a scaling pod of one whole GPU",
    ),
    pytest.param(
        [waiting("a", memory="1024")],
        [],
        [("team-a-a", 1)],
        id="a gpu-memory pod counts for a tenth of a GPU and gets a scaling pod of one",
    ),
    pytest.param(
        [waiting("b", "0.5"), waiting("a", "0.5")],
        [],
        [("team-a-a", 1)],
        id="two half-GPU pods share one scaling pod, made for the first by namespace and name",
    ),
    pytest.param(
        [waiting("a", "0.7"), waiting("b", "0.7")],
        [],
        [("team-a-a", 1), ("team-a-b", 1)],
        id="two pods of 0.7 need two GPUs: two scaling pods",
    ),
    pytest.param(
        [waiting("a", "0.7"), waiting("b", "0.7")],
        [scaling("a")],
        [("team-a-b", 1)],
        id="two pods of 0.7 and the first one's scaling pod: one more, for the second",
    ),
    pytest.param(
        [waiting("a", "0.7"), waiting("b", "0.7"), waiting("c", "0.1")],
        [scaling("a"), scaling("b")],
        [],
        id="two GPUs asked for already cover 0.7, 0.7 and 0.1: nothing more",
    ),
    pytest.param(
        [waiting("a", "0.2", devices="2")],
        [],
        [("team-a-a", 2)],
        id="a pod of two devices gets a scaling pod of two GPUs however small its share",
    ),
    pytest.param(
        [waiting("a", "0.9", devices="2")],
        [],
        [("team-a-a", 2)],
        id="a pod of two devices of 0.9 needs two GPUs: one scaling pod of two",
    ),
    pytest.param(
        [waiting("a", "0.5", devices="2"), waiting("b", "0.1", devices="2")],
        [],
        [("team-a-a", 2)],
        id="2 x 0.5 and 2 x 0.1 fit two GPUs on one node: one scaling pod of two",
    ),
    pytest.param(
        [waiting("a", "0.5", devices="2"), waiting("b", "0.8", devices="2")],
        [],
        [("team-a-a", 2), ("team-a-b", 2)],
        id="2 x 0.5 and 2 x 0.8 need three GPUs: a scaling pod of two for each",
    ),
    pytest.param(
        [waiting("a", "0.2", devices="2"), waiting("b", "0.1", devices="3")],
        [],
        [("team-a-a", 2), ("team-a-b", 3)],
        id="a pod of three devices needs a node of three even when one GPU holds every share",
    ),
    pytest.param(
        [waiting(f"m{i:02}", memory="1024") for i in range(11)],
        [],
        [("team-a-m00", 1), ("team-a-m01", 1)],
        id="eleven gpu-memory pods count for 1.1 GPUs: two scaling pods",
    ),
    pytest.param(
        [waiting("f", "0.9", devices="2"), *(waiting(f"m{i}", memory="1024") for i in range(3))],
        [],
        [("team-a-f", 2), ("team-a-m0", 1)],
        id="2 x 0.9 and three gpu-memory pods count for 2.1 GPUs: scaling pods of two and one",
    ),
    pytest.param(
        [waiting(f"t{i}", "0.1") for i in range(10)],
        [],
        [("team-a-t0", 1)],
        id="ten tenths make exactly one GPU (summed in whole hundredths)",
    ),
    pytest.param(
        [waiting("a", "0.125"), waiting("b", "0.875")],
        [],
        [("team-a-a", 1), ("team-a-b", 1)],
        id="an eighth rounds half away from zero as Go does: 0.13 and 0.88 ask for two GPUs",
    ),
    pytest.param(
        [waiting("a", "0.001")], [], [], id="a thousandth of a GPU rounds to nothing: no scaling pod"
    ),
]


@pytest.mark.parametrize(("pods", "existing", "expected"), SCALE_UP)
def test_scale_up(pods: list[dict[str, Any]], existing: list[dict[str, Any]], expected: list[Any]) -> None:
    result = run(*pods, *existing)
    assert created(result) == expected
    assert result.delete == ()
    assert result.refused == ()


NOT_WAITING = [
    pytest.param(waiting("a", "0.5", nodeName="node-1"), id="a pod on a node"),
    pytest.param(
        {**waiting("a", "0.5"), "spec": {"schedulerName": "default-scheduler"}}, id="another scheduler"
    ),
    pytest.param(
        waiting("a", None, containers=[{"name": "main", "resources": {"limits": {keys.NVIDIA_GPU: "1"}}}]),
        id="a whole-GPU pod (the autoscaler sees its request)",
    ),
    pytest.param({**waiting("a", "0.5"), "status": {"phase": "Succeeded"}}, id="a pod that succeeded"),
    pytest.param(waiting("a", "0.5", scheduled=("True", "")), id="a pod already scheduled"),
    pytest.param(waiting("a", "0.5", scheduled=None), id="a pod without a PodScheduled condition yet"),
    pytest.param(
        waiting("a", "0.5", scheduled=("False", "InvalidPod")),
        id="a pod Kairos holds back for its own mistake",
    ),
    pytest.param(
        waiting("a", "0.5", scheduled=("False", "SchedulingGated")),
        id="a pod gated at admission (quota gate)",
    ),
    pytest.param(waiting("a", memory="0"), id="a gpu-memory pod of 0 MiB asks for no GPU"),
]


@pytest.mark.parametrize("pod", NOT_WAITING)
def test_only_unschedulable_fractional_pods_of_ours_wait_for_a_node(pod: dict[str, Any]) -> None:
    assert run(pod) == Plan()


# --- retirement and cooldown -------------------------------------------------------------------------------------
RETIRE = [
    pytest.param([scaling("a")], ["team-a-a"], id="its pod is gone: deleted"),
    pytest.param(
        [scaling("a"), waiting("a", "0.5", scheduled=("True", ""), nodeName="node-1")],
        ["team-a-a"],
        id="its pod was placed: deleted",
    ),
    pytest.param(
        [scaling("a"), waiting("a", "0.5", scheduled=("False", "InvalidPod"))],
        ["team-a-a"],
        id="its pod is held for another reason: deleted",
    ),
    pytest.param(
        [scaling("a", phase="Succeeded"), waiting("a", "0.5")],
        ["team-a-a"],
        id="it succeeded (its container exits at once on its new node): deleted",
    ),
    pytest.param([scaling("a"), waiting("a", "0.5")], [], id="its pod still waits: kept"),
    pytest.param(
        [scaling("a"), waiting("a", "0.5", scheduled=None)],
        [],
        id="its pod has no PodScheduled condition: kept",
    ),
    pytest.param(
        [{**scaling("a"), "metadata": {"name": "other", "namespace": OPTIONS.namespace}}],
        [],
        id="a pod of the namespace without the two labels is not a scaling pod: left alone",
    ),
    pytest.param([scaling("a", deleting=True)], [], id="a scaling pod being deleted is not deleted again"),
]


@pytest.mark.parametrize(("pods", "expected"), RETIRE)
def test_a_scaling_pod_is_deleted_once_its_pod_no_longer_waits(
    pods: list[dict[str, Any]], expected: list[str]
) -> None:
    result = run(*pods)
    assert deleted(result) == expected
    assert created(result) == []


def test_a_deletion_starts_the_cooldown_during_which_nothing_is_created() -> None:
    pods = (scaling("gone"), waiting("a", "0.5"))
    first = run(*pods)
    assert deleted(first) == ["team-a-gone"]
    assert created(first) == []
    assert first.cooling_until == NOW + OPTIONS.cooldown
    during = plan(
        cluster(waiting("a", "0.5")),
        OPTIONS,
        scheduler_name=SCHEDULER,
        now=NOW + 59,
        cooling_until=first.cooling_until,
    )
    assert during == Plan(cooling_until=first.cooling_until)
    after = plan(
        cluster(waiting("a", "0.5")),
        OPTIONS,
        scheduler_name=SCHEDULER,
        now=NOW + 60,
        cooling_until=first.cooling_until,
    )
    assert created(after) == [("team-a-a", 1)]
    assert after.cooling_until is None


def test_without_a_cooldown_a_deletion_and_a_creation_share_a_round() -> None:
    result = run(scaling("gone"), waiting("a", "0.5"), options=ScaleAdjustOptions(enabled=True, cooldown=0))
    assert (deleted(result), created(result)) == (["team-a-gone"], [("team-a-a", 1)])


# --- what the mirror does not show yet ---------------------------------------------------------------------------
def test_a_scaling_pod_created_but_not_yet_seen_counts_and_is_not_asked_again() -> None:
    pods = (waiting("a", "0.5"), waiting("b", "0.5"))
    first = run(*pods)
    assert created(first) == [("team-a-a", 1)]
    again = run(*pods, created={s.name: s for s, _ in first.create})
    assert again == Plan()


def test_a_scaling_pod_deleted_but_still_seen_is_neither_counted_nor_deleted_again() -> None:
    result = run(scaling("a"), waiting("b", "0.7"), scaling("gone"), deleted={"team-a-a", "team-a-gone"})
    assert deleted(result) == []
    assert created(result) == [("team-a-b", 1)]


def test_a_scaling_pod_held_back_after_a_refused_creation_is_passed_over_for_the_next_pod() -> None:
    result = run(waiting("a", "0.5"), waiting("b", "0.5"), held_back={"team-a-a"})
    assert created(result) == [("team-a-b", 1)]


# --- the scaling pod ---------------------------------------------------------------------------------------------
def test_the_scaling_pod_asks_for_whole_gpus_where_the_pod_may_run() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}
                ]
            }
        }
    }
    pod = waiting(
        "train-0",
        "0.5",
        devices="2",
        nodeSelector={"pool": "gpu"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity=affinity,
        containers=[
            {"name": "main", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
            {"name": "side", "resources": {"requests": {"cpu": "1", "memory": "512Mi"}}},
        ],
    )
    options = ScaleAdjustOptions(enabled=True, image="registry.example/scaling-pod:v1")
    ((_, manifest),) = run(pod, options=options).create
    assert manifest == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "team-a-train-0",
            "namespace": "kai-scale-adjust",
            "labels": {
                "app": "scaling-pod",
                "shared-gpu-pod-name": "train-0",
                "shared-gpu-pod-namespace": "team-a",
            },
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [
                {
                    "name": "scaling-pod",
                    "image": "registry.example/scaling-pod:v1",
                    "imagePullPolicy": "IfNotPresent",
                    "resources": {
                        "requests": {keys.NVIDIA_GPU: "2", "cpu": "1500m", "memory": str(1536 * 2**20)},
                        "limits": {keys.NVIDIA_GPU: "2"},
                    },
                }
            ],
            "nodeSelector": {"pool": "gpu"},
            "affinity": affinity,
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "serviceAccountName": "kai-scale-adjust",
        },
    }


def test_a_pod_whose_name_cannot_make_a_scaling_pod_is_left_out_saying_why() -> None:
    long_name = "a" * 64
    result = run(waiting(long_name, "0.5"), waiting("b", "0.7"), waiting("c", "0.7"))
    assert created(result) == [("team-a-b", 1), ("team-a-c", 1)]
    ((pod, why),) = result.refused
    assert pod == f"team-a/{long_name}"
    assert "63 characters" in why


# --- hostile pods ------------------------------------------------------------------------------------------------
HOSTILE = settings(
    derandomize=True,
    deadline=None,
    max_examples=80,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ANNOTATIONS = (keys.GPU_FRACTION, keys.GPU_MEMORY, keys.GPU_FRACTION_NUM_DEVICES)


@given(
    pods=st.lists(
        st.tuples(
            st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,70}[a-z0-9])?", fullmatch=True),
            st.dictionaries(st.sampled_from(ANNOTATIONS), HOSTILE_TEXT, max_size=3),
        ),
        max_size=6,
    )
)
@example(pods=[("a", {keys.GPU_FRACTION: "0.5", keys.GPU_FRACTION_NUM_DEVICES: "2000000000"})])
@example(pods=[("a", {keys.GPU_MEMORY: LONG_DIGITS}), ("b", {keys.GPU_FRACTION: "nan"})])
@example(pods=[("a", {keys.GPU_FRACTION: "1e308"}), ("b", {keys.GPU_FRACTION: "-0.5"})])
@HOSTILE
def test_hostile_pods_never_fail_it_nor_get_two_scaling_pods(pods: list[tuple[str, dict[str, str]]]) -> None:
    docs = []
    for name, written in pods:
        doc = waiting(name)
        doc["metadata"]["annotations"] = written
        docs.append(doc)
    state = cluster(*docs)
    result = plan(state, OPTIONS, scheduler_name=SCHEDULER, now=NOW)
    names = [s.name for s, _ in result.create]
    assert len(names) == len(set(names))
    for scaling_pod, manifest in result.create:
        assert scaling_pod.stands_for in state
        assert 1 <= scaling_pod.gpus <= 1024
        assert manifest["metadata"]["name"] == scaling_pod.name
    for refusal in result.refused:
        assert refusal.pod in state
        assert len(refusal.why) < 300
    again = plan(
        state,
        OPTIONS,
        scheduler_name=SCHEDULER,
        now=NOW,
        created={s.name: s for s, _ in result.create},
    )
    assert again.create == ()


# --- the options -------------------------------------------------------------------------------------------------
def test_the_scale_adjuster_is_off_by_default_with_kais_defaults() -> None:
    options = StateOptions.parse({"source": "kube"}).scale_adjust
    assert options == ScaleAdjustOptions()
    assert not options.enabled
    assert (options.namespace, options.app_label, options.service_account) == (
        "kai-scale-adjust",
        "scaling-pod",
        "kai-scale-adjust",
    )
    assert (options.gpu_memory_to_fraction_ratio, options.cooldown) == (0.1, 60.0)


def test_the_scale_adjuster_options_are_read_by_kais_names() -> None:
    options = StateOptions.parse(
        {
            "source": "kube",
            "cluster_autoscaling": "true",
            "scale_adjust_namespace": "autoscale",
            "scaling_pod_image": "registry.example/scaling-pod:v1",
            "scaling_pod_app_label": "stand-in",
            "scaling_pod_service_account": "",
            "gpu_memory_to_fraction_ratio": "0.25",
            "scale_adjust_cooldown": "5",
        }
    ).scale_adjust
    assert options == ScaleAdjustOptions(
        enabled=True,
        namespace="autoscale",
        image="registry.example/scaling-pod:v1",
        app_label="stand-in",
        service_account="",
        gpu_memory_to_fraction_ratio=0.25,
        cooldown=5.0,
    )


@pytest.mark.parametrize(
    ("given_options", "message"),
    [
        ({"source": "sim", "cluster_autoscaling": "true"}, "option 'cluster_autoscaling': needs source kube"),
        ({"source": "kube", "cluster_autoscaling": "maybe"}, "option 'cluster_autoscaling': expected true"),
        ({"source": "kube", "scale_adjust_namespace": "Not_A_Namespace"}, "option 'scale_adjust_namespace'"),
        ({"source": "kube", "gpu_memory_to_fraction_ratio": "0"}, "option 'gpu_memory_to_fraction_ratio'"),
        ({"source": "kube", "gpu_memory_to_fraction_ratio": "nan"}, "option 'gpu_memory_to_fraction_ratio'"),
        ({"source": "kube", "scale_adjust_cooldown": "-1"}, "option 'scale_adjust_cooldown'"),
        ({"source": "kube", "scaling_pod_image": "two words"}, "option 'scaling_pod_image'"),
        ({"source": "kube", "scaling_pod_app_label": "-x-"}, "option 'scaling_pod_app_label'"),
    ],
)
def test_a_bad_scale_adjuster_option_is_refused_naming_it(
    given_options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        StateOptions.parse(given_options)


def test_a_scaling_pod_counts_for_the_gpus_its_first_container_asks_for() -> None:
    pods = (waiting("a", "0.5"), waiting("b", "0.5"))
    assert created(run(*pods, scaling("a"))) == []
    odd = scaling("a")
    odd["spec"]["containers"][0]["resources"]["requests"][keys.NVIDIA_GPU] = "lots"
    assert created(run(*pods, odd)) == [("team-a-b", 1)]
