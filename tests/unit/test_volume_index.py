"""The volume filter looks, for a WaitForFirstConsumer claim on a node, only at the volumes that may be on
that node (those whose node affinity names its hostname in every term, and those not pinned by hostname),
so a cluster with a local volume on each of 5,000 nodes costs a few volumes per node, not 5,000
(docs/performance.md, "Volumes and DRA claims"). The index must never change the answer: over random
volumes and nodes, the volume a claim gets is the one a walk over every volume of its class finds, the
smallest free one whose node affinity holds there (kube-scheduler's best fit)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core import selectors
from shared.core import volumes as v
from shared.model import LabelSelectorTerm, NodeSelectorRequirement
from shared.model.volumes import Claim, PersistentVolume, Volumes

GI = 1024**3
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
HOSTS = ("n0", "n1", "n2", "n3")
ZONES = ("z0", "z1")

requirements = st.one_of(
    st.builds(
        NodeSelectorRequirement,
        st.just(HOST),
        st.sampled_from(("In", "NotIn")),
        st.lists(st.sampled_from(HOSTS), max_size=3, unique=True).map(tuple),
    ),
    st.builds(NodeSelectorRequirement, st.just(ZONE), st.just("In"), st.tuples(st.sampled_from(ZONES))),
)
terms = st.lists(requirements, min_size=1, max_size=3).map(lambda rs: LabelSelectorTerm(tuple(rs)))


@st.composite
def volume_sets(draw: st.DrawFn) -> list[PersistentVolume]:
    count = draw(st.integers(min_value=0, max_value=12))
    return [
        PersistentVolume(
            name=f"pv-{i:02d}",
            capacity_bytes=draw(st.sampled_from((5, 10, 20))) * GI,
            access_modes=("ReadWriteOnce",),
            storage_class=draw(st.sampled_from(("local", "other"))),
            node_affinity=tuple(draw(st.lists(terms, max_size=2))),
            claim_ref=draw(st.sampled_from(("", "", "", "ns/data", "ns/else"))),
        )
        for i in range(count)
    ]


def _walk(volumes: list[PersistentVolume], claim: Claim, labels: dict[str, str]) -> PersistentVolume | None:
    """The reference: every volume of the claim's class, smallest first, then by name."""
    ordered = sorted(
        (pv for pv in volumes if pv.storage_class == claim.storage_class),
        key=lambda pv: (pv.capacity_bytes, pv.name),
    )

    def holds(pv: PersistentVolume) -> bool:
        return not pv.node_affinity or any(selectors.node_term_matches(t, labels) for t in pv.node_affinity)

    for pv in ordered:
        if pv.claim_ref == claim.key:
            return pv if holds(pv) else None
    for pv in ordered:
        if pv.claim_ref or pv.capacity_bytes < claim.request_bytes:
            continue
        if holds(pv):
            return pv
    return None


@settings(max_examples=300, deadline=None)
@given(
    volume_sets(),
    st.sampled_from((*HOSTS, "elsewhere")),
    st.sampled_from(ZONES),
    st.sampled_from((5, 10, 20)),
)
def test_the_volume_a_claim_gets_on_a_node_is_the_best_fit_of_every_volume_of_its_class(
    volumes: list[PersistentVolume], host: str, zone: str, request: int
) -> None:
    claim = Claim(
        name="data",
        namespace="ns",
        storage_class="local",
        access_modes=("ReadWriteOnce",),
        request_bytes=request * GI,
    )
    labels = {HOST: host, ZONE: zone}
    state = v._index(Volumes.of([*volumes, claim]), ())
    assert v._match(state, claim, labels, frozenset(), set()) == _walk(volumes, claim, labels)


def test_a_volume_pinned_to_one_host_is_looked_at_only_on_that_host() -> None:
    term = LabelSelectorTerm((NodeSelectorRequirement(HOST, "In", ("n1",)),))
    zonal = LabelSelectorTerm((NodeSelectorRequirement(ZONE, "In", ("z0",)),))
    local = PersistentVolume(name="local-n1", storage_class="local", node_affinity=(term,))
    anywhere = PersistentVolume(name="zonal", storage_class="local", node_affinity=(zonal,))
    state = v._index(Volumes.of([local, anywhere]), ())
    assert state.pinned == {("local", "n1"): [local]}
    assert state.unpinned == {"local": [anywhere]}
