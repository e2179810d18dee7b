"""One tenant's bad object never stops scheduling for anyone else: the state service's pure path (decode,
translate, group, hold back, report) given hostile values.

Every number, boolean and choice a user writes goes through `shared.kube.values` with bounds; whatever a
value is, the object carrying it translates or is refused with an `InvalidObject` naming the object and the
field, in a message of one line; the mirror's flush goes on for every other object; and a failure nobody
foresaw (a bug an object's content reaches) holds back that object alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.state.controllers import shards
from services.state.controllers.grouping import group_pod
from services.state.controllers.podwork import PodWorkLoop
from services.state.mirror import cache as mirror_module
from services.state.mirror.cache import Mirror
from services.state.mirror.dependencies import AFTER_ANNOTATION, MAX_DEPENDENCIES, parse_after
from services.state.mirror.problems import Problem
from services.state.mirror.raw_objects import NODES, PODGROUPS, PODS, QUEUES
from shared.contracts.messages import ShardRecord
from shared.errors import InvalidObject
from shared.kube import gpu_sharing, keys, translate, values, wire
from shared.kube.scheduling_shard import policy_of, shard_config
from shared.model import Pod
from tests.builders import owner_reference, shard_manifest
from tests.grouping import group_or_none
from tests.hostile import (
    HOSTILE_JSON,
    HOSTILE_TEXT,
    HOSTILE_VALUES,
    LONG_DIGITS,
    OWNER_ANNOTATIONS,
    OWNER_KINDS,
    POD_ANNOTATIONS,
    POD_LABELS,
    node_doc,
    owner_doc,
    pod_doc,
    podgroup_doc,
    queue_doc,
)
from tests.unit.test_fuzz_contracts import shaped

HOSTILE = settings(
    derandomize=True,
    deadline=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NOW = 1_800_000_000.0
_R = TypeVar("_R")
CLASSES = frozenset({"train", "inference"})
MESSAGE_LIMIT = 400
"""A refusal is one line of an Event, whatever the size of the value that caused it."""


def _pod(doc: dict[str, Any]) -> wire.Pod:
    return wire.decode(wire.Pod, msgspec.json.encode(doc))


def _owner(doc: dict[str, Any]) -> wire.Owner:
    return wire.convert(wire.Owner, doc)


def _outcome(call: Callable[[], _R]) -> tuple[_R | None, Any]:
    """What `call` returns, or the refusal it raises (`InvalidObject`, `InvalidValueError`); anything else
    propagates and fails the spec."""
    try:
        return call(), None
    except (InvalidObject, values.InvalidValueError) as exc:
        return None, exc


def _assert_names(error: InvalidObject, kind: str, name: str) -> None:
    assert (error.kind, error.name) == (kind, name)
    assert error.problem
    assert len(str(error)) < MESSAGE_LIMIT
    assert "\n" not in str(error)


# --- the values that stopped the scheduler ------------------------------------------------------------------
def test_a_gpu_memory_of_5000_digits_is_refused_naming_the_pod_and_the_annotation() -> None:
    pod = _pod(pod_doc("big", podgroup="pg", annotations={keys.GPU_MEMORY: LONG_DIGITS}))
    with pytest.raises(InvalidObject) as caught:
        translate.pod_of(pod, podgroup="team-a/pg")
    _assert_names(caught.value, "Pod", "team-a/big")
    assert caught.value.field == f"metadata.annotations[{keys.GPU_MEMORY}]"
    assert "5,000 characters" in caught.value.problem


def test_a_batch_min_member_of_5000_digits_is_refused_naming_the_job_and_the_annotation() -> None:
    job = owner_doc("batch/v1", "Job", "train", annotations={keys.BATCH_MIN_MEMBER_ANNOTATION: LONG_DIGITS})
    pod = _pod(pod_doc("train-0", owner=owner_reference(job)))
    with pytest.raises(InvalidObject) as caught:
        group_pod(pod, [_owner(job)], priority_classes=CLASSES)
    _assert_names(caught.value, "Job", "team-a/train")
    assert caught.value.field == f"metadata.annotations[{keys.BATCH_MIN_MEMBER_ANNOTATION}]"


def test_a_segment_size_of_a_superscript_two_is_refused_naming_the_pytorch_job() -> None:
    spec = {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1},
            "Worker": {
                "replicas": 4,
                "template": {"metadata": {"annotations": {keys.SEGMENT_SIZE_ANNOTATION: "²"}}},
            },
        }
    }
    job = owner_doc("kubeflow.org/v1", "PyTorchJob", "ddp", spec=spec)
    labels = {"training.kubeflow.org/replica-type": "worker", "training.kubeflow.org/replica-index": "1"}
    pod = _pod(pod_doc("ddp-worker-1", owner=owner_reference(job), labels=labels))
    with pytest.raises(InvalidObject) as caught:
        group_pod(pod, [_owner(job)], priority_classes=CLASSES)
    _assert_names(caught.value, "PyTorchJob", "team-a/ddp")
    assert caught.value.field == (
        f"spec.pytorchReplicaSpecs.Worker.template.metadata.annotations[{keys.SEGMENT_SIZE_ANNOTATION}]"
    )


# --- the one validated path -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["٣", "\uff11\uff12", "²", "1_000", " 5", "5 ", "+", "", "0x10", "5.0", LONG_DIGITS, "9" * 20]
)
def test_a_whole_number_is_ascii_digits_with_a_sign_and_nothing_else(text: str) -> None:
    with pytest.raises(values.InvalidValueError):
        values.whole(text, low=-(2**63), high=2**63 - 1)


@pytest.mark.parametrize(
    "text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "1_0", "0x1p3", "", "٣.5", "1e99999"]
)
def test_a_decimal_is_finite_and_written_in_go_s_grammar(text: str) -> None:
    with pytest.raises(values.InvalidValueError):
        values.decimal(text, low=-1e300, high=1e300)


@given(st.one_of(HOSTILE_TEXT, HOSTILE_JSON))
@HOSTILE
def test_every_parser_returns_a_bounded_value_or_its_own_error(raw: Any) -> None:
    for parse in (
        lambda: values.whole(raw, low=0, high=100),
        lambda: values.whole_of(raw, low=0, high=100),
        lambda: values.decimal(raw, low=0.0, high=1.0, low_open=True),
        lambda: values.boolean(raw),
        lambda: values.choice(raw, ("a", "b")),
    ):
        result, error = _outcome(parse)
        if error is not None:
            assert len(str(error)) < MESSAGE_LIMIT
        else:
            assert result in ("a", "b", True, False) or 0 <= result <= 100


# --- pods, owners and the mirror, with hostile values anywhere Kairos reads one ------------------------------
@given(
    annotations=st.dictionaries(st.sampled_from(POD_ANNOTATIONS), HOSTILE_TEXT, max_size=4),
    labels=st.dictionaries(st.sampled_from(POD_LABELS), HOSTILE_TEXT, max_size=3),
    requests=st.dictionaries(st.sampled_from(["cpu", "memory", keys.NVIDIA_GPU]), HOSTILE_TEXT, max_size=2),
)
@example(annotations={keys.GPU_MEMORY: LONG_DIGITS}, labels={}, requests={})
@example(
    annotations={keys.GPU_FRACTION_NUM_DEVICES: "2000000000", keys.GPU_FRACTION: "0.5"},
    labels={},
    requests={},
)
@example(annotations={}, labels={keys.TASK_PRIORITY_LABEL: LONG_DIGITS}, requests={})
@example(annotations={}, labels={}, requests={"cpu": LONG_DIGITS + "m"})
@HOSTILE
def test_a_pod_translates_or_is_refused_naming_it(
    annotations: dict[str, str], labels: dict[str, str], requests: dict[str, str]
) -> None:
    doc = pod_doc("p", podgroup="pg", annotations=annotations, labels=labels, requests=requests)
    try:
        pod = _pod(doc)
        translate.pod_requests(pod)
        translate.pod_of(pod, podgroup="team-a/pg")
    except InvalidObject as exc:
        _assert_names(exc, "Pod", "team-a/p")


@given(annotations=st.dictionaries(st.sampled_from(POD_ANNOTATIONS), HOSTILE_TEXT, max_size=4))
@example(annotations={keys.GPU_FRACTION: LONG_DIGITS})
@example(annotations={keys.GPU_MEMORY: "²"})
@HOSTILE
def test_the_admission_webhook_patches_a_pod_or_refuses_it_naming_it(annotations: dict[str, str]) -> None:
    pod = _pod(pod_doc("p", annotations=annotations))
    _, error = _outcome(lambda: gpu_sharing.admission_patch(pod, "abcde"))
    if error is not None:
        _assert_names(error, "Pod", "team-a/p")


@given(value=st.one_of(HOSTILE_TEXT, st.lists(HOSTILE_TEXT, max_size=5).map(",".join)))
@example(value=",".join(["stage"] * 100_000))
@example(value=",".join(f"s{i}" for i in range(100_000)))
@HOSTILE
def test_a_dependency_list_parses_or_is_refused_naming_the_annotation(value: str) -> None:
    refs, error = _outcome(lambda: parse_after(value, "team-a", name="team-a/train"))
    if error is not None:
        assert error.field == f"metadata.annotations[{AFTER_ANNOTATION}]"
        assert len(str(error)) < MESSAGE_LIMIT
    else:
        assert refs is not None
        assert len(refs) <= MAX_DEPENDENCIES


@st.composite
def hostile_shard(draw: st.DrawFn) -> dict[str, Any]:
    """A SchedulingShard of any shape, with hostile text in the flags and plugin arguments it reads."""
    spec = draw(shaped(mi.type_info(wire.SchedulingShardSpec)))
    if not isinstance(spec, dict):
        spec = {}
    flags = ["allow-consolidating-reclaim", "max-consolidation-preemptees", "default-staleness-grace-period"]
    spec["args"] = draw(st.dictionaries(st.sampled_from(flags), HOSTILE_TEXT, max_size=3))
    arguments = draw(
        st.dictionaries(st.sampled_from(["kValue", "reclaimResolveMethod", "minruntime"]), HOSTILE_TEXT)
    )
    spec["plugins"] = {"proportion": {"arguments": arguments}}
    spec["kValue"] = draw(st.one_of(st.none(), st.floats(allow_nan=False), st.integers(-(2**63), 2**63 - 1)))
    return shard_manifest("s", **spec)


@given(doc=hostile_shard())
@example(
    doc={
        "kind": "SchedulingShard",
        "metadata": {"name": "s"},
        "spec": {"args": {"max-consolidation-preemptees": LONG_DIGITS}},
    }
)
@HOSTILE
def test_a_scheduling_shard_configures_or_is_refused_naming_its_field(doc: dict[str, Any]) -> None:
    shard, error = _outcome(lambda: wire.decode(wire.SchedulingShard, msgspec.json.encode(doc)))
    if shard is not None:
        _, error = _outcome(lambda: policy_of(shard_config(shard)))
    if error is not None:
        _assert_names(error, "SchedulingShard", "s")


@st.composite
def hostile_owner(draw: st.DrawFn) -> dict[str, Any]:
    api_version, kind, fields = draw(st.sampled_from(OWNER_KINDS))
    spec = {field: draw(HOSTILE_JSON) for field in draw(st.lists(st.sampled_from(fields), unique=True))}
    annotations = draw(st.dictionaries(st.sampled_from(OWNER_ANNOTATIONS), HOSTILE_TEXT, max_size=3))
    return owner_doc(api_version, kind, "work", annotations=annotations, spec=spec)


@given(owner=hostile_owner(), labels=st.dictionaries(st.sampled_from(POD_LABELS), HOSTILE_TEXT, max_size=3))
@HOSTILE
def test_a_pod_of_any_owner_is_grouped_or_refused_naming_the_owner_or_the_pod(
    owner: dict[str, Any], labels: dict[str, str]
) -> None:
    pod = _pod(pod_doc("work-0", owner=owner_reference(owner), labels=labels))
    try:
        decoded = _owner(owner)
    except InvalidObject:
        return
    _, error = _outcome(lambda: group_or_none(pod, decoded, priority_classes=CLASSES))
    if error is not None:
        assert (error.kind, error.name) in ((owner["kind"], "team-a/work"), ("Pod", "team-a/work-0"))
        assert len(str(error)) < MESSAGE_LIMIT


def _healthy(m: Mirror) -> None:
    m.change(NODES, "ADDED", msgspec.json.encode(node_doc("n1")))
    m.change(QUEUES, "ADDED", msgspec.json.encode(queue_doc("team-a")))
    m.change(PODGROUPS, "ADDED", msgspec.json.encode(podgroup_doc("ok")))
    m.change(
        PODS, "ADDED", msgspec.json.encode(pod_doc("ok-0", podgroup="ok", requests={keys.NVIDIA_GPU: "1"}))
    )


def _healthy_pod_in_kv(m: Mirror) -> bool:
    return any(isinstance(o, Pod) and o.name == "ok-0" for o in m.current.values())


@st.composite
def hostile_objects(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    """Pods, PodGroups and Queues of another tenant, each with hostile values where Kairos reads numbers."""
    objects: list[tuple[str, dict[str, Any]]] = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from([PODS, PODGROUPS, QUEUES]))
        if kind == PODS:
            annotations = draw(st.dictionaries(st.sampled_from(POD_ANNOTATIONS), HOSTILE_TEXT, max_size=3))
            labels = draw(st.dictionaries(st.sampled_from(POD_LABELS), HOSTILE_TEXT, max_size=2))
            doc = pod_doc(
                f"bad-{i}", namespace="team-b", podgroup="bad", annotations=annotations, labels=labels
            )
        elif kind == PODGROUPS:
            fields = draw(
                st.dictionaries(
                    st.sampled_from(["minMember", "priorityClassName", "subGroups"]), HOSTILE_JSON
                )
            )
            doc = podgroup_doc("bad", namespace="team-b", **fields)
            doc["metadata"]["annotations"] = draw(
                st.dictionaries(
                    st.sampled_from([keys.LAST_START_ANNOTATION, keys.STALE_SINCE_ANNOTATION]), HOSTILE_TEXT
                )
            )
        else:
            resource = {
                key: draw(st.one_of(HOSTILE_JSON, HOSTILE_TEXT))
                for key in ("quota", "limit", "overQuotaWeight")
            }
            doc = queue_doc(f"bad-{i}", gpu=resource, cpu=draw(HOSTILE_JSON))
        objects.append((kind, doc))
    return objects


@given(objects=hostile_objects())
@example(
    objects=[
        (
            PODS,
            pod_doc("bad-0", namespace="team-b", podgroup="bad", annotations={keys.GPU_MEMORY: LONG_DIGITS}),
        )
    ]
)
@HOSTILE
def test_the_mirror_flushes_the_healthy_tenant_whatever_another_tenant_writes(
    objects: list[tuple[str, dict[str, Any]]],
) -> None:
    m = Mirror()
    _healthy(m)
    m.change(PODGROUPS, "ADDED", msgspec.json.encode(podgroup_doc("bad", namespace="team-b")))
    for kind, doc in objects:
        m.change(kind, "ADDED", msgspec.json.encode(doc))
    m.flush(NOW)
    assert _healthy_pod_in_kv(m)
    for problem in m.reportable().values():
        assert problem.message
        assert len(problem.message) < MESSAGE_LIMIT
    assert m.unforeseen_total == 0, m.unforeseen


def test_each_hostile_value_in_each_pod_annotation_is_reported_on_that_pod_alone() -> None:
    m = Mirror()
    _healthy(m)
    m.change(QUEUES, "ADDED", msgspec.json.encode(queue_doc("team-b")))
    m.change(PODGROUPS, "ADDED", msgspec.json.encode(podgroup_doc("bad", namespace="team-b", queue="team-b")))
    refused = 0
    for i, value in enumerate(HOSTILE_VALUES):
        for key in (keys.GPU_MEMORY, keys.GPU_FRACTION):
            doc = pod_doc(f"bad-{i}-{key}", namespace="team-b", podgroup="bad", annotations={key: value})
            m.change(PODS, "ADDED", msgspec.json.encode(doc))
            refused += 1
    m.flush(NOW)
    assert _healthy_pod_in_kv(m)
    report = m.reportable()
    fields = {p.name: p.message for p in report.values() if p.kind == "Pod"}
    accepted = {o.name for o in m.current.values() if isinstance(o, Pod)}
    for i, value in enumerate(HOSTILE_VALUES):
        for key in (keys.GPU_MEMORY, keys.GPU_FRACTION):
            name = f"bad-{i}-{key}"
            assert name in fields or name in accepted, (value, key)
            if name in fields:
                assert f"metadata.annotations[{key}]" in fields[name]
    assert m.unforeseen_total == 0


# --- the net under everything: a failure nobody foresaw -----------------------------------------------------
def test_a_translation_that_fails_unforeseen_holds_back_that_object_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = translate.podgroup_of

    def failing(raw: wire.PodGroup, **kwargs: Any) -> Any:
        if raw.metadata.name == "bad":
            raise RecursionError("maximum recursion depth exceeded")  # what a bug reached by content raises
        return real(raw, **kwargs)

    monkeypatch.setattr(mirror_module.translate, "podgroup_of", failing)
    m = Mirror()
    _healthy(m)
    m.change(PODGROUPS, "ADDED", msgspec.json.encode(podgroup_doc("bad")))
    m.change(PODS, "ADDED", msgspec.json.encode(pod_doc("bad-0", podgroup="bad")))
    m.flush(NOW)
    assert _healthy_pod_in_kv(m)
    report = m.reportable()
    assert "RecursionError" in report["podgroup team-a/bad"].message
    assert report["podgroup team-a/bad"].reason == "InvalidPodGroup"
    assert m.unforeseen_total == 1
    assert "RecursionError" in m.unforeseen[0]


class _Grouper(PodWorkLoop):
    """Works on every candidate; the pod named "bad" meets a bug, "invalid" an invalid owner."""

    def __init__(self, pods: list[wire.Pod]) -> None:
        super().__init__()
        self.pods = pods
        self.done: list[str] = []

    def candidates(self) -> list[wire.Pod]:
        return list(self.pods)

    async def work(self, pod: wire.Pod) -> bool:
        if pod.metadata.name == "bad":
            raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
        if pod.metadata.name == "invalid":
            self.refuse(pod, "Job 'team-b/j': metadata.annotations[x]: must be a whole number")
            return False
        self.done.append(pod.metadata.name)
        return False


async def test_a_pod_whose_work_fails_unforeseen_is_refused_saying_why_and_the_loop_goes_on() -> None:
    pods = [_pod(pod_doc(name, namespace="team-b")) for name in ("bad", "invalid", "fine")]
    loop = _Grouper(pods)
    await loop._round()
    assert loop.done == ["fine"]
    assert loop.unforeseen == 1
    assert "ValueError" in loop.refusals["pod team-b/bad"]
    assert loop.refusals["pod team-b/invalid"].startswith("Job 'team-b/j'")
    loop.pods = [*pods, _pod(pod_doc("later", namespace="team-b"))]
    await loop._round()
    assert loop.done == ["fine", "later"]  # "fine" is done until it changes
    loop.pods = [pods[2]]  # the refused pods were deleted
    await loop._round()
    assert loop.refusals == {}


def test_a_refused_pod_is_reported_though_it_is_held_back_as_ungrouped() -> None:
    m = Mirror()
    _healthy(m)
    m.change(PODS, "ADDED", msgspec.json.encode(pod_doc("work-0", namespace="team-b")))
    m.flush(NOW)
    assert "pod team-b/work-0" not in m.reportable()
    why = "Job 'team-b/work': metadata.annotations[kai.scheduler/batch-min-member]: must be a whole number"
    m.refusal_sources = [{"pod team-b/work-0": why}]
    problem = m.reportable()["pod team-b/work-0"]
    assert (problem.kind, problem.reason, problem.message) == ("Pod", "InvalidPod", why)


def test_a_scheduling_shard_whose_reading_fails_unforeseen_keeps_no_other_shard_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = shards.shard_config

    def failing(shard: wire.SchedulingShard, *args: Any) -> Any:
        if shard.metadata.name == "bad":
            raise ZeroDivisionError("division by zero")  # what a bug reached by content raises
        return real(shard, *args)

    monkeypatch.setattr(shards, "shard_config", failing)

    def doc(name: str, pool: str) -> bytes:
        spec = {"partitionLabelValue": pool}
        return msgspec.json.encode({"kind": "SchedulingShard", "metadata": {"name": name}, "spec": spec})

    verdicts = shards.read_shards({"good": doc("good", "a"), "bad": doc("bad", "b")})
    assert isinstance(verdicts["good"], ShardRecord)
    problem = verdicts["bad"]
    assert isinstance(problem, Problem)
    assert "ZeroDivisionError" in problem.message
    assert problem.reason == "InvalidSchedulingShard"


@pytest.mark.parametrize(
    ("resource", "field"),
    [
        ({"gpu": {"quota": 1e308, "limit": -1, "overQuotaWeight": 1}}, "spec.resources.gpu.quota"),
        ({"memory": {"quota": 1, "limit": 1e300, "overQuotaWeight": 1}}, "spec.resources.memory.limit"),
        ({"cpu": {"quota": 1, "limit": -1, "overQuotaWeight": 1e300}}, "spec.resources.cpu.overQuotaWeight"),
    ],
)
def test_a_queue_amount_that_would_make_the_fair_share_sums_infinite_is_refused(
    resource: dict[str, Any], field: str
) -> None:
    queue = wire.decode(wire.Queue, msgspec.json.encode(queue_doc("huge", **resource)))
    with pytest.raises(InvalidObject) as caught:
        translate.queue_of(queue, creation_index=0)
    _assert_names(caught.value, "Queue", "huge")
    assert caught.value.field == field


def test_a_queue_priority_beyond_32_bits_is_refused() -> None:
    doc = queue_doc("loud")
    doc["spec"]["priority"] = 2**40
    with pytest.raises(InvalidObject) as caught:
        translate.queue_of(wire.decode(wire.Queue, msgspec.json.encode(doc)), creation_index=0)
    assert caught.value.field == "spec.priority"
