"""Specs for generic ephemeral volumes' claims (`shared.core.volumes`, issue 30 deliverable 1): the claim
``<pod>-<volume>`` is the pod's only when the pod is its controller owner, as Kubernetes'
``ephemeral.VolumeIsForPod`` decides for kube-scheduler and the kubelet; otherwise, or while the claim is not
there yet, the pod waits with kube-scheduler's words, and `kairos explain` names them.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.core import volumes as v
from shared.explain import failed_scheduling_message
from shared.kube import translate, wire
from shared.kube.volumes import WireClaim, claim_of, decode
from shared.model import Pod
from shared.model.volumes import Claim, PersistentVolume, Volumes
from tests.unit.test_volumes import FAST, NODES, claim, job, pending_reason, placements, run, snapshot

POD_UID = "uid-of-p"


def ephemeral_job(uid: str = POD_UID) -> tuple[Any, list[Pod]]:
    """One pod whose generic ephemeral volume "scratch" uses the claim "<pod>-scratch"."""
    pg, pods = job("job")
    pod = pods[0]
    name = f"{pod.name}-scratch"
    return pg, [msgspec.structs.replace(pod, uid=uid, claims=(name,), ephemeral_claims=(name,))]


def scratch_of(pods: list[Pod], **kw: Any) -> Claim:
    return claim(pods[0].claims[0], cls="fast", **kw)


@pytest.mark.parametrize(
    ("owner", "reason"),
    [
        pytest.param(POD_UID, None, id="a claim the pod controls is the pod's"),
        pytest.param("", "was not created for pod", id="a claim without a controller is not the pod's"),
        pytest.param("uid-of-another", "was not created for pod", id="another pod's claim is not the pod's"),
    ],
)
def test_an_ephemeral_volumes_claim_is_the_pods_only_when_the_pod_controls_it(
    owner: str, reason: str | None
) -> None:
    pg, pods = ephemeral_job()
    volumes = Volumes(claims=(scratch_of(pods, controller_uid=owner),), classes=(FAST,))
    result = run(snapshot(NODES, [(pg, pods)], volumes))
    if reason is None:
        assert placements(result)
        return
    assert not result.binds
    pod = pods[0]
    expected = f"PVC ns/{pod.name}-scratch was not created for pod ns/{pod.name} (pod is not owner)"
    assert expected in pending_reason(result)


def test_an_ephemeral_volumes_claim_not_there_yet_is_waited_for_in_kube_schedulers_words() -> None:
    pg, pods = ephemeral_job()
    result = run(snapshot(NODES, [(pg, pods)], Volumes(classes=(FAST,))))
    assert not result.binds
    expected = (
        f'waiting for ephemeral volume controller to create the persistentvolumeclaim "{pods[0].claims[0]}"'
    )
    assert expected in pending_reason(result)


def test_a_claim_named_by_a_persistent_volume_claim_volume_needs_no_owner() -> None:
    pg, pods = job("job", "data")
    volumes = Volumes(claims=(claim("data", cls="fast", controller_uid="uid-of-another"),), classes=(FAST,))
    assert placements(run(snapshot(NODES, [(pg, pods)], volumes)))


def test_a_bound_ephemeral_claim_of_another_pod_is_refused_before_its_volume_is_looked_at() -> None:
    pg, pods = ephemeral_job()
    name = pods[0].claims[0]
    volumes = Volumes(
        claims=(claim(name, cls="fast", volume_name="pv-1", bound=True, controller_uid="uid-of-another"),),
        volumes=(PersistentVolume(name="pv-1", storage_class="fast", claim_ref=f"ns/{name}"),),
        classes=(FAST,),
    )
    assert "(pod is not owner)" in pending_reason(run(snapshot(NODES, [(pg, pods)], volumes)))


def test_the_reason_is_unresolvable_preemption_cannot_lift_it() -> None:
    assert "was not created for pod" not in " ".join(v._RESOLVABLE)


# --- translation ----------------------------------------------------------------------------------------
def pod_json(volumes: list[dict[str, Any]]) -> wire.Pod:
    pod: wire.Pod = wire.convert(
        "Pod",
        {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": POD_UID,
                "annotations": {"pod-group-name": "g"},
            },
            "spec": {"volumes": volumes},
        },
    )
    return pod


@pytest.mark.parametrize(
    ("volumes", "claims", "ephemeral"),
    [
        pytest.param(
            [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}],
            ("p-scratch",),
            ("p-scratch",),
            id="an ephemeral volume's claim is marked ephemeral",
        ),
        pytest.param(
            [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}],
            ("data",),
            (),
            id="a claim named by a persistentVolumeClaim volume is not",
        ),
        pytest.param(
            [
                {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}},
            ],
            ("data", "p-scratch"),
            ("p-scratch",),
            id="both kinds in one pod",
        ),
    ],
)
def test_a_pods_ephemeral_claims_are_read_from_its_volumes(
    volumes: list[dict[str, Any]], claims: tuple[str, ...], ephemeral: tuple[str, ...]
) -> None:
    pod = translate.pod_of(pod_json(volumes))
    assert (pod.claims, pod.ephemeral_claims) == (claims, ephemeral)


def owner(uid: str, *, controller: bool | None) -> dict[str, Any]:
    ref: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": uid}
    if controller is not None:
        ref["controller"] = controller
    return ref


@pytest.mark.parametrize(
    ("owners", "expected"),
    [
        pytest.param([owner(POD_UID, controller=True)], POD_UID, id="the controller owner's uid"),
        pytest.param([owner(POD_UID, controller=None)], "", id="an owner that is not the controller: none"),
        pytest.param(
            [owner("other", controller=False), owner(POD_UID, controller=True)],
            POD_UID,
            id="the controller among several owners",
        ),
        pytest.param([], "", id="no owners: none"),
    ],
)
def test_a_claims_controller_owner_is_read_from_its_owner_references(
    owners: list[dict[str, Any]], expected: str
) -> None:
    body = {"metadata": {"name": "p-scratch", "namespace": "ns", "ownerReferences": owners}}
    raw = decode("persistentvolumeclaims", msgspec.json.encode(body))
    assert isinstance(raw, WireClaim)
    assert claim_of(raw).controller_uid == expected


# --- explain --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        pytest.param(
            "owned by another",
            "3 PVC ns/job-0-scratch was not created for pod ns/job-0 (pod is not owner)",
            id="not the pod's",
        ),
        pytest.param(
            "missing",
            '3 waiting for ephemeral volume controller to create the persistentvolumeclaim "job-0-scratch"',
            id="not there yet",
        ),
    ],
)
def test_failed_scheduling_names_the_ephemeral_claims_reason(claims: str, reason: str) -> None:
    pg, pods = ephemeral_job()
    found = (scratch_of(pods, controller_uid="uid-of-another"),) if claims != "missing" else ()
    result = run(snapshot(NODES, [(pg, pods)], Volumes(claims=found, classes=(FAST,))))
    message = failed_scheduling_message(pending_reason(result), len(NODES))
    assert message == f"0/3 nodes are available: {reason}."
