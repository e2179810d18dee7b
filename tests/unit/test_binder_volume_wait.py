"""When the binder's wait for a pod's volumes (`services.binder.volume_wait`) says a claim is bound as decided,
still on its way, or never going to be: kube-scheduler's ``checkBindings``, rule by rule."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.binder.service import parse_options
from services.binder.volume_wait import BOUND, WAITING, Check, check, volume_to_read
from services.binder.volumes import BIND_TIMEOUT_S
from shared.core.result import VolumeBinding
from shared.errors import ConfigError
from shared.kube.keys import NODE_NAME_LABEL
from shared.kube.volumes import WireClaim, WireVolume

NODE = "n0"
LABELS = {"kubernetes.io/hostname": NODE, NODE_NAME_LABEL: NODE}
UID = "uid-data"
STATIC = VolumeBinding(claim="data", volume="local-1")
PROVISION = VolumeBinding(claim="data")


def claim(
    *, volume: str = "", complete: bool = False, selected: str | None = None, phase: str = ""
) -> WireClaim:
    annotations = {}
    if complete:
        annotations["pv.kubernetes.io/bind-completed"] = "yes"
    if selected is not None:
        annotations["volume.kubernetes.io/selected-node"] = selected
    body = {
        "metadata": {"name": "data", "namespace": "default", "uid": UID, "annotations": annotations},
        "spec": {"volumeName": volume},
        "status": {"phase": phase},
    }
    return msgspec.convert(body, WireClaim)


def volume(
    name: str = "local-1", *, ref: dict[str, str] | None = None, pinned: str | None = None
) -> WireVolume:
    spec: dict[str, Any] = {}
    if ref is not None:
        spec["claimRef"] = ref
    if pinned is not None:
        expression = {"key": "kubernetes.io/hostname", "operator": "In", "values": [pinned]}
        spec["nodeAffinity"] = {"required": {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}}
    return msgspec.convert({"metadata": {"name": name}, "spec": spec}, WireVolume)


OURS = {"namespace": "default", "name": "data", "uid": UID}


@pytest.mark.parametrize(
    ("decision", "found", "pv", "expected"),
    [
        pytest.param(STATIC, claim(volume="local-1", complete=True), None, BOUND, id="static: bound to it"),
        pytest.param(
            STATIC, claim(volume="local-1"), None, WAITING, id="static: named, the controller not done"
        ),
        pytest.param(STATIC, claim(), volume(ref=OURS), WAITING, id="static: reserved, not bound yet"),
        pytest.param(
            STATIC,
            claim(volume="other", complete=True),
            None,
            Check(False, 'PVC "data" was bound to pv "other", not "local-1"'),
            id="static: bound to another volume",
        ),
        pytest.param(
            STATIC,
            claim(),
            volume(),
            Check(False, 'ClaimRef got reset for pv "local-1"'),
            id="static: reservation dropped",
        ),
        pytest.param(
            STATIC,
            claim(),
            volume(ref={"namespace": "default", "name": "data"}),
            Check(False, 'ClaimRef got reset for pv "local-1"'),
            id="static: reservation without the claim's uid",
        ),
        pytest.param(
            STATIC,
            claim(),
            volume(ref={"namespace": "team", "name": "x", "uid": "u2"}),
            Check(False, 'pv "local-1" was reserved for PVC "team/x"'),
            id="static: reserved for another claim",
        ),
        pytest.param(
            STATIC, claim(), None, Check(False, 'pv "local-1" was deleted'), id="static: volume gone"
        ),
        pytest.param(PROVISION, claim(selected=NODE), None, WAITING, id="provision: selected, not made yet"),
        pytest.param(
            PROVISION,
            claim(),
            None,
            Check(False, 'provisioning failed for PVC "data"'),
            id="provision: the provisioner removed selected-node",
        ),
        pytest.param(
            PROVISION,
            claim(selected="n1"),
            None,
            Check(False, 'provisioning failed for PVC "data"'),
            id="provision: selected for another node",
        ),
        pytest.param(
            PROVISION,
            claim(volume="pvc-1", complete=True, selected=NODE),
            volume("pvc-1", pinned=NODE),
            BOUND,
            id="provision: bound to a volume on the node",
        ),
        pytest.param(
            PROVISION,
            claim(volume="pvc-1", complete=True),
            volume("pvc-1"),
            BOUND,
            id="provision: bound to a volume every node reaches",
        ),
        pytest.param(
            PROVISION,
            claim(volume="pvc-1", complete=True, selected=NODE),
            None,
            WAITING,
            id="provision: bound to a volume not seen yet",
        ),
        pytest.param(
            PROVISION,
            claim(volume="pvc-1", complete=True, selected=NODE),
            volume("pvc-1", pinned="n1"),
            Check(False, 'pv "pvc-1" node affinity doesn\'t match node "n0"'),
            id="provision: bound to a volume on another node",
        ),
        pytest.param(
            PROVISION,
            claim(volume="pvc-1", selected=NODE),
            None,
            WAITING,
            id="provision: named, the controller not done",
        ),
    ],
)
def test_each_decision_is_bound_waiting_or_failed_as_kube_scheduler_says(
    decision: VolumeBinding, found: WireClaim, pv: WireVolume | None, expected: Check
) -> None:
    assert check(decision, NODE, found, pv, LABELS) == expected


@pytest.mark.parametrize(
    ("decision", "found", "expected"),
    [
        pytest.param(STATIC, claim(), "local-1", id="static, unbound: is the reservation still there"),
        pytest.param(STATIC, claim(volume="local-1", complete=True), "", id="static, bound: nothing"),
        pytest.param(PROVISION, claim(selected=NODE), "", id="provision, unbound: nothing"),
        pytest.param(
            PROVISION, claim(volume="pvc-1", complete=True), "pvc-1", id="provision, bound: its volume"
        ),
    ],
)
def test_the_volume_read_is_the_one_the_check_needs(
    decision: VolumeBinding, found: WireClaim, expected: str
) -> None:
    assert volume_to_read(decision, found) == expected


names = st.sampled_from(["", "n0", "n1", "local-1", "pvc-1"])


@given(
    static=st.booleans(),
    bound_to=names,
    complete=st.booleans(),
    selected=st.one_of(st.none(), names),
    pinned=st.one_of(st.none(), names),
    with_volume=st.booleans(),
)
def test_a_provisioned_claim_counts_as_bound_only_on_a_volume_that_admits_the_node(
    static: bool,
    bound_to: str,
    complete: bool,
    selected: str | None,
    pinned: str | None,
    with_volume: bool,
) -> None:
    decision = STATIC if static else PROVISION
    found = claim(volume=bound_to, complete=complete, selected=selected)
    pv = volume(bound_to or "local-1", ref=OURS, pinned=pinned) if with_volume else None
    verdict = check(decision, NODE, found, pv, LABELS)
    assert not (verdict.bound and verdict.problem)
    if verdict.bound:
        assert complete
        if static:
            assert bound_to == "local-1"
        else:
            assert bound_to
            assert pv is not None
            assert pinned in (None, NODE)


def test_the_binder_option_sets_the_wait_and_refuses_a_wait_of_nothing() -> None:
    assert parse_options({}).volume_bind_timeout == BIND_TIMEOUT_S == 120.0
    assert parse_options({"volume_bind_timeout": "30"}).volume_bind_timeout == 30.0
    with pytest.raises(ConfigError) as refused:
        parse_options({"volume_bind_timeout": "0"})
    assert (
        str(refused.value) == "service binder: option 'volume_bind_timeout': expected a number > 0.0, got '0'"
    )


def affine(term: dict[str, Any]) -> WireVolume:
    spec = {"nodeAffinity": {"required": {"nodeSelectorTerms": [term]}}}
    return msgspec.convert({"metadata": {"name": "pvc-1"}, "spec": spec}, WireVolume)


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


@pytest.mark.parametrize(
    ("term", "admits"),
    [
        (expression("zone", "In", "a", "b"), True),
        (expression("zone", "In", "c"), False),
        (expression("zone", "NotIn", "c"), True),
        (expression("rack", "NotIn", "c"), True),
        (expression("zone", "Exists"), True),
        (expression("rack", "Exists"), False),
        (expression("rack", "DoesNotExist"), True),
        (expression("disks", "Gt", "3"), True),
        (expression("disks", "Lt", "3"), False),
        (expression("zone", "Gt", "3"), False),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}, True),
        ({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [NODE]}]}, False),
    ],
)
def test_a_provisioned_volumes_node_affinity_is_read_with_kubernetes_operators(
    term: dict[str, Any], admits: bool
) -> None:
    labels = {**LABELS, "zone": "a", "disks": "4"}
    verdict = check(PROVISION, NODE, claim(volume="pvc-1", complete=True), affine(term), labels)
    assert verdict.bound is admits
    assert bool(verdict.problem) is not admits


def test_a_volume_whose_node_affinity_does_not_translate_is_a_problem_naming_the_field() -> None:
    bad = affine(expression("zone", "Near", "a"))
    verdict = check(PROVISION, NODE, claim(volume="pvc-1", complete=True), bad, LABELS)
    assert "spec.nodeAffinity.required.nodeSelectorTerms[0]" in verdict.problem
