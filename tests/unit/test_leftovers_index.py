"""The recovery scan's index of unclaimed reservations finds, scan after scan, what a full pass over the
view finds (`unclaimed_reservations`), however the view's claims and node ledgers were written, rewritten,
deleted and written again in between; a record kept (same object) costs nothing to look at again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.binder.leftovers import ReservationIndex, unclaimed_reservations
from shared.contracts import subjects as s
from shared.contracts.messages import NodeLedger, PodClaim, Reservation

PODS = ("ns/a", "ns/b", "ns/c", "ns/d")
NODES = ("n1", "n2", "n3")
PROPOSALS = ("", "p", "q")

claim = st.builds(
    PodClaim, pod=st.sampled_from(PODS), node=st.sampled_from(NODES), proposal=st.sampled_from(PROPOSALS[1:])
)
held = st.dictionaries(st.sampled_from(PODS), st.sampled_from(PROPOSALS), max_size=len(PODS))
change = st.one_of(
    st.tuples(st.just("claim"), claim),
    st.tuples(st.just("unclaim"), st.sampled_from(PODS)),
    st.tuples(st.just("node"), st.sampled_from(NODES), held),
    st.tuples(st.just("unnode"), st.sampled_from(NODES)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(change, max_size=4), max_size=8))
def test_the_index_finds_what_a_full_pass_finds_after_every_change(scans: list[list[tuple]]) -> None:
    claims: dict[str, PodClaim] = {}
    nodes: dict[str, NodeLedger] = {}
    index = ReservationIndex()
    for changes in scans:
        for what, *args in changes:
            if what == "claim":
                c = args[0]
                claims[s.ledger_claim_key(c.pod)] = c
            elif what == "unclaim":
                claims.pop(s.ledger_claim_key(args[0]), None)
            elif what == "node":
                node, pods = args
                reservations = {p: Reservation(pod=p, podgroup="g", proposal=pr) for p, pr in pods.items()}
                nodes[s.ledger_node_key(node)] = NodeLedger(node=node, pods=reservations)
            else:
                nodes.pop(s.ledger_node_key(args[0]), None)
        assert index.update(claims, nodes) == unclaimed_reservations(claims, nodes, {})


def test_a_claim_taken_back_leaves_its_reservation_unclaimed_and_a_new_claim_backs_it_again() -> None:
    reservation = Reservation(pod="ns/a", podgroup="g", proposal="p")
    nodes = {s.ledger_node_key("n1"): NodeLedger(node="n1", pods={"ns/a": reservation})}
    backed = {s.ledger_claim_key("ns/a"): PodClaim(pod="ns/a", node="n1", proposal="p")}
    index = ReservationIndex()
    assert index.update(backed, nodes) == {}
    assert index.update({}, nodes) == {("n1", "p"): ["ns/a"]}
    assert index.update(backed, nodes) == {}
    assert index.update(backed, {}) == {}
