"""A placement worker's proposal from the core's result (`services.placement.worker.build_proposal`): it
carries what the binder needs, sized by what the session changed rather than by the cluster."""

from __future__ import annotations

from services.placement.worker import build_proposal
from shared.contracts.messages import WorkItem
from shared.core.result import Binding, BindProposal, CycleResult, PodGroupStatus

ITEM = WorkItem(id="w", shard="default", term=1, leader="q", now=100.0, state_revision=5)


def status(key: str) -> PodGroupStatus:
    return PodGroupStatus(podgroup=key, namespace="ns", name=key, queue="q", pending=False)


def result() -> CycleResult:
    """Four podgroups: `fresh` just went stale, `healed` is no longer, `still` stays stale, `quiet` never
    was; `fresh` and `still` started long ago, `new` binds now."""
    bind = Binding(pod="new-0", namespace="ns", name="new-0", podgroup="new", node="n1", gpus=1.0)
    return CycleResult(
        binds=(BindProposal("new", "q", (bind,)),),
        stale_since={"fresh": 100.0, "still": 50.0},
        last_start={"fresh": 10.0, "still": 20.0, "new": 100.0},
        podgroups={key: status(key) for key in ("fresh", "healed", "still", "quiet", "new")},
    )


def test_only_the_podgroups_whose_stale_stamp_changed_are_stamped() -> None:
    before = {"fresh": None, "healed": 40.0, "still": 50.0, "quiet": None, "new": None}
    proposal = build_proposal(
        ITEM, result(), state_revision=5, node_revision=lambda _: 3, proposal_id="p", stale_before=before
    )
    assert proposal.stamped == ("fresh", "healed")
    assert proposal.stale_since == {"fresh": 100.0}  # healed: stamped and absent, so cleared
    assert proposal.last_start == {"new": 100.0}  # only the podgroups this proposal binds
    assert proposal.node_revisions == {"n1": 3}


def test_a_session_that_changes_no_stamp_stamps_nothing() -> None:
    before = {"fresh": 100.0, "healed": None, "still": 50.0, "quiet": None, "new": None}
    proposal = build_proposal(
        ITEM, result(), state_revision=5, node_revision=lambda _: 0, proposal_id="p", stale_before=before
    )
    assert proposal.stamped == ()
    assert proposal.stale_since == {}
