"""KAI's queue validating webhook (v0.14) as Kairos serves it: a Queue without spec.resources is refused;
with the quota check on, a child whose parent does not exist (or has no resources) is refused, and quotas
above the parent's, alone or summed with the siblings', are admitted with KAI's warnings (KAI's code admits
them: its own test "warns but does not block on parent/child overcommit"); -1 is unlimited. Every refusal
names the queue and the field, and no Queue a tenant writes makes the check raise."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.webhook.admission_review import AdmissionRequest, request_of
from services.state.webhook.queue_validation import QueueValidation, queues_of, verdict_response
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts.messages import NodeRecord, QueueRecord
from shared.kube import queue_admission
from shared.kube.queue_admission import QueueQuotas, QueueVerdict, add, exceeds, review, shown_quota
from shared.model import Node, Queue, QueueResource
from tools.kubesim import admission as kubesim_admission

Obj = dict[str, Any]


def queue(name: str, parent: str = "", **quotas: float) -> Obj:
    """A Queue as the API server sends it; `quotas` by resource (gpu, cpu in millicores, memory in MB)."""
    spec: Obj = {"resources": {key: {"quota": value, "limit": -1} for key, value in quotas.items()}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def held(name: str, parent: str = "", **quotas: float) -> QueueQuotas:
    return queue_admission.read_queue(queue(name, parent, **quotas))


PARENT = held("research", gpu=4, cpu=8000, memory=16000)
SIBLING = held("team-b", "research", gpu=2, cpu=2000, memory=4000)
OTHERS = {q.name: q for q in (PARENT, SIBLING)}


# --- refusals ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("obj", "check", "field", "problem"),
    [
        pytest.param(
            {"metadata": {"name": "a"}, "spec": {"parentQueue": "research"}},
            False,
            "spec.resources",
            "resources must be specified",
            id="no resources, check off",
        ),
        pytest.param(
            {"metadata": {"name": "a"}}, True, "spec.resources", "resources must be specified", id="no spec"
        ),
        pytest.param(
            queue("a", "nowhere", gpu=1),
            True,
            "spec.parentQueue",
            "failed to get parent queue nowhere: not found",
            id="unknown parent",
        ),
        pytest.param(
            queue("a", "bare", gpu=1),
            True,
            "spec.parentQueue",
            "parent queue bare has no resources defined",
            id="parent without resources",
        ),
        pytest.param(
            {"metadata": {"name": "a"}, "spec": {"resources": {"gpu": {"quota": "two"}}}},
            False,
            "spec.resources.gpu.quota",
            "must be a number, got 'two'",
            id="quota not a number",
        ),
        pytest.param(
            {"metadata": {"name": "a"}, "spec": {"resources": {"gpu": {"quota": 10**400}}}},
            False,
            "spec.resources.gpu.quota",
            "must be a finite number",
            id="quota of 400 digits",
        ),
        pytest.param(
            {"metadata": {"name": "a"}, "spec": {"parentQueue": 7, "resources": {}}},
            False,
            "spec.parentQueue",
            "must be a string, got 7",
            id="parent not a string",
        ),
        pytest.param(
            {"metadata": {"name": "a"}, "spec": ["resources"]},
            False,
            "spec",
            "must be an object",
            id="spec a list",
        ),
    ],
)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_queue_is_refused_naming_itself_and_the_field(
    obj: Obj, check: bool, field: str, problem: str, operation: str
) -> None:
    others = {**OTHERS, "bare": QueueQuotas(name="bare", has_resources=False)}
    verdict = review(operation, obj, others, quota_validation=check)
    assert not verdict.allowed
    assert verdict.message.startswith(f"Queue 'a': {field}: ")
    assert problem in verdict.message


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(queue("a", "nowhere", gpu=1), id="unknown parent"),
        pytest.param(queue("a", "research", gpu=100), id="over the parent"),
    ],
)
def test_with_the_check_off_only_the_resources_are_required(obj: Obj) -> None:
    assert review("CREATE", obj, OTHERS, quota_validation=False) == QueueVerdict(allowed=True)


def test_deletion_and_other_operations_are_not_checked() -> None:
    for operation in ("DELETE", "CONNECT"):
        assert review(operation, {"metadata": {"name": "a"}}, {}, quota_validation=True).allowed


def test_a_missing_parent_says_it_may_yet_arrive() -> None:
    assert review("CREATE", queue("a", "nowhere", gpu=1), {}, quota_validation=True).parent_missing
    bare = {"bare": QueueQuotas(name="bare", has_resources=False)}
    assert not review("CREATE", queue("a", "bare", gpu=1), bare, quota_validation=True).parent_missing


# --- warnings ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        pytest.param({"gpu": 2, "cpu": 6000, "memory": 12000}, [], id="within the parent with the sibling"),
        pytest.param(
            {"gpu": 3, "cpu": 1000, "memory": 1000},
            [
                "spec.resources.gpu.quota: total children GPU quota (5.00) exceeds parent queue research GPU quota (4.00)"
            ],
            id="the sum over the parent",
        ),
        pytest.param(
            {"gpu": 5, "cpu": 0, "memory": 0},
            [
                "spec.resources.gpu.quota: child queue GPU quota (5.00) exceeds parent queue research GPU quota (4.00)",
                "spec.resources.gpu.quota: total children GPU quota (7.00) exceeds parent queue research GPU quota (4.00)",
            ],
            id="the child over the parent",
        ),
        pytest.param(
            {"gpu": 0, "cpu": 9000, "memory": -1},
            [
                "spec.resources.cpu.quota: child queue CPU quota (9000) exceeds parent queue research CPU quota (8000)",
                (
                    "spec.resources.memory.quota: child queue Memory quota (unlimited) exceeds parent queue research"
                    " Memory quota (16000)"
                ),
                (
                    "spec.resources.cpu.quota: total children CPU quota (11000) exceeds parent queue research CPU quota"
                    " (8000)"
                ),
                (
                    "spec.resources.memory.quota: total children Memory quota (unlimited) exceeds parent queue research"
                    " Memory quota (16000)"
                ),
            ],
            id="CPU over and memory unlimited, in KAI's order",
        ),
        pytest.param({"gpu": 2.0000001}, [], id="float drift is no excess"),
    ],
)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_quotas_above_the_parent_are_admitted_with_warnings(
    quotas: dict[str, float], expected: list[str], operation: str
) -> None:
    verdict = review(operation, queue("team-a", "research", **quotas), OTHERS, quota_validation=True)
    assert verdict.allowed
    assert list(verdict.warnings) == [f"Queue 'team-a': {text}" for text in expected]


def test_nothing_exceeds_an_unlimited_parent() -> None:
    others = {"top": held("top", gpu=-1, cpu=-1, memory=-1), "x": held("x", "top", gpu=-1)}
    verdict = review("CREATE", queue("a", "top", gpu=-1, cpu=10**9), others, quota_validation=True)
    assert verdict == QueueVerdict(allowed=True)


def test_an_update_lowering_a_parent_under_its_children_warns_per_child_and_for_the_sum() -> None:
    others = {**OTHERS, "team-c": held("team-c", "research", gpu=1)}
    verdict = review(
        "UPDATE", queue("research", gpu=1.5, cpu=8000, memory=16000), others, quota_validation=True
    )
    assert verdict.allowed
    assert list(verdict.warnings) == [
        (
            "Queue 'research': spec.resources.gpu.quota: child queue team-b GPU quota (2.00) exceeds parent GPU quota"
            " (1.50)"
        ),
        "Queue 'research': spec.resources.gpu.quota: total children GPU quota (3.00) exceeds parent GPU quota (1.50)",
    ]
    # A new queue has no children yet: KAI checks them on update only.
    assert review("CREATE", queue("research", gpu=1.5), others, quota_validation=True).warnings == ()


def test_the_queue_itself_is_never_its_own_sibling() -> None:
    """An update of a child: its old form in the replica is replaced by the new one, not added to it."""
    others = {**OTHERS, "team-a": held("team-a", "research", gpu=2)}
    assert review("UPDATE", queue("team-a", "research", gpu=2), others, quota_validation=True).warnings == ()


@pytest.mark.parametrize(
    ("quota", "parent", "over"),
    [(1, 1, False), (1.000001, 1, False), (1.01, 1, True), (-1, 5, True), (5, -1, False), (-1, -1, False)],
)
def test_a_quota_exceeds_its_parent_as_kai_counts_it(quota: float, parent: float, over: bool) -> None:
    assert exceeds(quota, parent) is over


@pytest.mark.parametrize(("a", "b", "total"), [(1, 2, 3), (-1, 2, -1), (2, -1, -1), (0, 0, 0)])
def test_a_sum_with_an_unlimited_term_is_unlimited(a: float, b: float, total: float) -> None:
    assert add(a, b) == total


@pytest.mark.parametrize(
    ("quota", "decimals", "text"), [(-1, 0, "unlimited"), (2.5, 2, "2.50"), (1000, 0, "1000")]
)
def test_quotas_are_shown_as_kai_shows_them(quota: float, decimals: int, text: str) -> None:
    assert shown_quota(quota, decimals) == text


def test_the_replicas_queues_are_read_in_the_queues_own_units() -> None:
    model = Queue(
        name="q",
        parent="p",
        gpu=QueueResource(quota=2.5),
        cpu=QueueResource(quota=1500),
        memory=QueueResource(quota=3e9),
    )
    records = [QueueRecord(queue=model), NodeRecord(node=Node(name="n", cpu_millis=1, memory_bytes=1))]
    [read] = queues_of(records)
    assert QueueQuotas.of_model(read) == QueueQuotas(
        name="q", parent="p", quota={"cpu": 1500, "gpu": 2.5, "memory": 3000}
    )
    unlimited = Queue(name="u", memory=QueueResource(quota=-1))
    assert QueueQuotas.of_model(unlimited).of("memory") == -1


# --- hostile Queues --------------------------------------------------------------------------------------------
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
_quota = st.one_of(_json, st.integers(min_value=-(10**30), max_value=10**30), st.sampled_from([-1, 0, 2.5]))
_resource = st.one_of(_json, st.fixed_dictionaries({}, optional={"quota": _quota, "limit": _quota}))
_spec = st.one_of(
    _json,
    st.fixed_dictionaries(
        {},
        optional={
            "parentQueue": st.one_of(_json, st.sampled_from(["research", "team-b", "nowhere", ""])),
            "resources": st.one_of(
                _json,
                st.fixed_dictionaries({}, optional={"gpu": _resource, "cpu": _resource, "memory": _resource}),
            ),
        },
    ),
)
_queue = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"metadata": st.fixed_dictionaries({"name": st.sampled_from(["a", "research"])})},
        optional={"spec": _spec},
    ),
)


@settings(max_examples=400, deadline=None)
@given(obj=_queue, operation=st.sampled_from(["CREATE", "UPDATE"]), check=st.booleans())
def test_no_queue_a_tenant_writes_makes_the_check_raise_and_every_refusal_names_a_field(
    obj: object, operation: str, check: bool
) -> None:
    verdict = review(operation, obj, OTHERS, quota_validation=check, name="a")
    if not verdict.allowed:
        assert verdict.message.startswith("Queue '")
        # The whole object is at fault only when it is not an object at all.
        assert ": spec" in verdict.message or "must be an object" in verdict.message
    msgspec.json.encode(verdict_response("u", verdict))


# --- the endpoint ----------------------------------------------------------------------------------------------
def context() -> ServiceContext:
    return ServiceContext("state", ServiceConfig(), cast(Bus, None))


def request(obj: Obj, operation: str = "CREATE") -> AdmissionRequest:
    return request_of("r-1", operation, name=obj["metadata"]["name"], obj=obj)


async def test_a_child_waits_briefly_for_its_parent_to_reach_the_replica() -> None:
    queues: list[Queue] = []
    endpoint = QueueValidation(context(), lambda: queues, quota_validation=True, parent_wait=2.0)

    async def parent_arrives() -> None:
        await asyncio.sleep(0.2)
        queues.append(Queue(name="research", gpu=QueueResource(quota=4)))

    arrival = asyncio.create_task(parent_arrives())
    verdict = await endpoint.decide(request(queue("team-a", "research", gpu=1)))
    await arrival
    assert verdict == QueueVerdict(allowed=True)


async def test_a_parent_that_never_comes_is_refused_after_the_wait() -> None:
    endpoint = QueueValidation(context(), list, quota_validation=True, parent_wait=0.3)
    verdict = await endpoint.decide(request(queue("team-a", "nowhere", gpu=1)))
    assert not verdict.allowed
    assert "spec.parentQueue" in verdict.message


async def test_an_unforeseen_failure_admits_the_queue_with_a_warning() -> None:
    def broken() -> list[Queue]:
        raise RuntimeError("boom")

    ctx = context()
    verdict = await QueueValidation(ctx, broken, quota_validation=True).decide(request(queue("a", gpu=1)))
    assert verdict.allowed
    assert "RuntimeError" in verdict.warnings[0]
    assert ctx.counters["admission_unforeseen"] == 1


def test_a_refusal_is_a_403_with_the_message_and_the_warnings_go_along() -> None:
    refused = verdict_response(
        "u-1", QueueVerdict(allowed=False, message="Queue 'a': spec.resources: x", warnings=("w",))
    )
    assert refused["response"] == {
        "uid": "u-1",
        "allowed": False,
        "status": {"code": 403, "reason": "Forbidden", "message": "Queue 'a': spec.resources: x"},
        "warnings": ["w"],
    }
    assert verdict_response("u-2", QueueVerdict(allowed=True))["response"] == {"uid": "u-2", "allowed": True}


def test_the_configuration_kairos_up_registers_is_one_kubesim_accepts_and_sends_queues_to() -> None:
    config = queue_admission.webhook_configuration(["http://127.0.0.1:9000"])
    kubesim_admission.default_configuration(kubesim_admission.VALIDATING, config)
    kubesim_admission.validate_configuration(kubesim_admission.VALIDATING, config)
    [hook] = config["webhooks"]
    assert hook["clientConfig"]["url"] == "http://127.0.0.1:9000/validate-scheduling-run-ai-v2-queue"
    assert hook["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert hook["rules"][0]["resources"] == ["queues"]
