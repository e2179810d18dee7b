"""Spec: the ledger's pods, kept from one call to the next (`shared.core.ledger_overlay.overlay`), are
exactly what working them out afresh gives (`fresh`), for any run of snapshots whose pods and ledger
entries are added, changed, removed or kept as the same objects."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.messages import NodeLedger, Reservation
from shared.core.ledger_overlay import fresh, overlay
from shared.model import Pod, PodStatus
from shared.model.dra import ClaimHold
from tests.builders import pod

NAMES = [f"p{i}" for i in range(6)]
NODES = ["n0", "n1", "n2"]

statuses = st.sampled_from([PodStatus.PENDING, PodStatus.PENDING, PodStatus.RUNNING, PodStatus.BOUND])


@st.composite
def a_pod(draw: st.DrawFn) -> Pod:
    status = draw(statuses)
    node = None if status == PodStatus.PENDING else draw(st.sampled_from(NODES))
    return pod(draw(st.sampled_from(NAMES)), namespace="ns", status=status, node=node)


@st.composite
def an_entry(draw: st.DrawFn, taken: frozenset[str] = frozenset()) -> NodeLedger:
    """A node's entry; mostly of pods no other entry reserves (`taken`), now and then of any."""
    node = draw(st.sampled_from(NODES))
    free = [n for n in NAMES if f"ns/{n}" not in taken] if draw(st.integers(0, 4)) else NAMES
    names = draw(st.lists(st.sampled_from(free), max_size=3, unique=True)) if free else []
    devices = draw(st.integers(0, 19)) == 0  # now and then a reservation with devices
    pods = {
        f"ns/{name}": Reservation(
            pod=f"ns/{name}",
            podgroup="pg",
            gpu_groups=(draw(st.sampled_from(["g0", "g1"])),),
            devices=(ClaimHold(claim=f"ns/{name}-claim", devices=()),) if devices else (),
        )
        for name in names
    }
    return NodeLedger(node=node, pods=pods)


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[tuple[Pod, ...], tuple[NodeLedger, ...]]]:
    """Snapshots in turn: each keeps some of the last one's pods and entries as the very same objects,
    drops others and adds new ones (a changed record is a new object of the same key)."""
    steps = []
    pods: list[Pod] = []
    entries: list[NodeLedger] = []
    for _ in range(draw(st.integers(1, 6))):
        pods = [p for p in pods if draw(st.booleans())] + draw(st.lists(a_pod(), max_size=4))
        entries = [e for e in entries if draw(st.booleans())]
        for _ in range(draw(st.integers(0, 3))):
            entries.append(draw(an_entry(frozenset(key for e in entries for key in e.pods))))
        if draw(st.integers(0, 4)):  # mostly the one pod per key a replica holds, in key order
            pods = sorted({p.key: p for p in pods}.values(), key=lambda p: p.key)
        steps.append((tuple(pods), tuple(entries)))
    return steps


@settings(max_examples=300, deadline=None)
@given(runs())
def test_kept_overlay_shows_every_snapshot_as_a_fresh_one_does(
    steps: list[tuple[tuple[Pod, ...], tuple[NodeLedger, ...]]],
) -> None:
    for pods, entries in steps:
        shown, holds = overlay(pods, entries)
        expected, expected_holds = fresh(pods, entries)
        assert shown == expected
        assert [a is b for a, b in zip(shown, expected, strict=True)] == [
            a is b for a, b in zip(pods, expected, strict=True)
        ]  # a pod the ledger leaves as it is, is the record itself
        assert holds == expected_holds


def test_a_pending_pod_the_ledger_reserves_shows_bound_on_its_node_with_its_groups() -> None:
    pending, running = pod("a", namespace="ns"), pod("b", namespace="ns", status=PodStatus.RUNNING, node="n0")
    entry = NodeLedger(
        node="n1",
        pods={key: Reservation(pod=key, podgroup="pg", gpu_groups=("g",)) for key in ("ns/a", "ns/b")},
    )
    for _ in range(2):  # afresh, then kept
        shown, holds = overlay((pending, running), (entry,))
        assert [(p.status, p.node, p.gpu_groups) for p in shown] == [
            (PodStatus.BOUND, "n1", ("g",)),
            (PodStatus.RUNNING, "n0", ()),
        ]
        assert holds == []


def test_a_pod_whose_reservation_goes_shows_as_its_record_again() -> None:
    pending = pod("a", namespace="ns")
    entry = NodeLedger(node="n1", pods={"ns/a": Reservation(pod="ns/a", podgroup="pg")})
    assert overlay((pending,), (entry,))[0][0].node == "n1"
    assert overlay((pending,), (NodeLedger(node="n1"),))[0] == (pending,)
