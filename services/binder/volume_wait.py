"""Whether a pod's volumes are bound as placement decided: kube-scheduler's ``checkBindings``, the test its
volume binder repeats after its writes until every claim is bound, something went wrong, or its bind
timeout passes.

Called by `services.binder.volumes.VolumeSteps.prepare`, which reads the objects (the claim, then the
volume `volume_to_read` names, then the node's labels when that volume has a node affinity) and asks
`check` about each decision until every one is `BOUND`. Pure: no I/O.

For one decision (`shared.core.result.VolumeBinding`) on the pod's node:

- a static volume: bound once the claim's ``spec.volumeName`` is that volume and the volume controller
  has marked the bind complete (``pv.kubernetes.io/bind-completed``); failed when the claim was bound to
  another volume, or while it waits the volume is gone or its ``claimRef`` no longer names the claim (the
  volume controller dropped the reservation: kube-scheduler's "ClaimRef got reset");
- provisioning: bound once the claim is bound (as above) to a volume whose node affinity admits the node;
  failed when the bound volume's node affinity excludes the node, or, while it waits, the claim's
  ``volume.kubernetes.io/selected-node`` is no longer the node: the provisioner took it back because it
  could not provision there (kube-scheduler's "provisioning failed for PVC"). A bound volume not read yet
  (the claim names one the API server has not shown) is waited for, as kube-scheduler waits for it.

The problems are in kube-scheduler's words, which users search for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from shared.core.result import VolumeBinding
from shared.core.selectors import node_term_matches
from shared.errors import InvalidObject
from shared.kube.volumes import BIND_COMPLETED, SELECTED_NODE, WireClaim, WireVolume, volume_of

__all__ = ["BOUND", "WAITING", "Check", "check", "fully_bound", "needs_labels", "volume_to_read"]


class Check(NamedTuple):
    """One decision's state: `bound`, or `problem` (it never will be as decided), or neither (waiting)."""

    bound: bool
    problem: str = ""


BOUND = Check(bound=True)
WAITING = Check(bound=False)


def fully_bound(claim: WireClaim) -> bool:
    """The claim names its volume and the volume controller finished binding them (kube-scheduler's
    ``isPVCFullyBound``)."""
    return bool(claim.spec.volume_name) and BIND_COMPLETED in claim.metadata.annotations


def volume_to_read(decision: VolumeBinding, claim: WireClaim) -> str:
    """The volume `check` needs for this decision now ("": none): the chosen static volume while the
    claim is not bound to it (is our reservation still there?), the provisioned volume once the claim is
    bound (does its node affinity admit the node?)."""
    if decision.volume:
        return "" if fully_bound(claim) or claim.spec.volume_name else decision.volume
    return claim.spec.volume_name if fully_bound(claim) else ""


def needs_labels(volume: WireVolume | None) -> bool:
    """Whether `check` reads the node's labels for this volume (it has a required node affinity)."""
    affinity = volume.spec.node_affinity if volume is not None else None
    return affinity is not None and affinity.required is not None


def check(
    decision: VolumeBinding,
    node: str,
    claim: WireClaim,
    volume: WireVolume | None,
    labels: Mapping[str, str],
) -> Check:
    """The decision's state, from the claim and the volume `volume_to_read` named (None: not found, or
    none named) and the node's labels (with `shared.kube.keys.NODE_NAME_LABEL`, as translation gives
    them)."""
    name = claim.metadata.name
    bound_to = claim.spec.volume_name
    if decision.volume:
        if bound_to and bound_to != decision.volume:
            return Check(False, f'PVC "{name}" was bound to pv "{bound_to}", not "{decision.volume}"')
        if bound_to:
            return BOUND if fully_bound(claim) else WAITING
        if volume is None:
            return Check(False, f'pv "{decision.volume}" was deleted')
        ref = volume.spec.claim_ref
        if ref is None or not ref.uid:
            return Check(False, f'ClaimRef got reset for pv "{decision.volume}"')
        if (ref.namespace, ref.name, ref.uid) != (claim.metadata.namespace, name, claim.metadata.uid):
            return Check(False, f'pv "{decision.volume}" was reserved for PVC "{ref.namespace}/{ref.name}"')
        return WAITING
    if fully_bound(claim):
        if volume is None:
            return WAITING
        return _admits(volume, node, labels)
    if claim.metadata.annotations.get(SELECTED_NODE) != node:
        return Check(False, f'provisioning failed for PVC "{name}"')
    return WAITING


def _admits(volume: WireVolume, node: str, labels: Mapping[str, str]) -> Check:
    try:
        terms = volume_of(volume).node_affinity
    except InvalidObject as exc:
        return Check(False, str(exc))
    if not terms or any(node_term_matches(term, labels) for term in terms):
        return BOUND
    return Check(False, f'pv "{volume.metadata.name}" node affinity doesn\'t match node "{node}"')
