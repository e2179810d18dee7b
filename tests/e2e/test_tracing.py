"""One podgroup's scheduling attempt is one trace across the four services, as an OTLP collector sees it.

The stack runs as separate processes exporting over OTLP/HTTP to the receiver fixture (`otlp`, real
protobuf decoding). For a gang applied with kubectl (Kubernetes source) and for a reclaim (in-memory
source), one trace id holds spans of kairos-state, kairos-queue, kairos-placement and kairos-binder, linked
parent to child: state.observe -> queue.order -> placement.place -> binder.commit -> binder.bind/evict.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.bus.client import BusClient
from tests.e2e.kubectl import kubectl, kubesim_stack
from tests.e2e.scenarios import RECLAIMER, RECLAIMING_JOB, reclaim
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tools.stack.supervisor import Stack, start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kai"
SERVICES = {"kairos-state", "kairos-queue", "kairos-placement", "kairos-binder"}
SETTLE = 60.0


def by_id(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.span_id: span for span in spans}


def chain(spans: list[ReceivedSpan], leaf: ReceivedSpan) -> list[ReceivedSpan]:
    """`leaf` and its ancestors, root first (as far as they were received)."""
    index = by_id(spans)
    out = [leaf]
    while out[-1].parent_span_id and out[-1].parent_span_id in index:
        out.append(index[out[-1].parent_span_id])
    return out[::-1]


def commits(spans: list[ReceivedSpan], podgroup: str, **attributes: object) -> list[ReceivedSpan]:
    return [
        s
        for s in spans
        if s.name == "binder.commit"
        and s.attributes.get("kairos.podgroup") == podgroup
        and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan, name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.name == name]


def complete_commit(podgroup: str, bound: int) -> object:
    """A predicate: the binder.commit of `podgroup` that bound `bound` pods, once its whole chain and its
    binder.bind spans have arrived."""

    def check(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        for commit in commits(spans, podgroup, **{"kairos.pods.bound": bound}):
            names = [s.name for s in chain(spans, commit)]
            if names[0] == "state.observe" and len(children(spans, commit, "binder.bind")) == bound:
                return commit
        return None

    return check


def assert_one_trace_through_four_services(spans: list[ReceivedSpan], commit: ReceivedSpan) -> None:
    path = chain(spans, commit)
    assert [s.name for s in path] == ["state.observe", "queue.order", "placement.place", "binder.commit"]
    assert [s.service for s in path] == ["kairos-state", "kairos-queue", "kairos-placement", "kairos-binder"]
    assert {s.trace_id for s in path} == {commit.trace_id}
    assert path[0].parent_span_id == ""  # the attempt is the trace's root
    in_trace = {s.service for s in spans if s.trace_id == commit.trace_id}
    assert in_trace >= SERVICES
    assert all(s.instance for s in path), "every span names its replica (service.instance.id)"


# --- a gang through kubectl and the Kubernetes source --------------------------------------------------------
@pytest.fixture
def kube_stack(tmp_path: Path, otlp: OtlpReceiver) -> Iterator[Stack]:
    with kubesim_stack(tmp_path / "kairos", nodes=2, gpus_per_node=8, env=otlp.environment()) as stack:
        yield stack


def test_a_gang_is_one_trace_from_observed_to_bound(kube_stack: Stack, otlp: OtlpReceiver) -> None:
    kubectl(kube_stack, "apply", "-f", str(EXAMPLES / "gang.yaml"))

    commit = otlp.wait_for(complete_commit("default/gang", bound=3), SETTLE)

    spans = list(otlp.spans)
    assert_one_trace_through_four_services(spans, commit)
    observe, order, place, _ = chain(spans, commit)
    assert observe.attributes["kairos.source"] == "kube"
    assert observe.attributes["kairos.queue"] == "default-queue"
    assert order.attributes["kairos.queue.position"] >= 1
    assert "kairos.queue.saturation" in order.attributes
    assert "kairos.queue.fair_share.gpu" in order.attributes
    assert place.attributes["kairos.result"] == "bound"
    assert place.attributes["kairos.nodes.considered"] == 2
    assert len(place.attributes["kairos.nodes.chosen"]) >= 1
    assert commit.attributes["kairos.status"] == "committed"
    assert commit.attributes["kairos.cas.attempts"] >= 3  # a claim per pod, then the node keys
    binds = children(spans, commit, "binder.bind")
    assert sorted(b.attributes["kairos.pod"] for b in binds) == [
        "default/gang-0",
        "default/gang-1",
        "default/gang-2",
    ]
    assert all(b.attributes["kairos.retries"] == 0 for b in binds)

    # The state's write-back of the Scheduled events continues the trace under the commit that bound them.
    writebacks = otlp.wait_for(lambda spans: children(spans, commit, "state.writeback"), SETTLE)
    assert {s.service for s in writebacks} == {"kairos-state"}
    assert {s.attributes["kairos.event"] for s in writebacks} <= {"pod-bound", "podgroup-state"}


# --- a reclaim, in the in-memory cluster ------------------------------------------------------------------------
async def _reclaim(url: str) -> None:
    client = await BusClient.connect(url)
    try:
        await reclaim(client, SETTLE)
    finally:
        await client.close()


def test_a_reclaim_is_traced_from_the_reclaimer_to_its_evictions(tmp_path: Path, otlp: OtlpReceiver) -> None:
    stack = start_stack(
        tmp_path / "kairos",
        options={"state": {"source": "sim"}, "queue": {"period": "0.5"}},
        env=otlp.environment(),
    )
    try:
        asyncio.run(_reclaim(stack.url))
        commit = otlp.wait_for(complete_commit(RECLAIMING_JOB, bound=2), SETTLE)
        spans = list(otlp.spans)
    finally:
        stack.stop()

    assert_one_trace_through_four_services(spans, commit)
    trace = [s for s in spans if s.trace_id == commit.trace_id]
    reclaiming = [
        s for s in trace if s.name == "binder.commit" and s.attributes.get("kairos.evictions", 0) > 0
    ]
    assert reclaiming, "the reclaimer's trace holds the commit that evicted for it"
    evicts = children(trace, reclaiming[0], "binder.evict")
    assert len(evicts) == 2
    assert all(f"reclaimed by podgroup {RECLAIMING_JOB}" in e.attributes["kairos.reason"] for e in evicts)
    placed = [s for s in trace if s.name == "placement.place" and s.attributes.get("kairos.evictions", 0) > 0]
    assert placed
    assert placed[0].attributes["kairos.result"] == "pipelined"
    assert len(placed[0].attributes["kairos.victims"]) == 2
    observe = chain(trace, commit)[0]
    assert observe.attributes["kairos.source"] == "sim"
    assert observe.attributes["kairos.queue"] == RECLAIMER
