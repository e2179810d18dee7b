"""When a GPU reservation may go, as values: a sharer counts until its containers have stopped (the pod is
gone, or its phase is terminal), being deleted or not. The binder's sync (`orphaned_reservations`) and the
state service's accounting (`ForeignPods`: a reservation whose group has live sharers is not counted again
on its node) follow the one rule, `is_live_sharer`. And how many tries a fractional bind's reservation gets
before the binder gives it up (`reservation_attempts`)."""

from __future__ import annotations

from typing import Any

import pytest

from services.binder import gpu_sharing_plan
from services.binder.service import parse_options
from services.state.mirror.foreign import ForeignPods
from shared.errors import ConfigError
from shared.kube import gpu_sharing as gs
from shared.kube import wire

CREATED = "2027-01-15T08:00:00Z"
LATER = 1_900_000_000.0
"""Long after every reservation here was created (older than any grace)."""


def sharer(phase: str, *, deleting: bool = False, group: str = "g1") -> wire.Pod:
    meta: dict[str, Any] = {
        "name": "a",
        "namespace": "team",
        "uid": "uid-a",
        "labels": {"runai-gpu-group": group, gs.SHARING_LABEL: "true"},
        "annotations": {"gpu-fraction": "0.5"},
        "creationTimestamp": CREATED,
    }
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T09:00:00Z"
        meta["deletionGracePeriodSeconds"] = 3600
    return wire.convert(
        wire.Pod,
        {
            "metadata": meta,
            "spec": {"nodeName": "n0", "containers": [{"name": "main"}]},
            "status": {"phase": phase},
        },
    )


def reservation(group: str = "g1") -> wire.Pod:
    body = gs.reservation_pod("n0", group, image="kairos")
    body["metadata"]["creationTimestamp"] = CREATED
    body["metadata"]["uid"] = f"uid-r-{group}"
    body["status"] = {"phase": "Running"}
    return wire.convert(wire.Pod, body)


CASES = [
    ("running", sharer("Running"), True),
    ("pending", sharer("Pending"), True),
    ("terminating, still running", sharer("Running", deleting=True), True),
    ("terminating before it started", sharer("Pending", deleting=True), True),
    ("succeeded", sharer("Succeeded"), False),
    ("failed while being deleted", sharer("Failed", deleting=True), False),
    ("succeeded while being deleted", sharer("Succeeded", deleting=True), False),
]


@pytest.mark.parametrize(("pod", "live"), [(p, live) for _, p, live in CASES], ids=[c[0] for c in CASES])
def test_a_sharer_is_live_until_its_containers_have_stopped(pod: wire.Pod, live: bool) -> None:
    assert gs.is_live_sharer(pod) is live


@pytest.mark.parametrize(("pod", "live"), [(p, live) for _, p, live in CASES], ids=[c[0] for c in CASES])
def test_the_sync_keeps_a_reservation_while_its_sharer_is_live(pod: wire.Pod, live: bool) -> None:
    orphans = gs.orphaned_reservations([pod, reservation()], now=LATER, grace=5.0)
    assert [o.metadata.name for o in orphans] == ([] if live else [reservation().metadata.name])


def test_a_sharer_that_is_gone_leaves_its_reservation_orphaned() -> None:
    assert len(gs.orphaned_reservations([reservation()], now=LATER, grace=5.0)) == 1


@pytest.mark.parametrize(("pod", "live"), [(p, live) for _, p, live in CASES], ids=[c[0] for c in CASES])
def test_the_state_service_counts_the_device_once_while_the_sharer_is_live(pod: wire.Pod, live: bool) -> None:
    """With live sharers the device is the group's, counted by them (a terminating sharer is in KV as
    Releasing, with its group); without, the reservation pod counts as a pod holding a GPU."""
    foreign = ForeignPods()
    r = reservation()
    foreign.track("kai-resource-reservation/r", None, r)
    foreign.track("team/a", None, sharer("Running"))
    assert foreign.holding(r) is None
    recount = foreign.track("team/a", sharer("Running"), pod)
    held = foreign.holding(r)
    if live:
        assert held is None
    else:
        assert held is not None
        assert (held[0], held[1].gpus) == ("n0", 1)
        assert recount == {"kai-resource-reservation/r"}


# --- how long a bind waits for its devices --------------------------------------------------------------------
def test_a_fractional_bind_gets_three_tries_unless_the_binder_option_says_otherwise() -> None:
    assert parse_options({}).reservations().attempts == 3
    assert parse_options({"reservation_attempts": "1"}).reservations().attempts == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [("0", "a whole number >= 1"), ("-1", "a whole number >= 1"), ("many", "a whole number")],
)
def test_a_bad_number_of_tries_is_refused_naming_the_option_and_the_value(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_options({"reservation_attempts": value})
    assert (
        str(refused.value)
        == f"service binder: option 'reservation_attempts': expected {expected}, got {value!r}"
    )


def test_a_bind_given_up_takes_back_every_label_and_annotation_its_sharer_patch_wrote() -> None:
    labels = {"runai-gpu-group": "old", "team": "x"}
    assert gpu_sharing_plan.unshare_patch(labels, ["g1", "g2"]) == {
        "metadata": {
            "labels": {
                "runai-gpu-group": None,
                "runai-gpu-group/g1": None,
                "runai-gpu-group/g2": None,
                gs.SHARING_LABEL: None,
            },
            "annotations": {"kairos.io/gpu-groups": None},
        }
    }
