"""The binder's DRA step (``dynamicresources``, a `services.binder.steps.BindStep`): before a pod's binding
(and after the volume step), write what placement decided for its ResourceClaims (`Binding.claims`,
`shared.core.dra`) to the claims' status, and undo it if the binding is refused.

Run by `services.binder.steps.BindSteps` for a binding with claims (`ClaimSteps.applies`; an ordinary
pod's bind makes no call here). Per claim, in the decision's order, as kube-scheduler's DynamicResources
PreBind and KAI's binder write it:

- a KEP-5004 claim (`ClaimAllocation.extended`) is made first when it does not exist: named
  ``<pod>-extended-resources``, owned by the pod (so it goes with it), annotated
  ``resource.kubernetes.io/extended-resource-claim``, with the requests decided;
- the claim is read; unless it is already allocated, its ``status.allocation`` is set to the devices
  decided and a node selector for the pod's node (``metadata.name In [node]``; none for cluster-wide
  devices); the pod is added to ``status.reservedFor`` (resource pods, its name and uid); both in one
  status update carrying the resourceVersion read, so two binders never allocate one claim twice. A claim
  already allocated for another node, one decided as allocated that no longer is, or one whose
  reservedFor is full (256) refuses the pod's bind (`ClusterRefused`): the cluster moved since the
  decision.

All of it is idempotent, so a bind the recovery scan repeats finds it done. If a claim's step fails, what
this call changed is undone before the refusal is raised; if a later step fails or the pod's binding is
refused, the runner calls `undo`. Either way in reverse order: the pod taken out of reservedFor, the
allocation removed when this call made it and no other user remains, a claim this call made deleted; an
undo that fails is logged and counted, never raised (the refusal stands).

Releasing a claim no pod holds any more (reservedFor emptied of pods that are gone, the allocation then
removed) is kube-controller-manager's resourceclaim controller's work in Kubernetes, as it is for
kube-scheduler and KAI; Kairos leaves it there (kubesim plays it: `tools.kubesim.dra`).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from services.binder.cluster_client import ClusterRefused
from shared.backoff import Backoff
from shared.bus.middleware import Counters
from shared.contracts.messages import Binding
from shared.core.result import ClaimAllocation
from shared.kubeapi.client import ApiError, Kube
from shared.model.dra import RESERVED_FOR_MAX

__all__ = ["EXTENDED_CLAIM_ANNOTATION", "ClaimDone", "ClaimSteps"]

log = logging.getLogger("kairos.binder.claims")

EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
_NOT_FOUND = 404


@dataclass(frozen=True)
class ClaimDone:
    """One change the step made, to be undone if the pod's binding is refused."""

    claim: str
    namespace: str
    pod_uid: str
    pod_name: str
    allocated: bool = False
    """This call set the allocation (removed again on undo when no other user remains)."""
    created: bool = False
    """This call made the claim (deleted on undo)."""


def _claim_path(namespace: str, name: str) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


def _node_selector(node: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    }


def _allocated_node(allocation: dict[str, Any]) -> str:
    """The one node an allocation is for ("" when it is not a single node's)."""
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    if len(terms) != 1:
        return ""
    fields = terms[0].get("matchFields") or []
    if (
        len(fields) == 1
        and fields[0].get("key") == "metadata.name"
        and len(fields[0].get("values") or []) == 1
    ):
        return str(fields[0]["values"][0])
    return ""


@dataclass
class ClaimSteps:
    """The ``dynamicresources`` bind step (`services.binder.steps.BindStep`)."""

    name: ClassVar[str] = "dynamicresources"
    kube: Kube
    counters: Counters = field(default_factory=Counters)
    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)

    def applies(self, binding: Binding) -> bool:
        """A binding with resource claims (or KEP-5004 extended resources) placement allocated."""
        return bool(binding.claims)

    async def prepare(self, binding: Binding) -> list[ClaimDone]:
        """Carry out the pod's claim decisions; on a refusal, undo what was done and raise it."""
        done: list[ClaimDone] = []
        try:
            for decision in binding.claims:
                done += await self._one(binding, decision)
        except ApiError as exc:
            await self.undo(done)
            raise ClusterRefused("bind", binding.pod, f"resource claims: {exc}") from exc
        except Exception:
            await self.undo(done)
            raise
        return done

    async def undo(self, done: list[ClaimDone]) -> None:
        """Take back what `prepare` changed, newest first; failures are logged and counted."""
        for change in reversed(done):
            try:
                await self._release(change)
                self.counters["claim_steps_undone"] += 1
            except Exception as exc:  # noqa: BLE001 -- an undo that fails must not hide the refusal
                self.counters["claim_undo_errors"] += 1
                log.warning("could not undo claim %s/%s: %s", change.namespace, change.claim, exc)

    # --- the steps ----------------------------------------------------------------------------------------
    async def _one(self, binding: Binding, decision: ClaimAllocation) -> list[ClaimDone]:
        namespace, name = binding.namespace, decision.claim
        path = _claim_path(namespace, name)
        out: list[ClaimDone] = []
        created = False
        if decision.extended:
            created = await self._make(binding, decision)
            if created:
                out.append(ClaimDone(name, namespace, binding.uid, binding.name, created=True))
        claim = await self._get(f"get resourceclaim {namespace}/{name}", path)
        status = claim.setdefault("status", {})
        allocation = status.get("allocation")
        allocated_here = False
        if allocation:
            node = _allocated_node(allocation)
            if node and node != binding.node:
                raise ClusterRefused(
                    "bind", binding.pod, f"resourceclaim {name} is allocated for node {node}"
                )
        elif not decision.devices:
            raise ClusterRefused("bind", binding.pod, f"resourceclaim {name} is no longer allocated")
        else:
            status["allocation"] = {
                "devices": {
                    "results": [
                        {
                            "request": r.request,
                            "driver": r.driver,
                            "pool": r.pool,
                            "device": r.device,
                            **({"adminAccess": True} if r.admin_access else {}),
                        }
                        for r in decision.devices
                    ]
                },
                **({"nodeSelector": _node_selector(decision.node)} if decision.node else {}),
            }
            allocated_here = True
        users: list[dict[str, Any]] = status.setdefault("reservedFor", [])
        mine = any(u.get("uid") == binding.uid and u.get("name") == binding.name for u in users)
        if mine and not allocated_here:
            return out
        if not mine:
            if len(users) >= RESERVED_FOR_MAX:
                raise ClusterRefused(
                    "bind", binding.pod, f"resourceclaim {name} is in use by {len(users)} pods"
                )
            users.append({"resource": "pods", "name": binding.name, "uid": binding.uid})
        await self._send(f"reserve resourceclaim {namespace}/{name}", "PUT", path + "/status", claim)
        self.counters["claims_reserved"] += 1
        if allocated_here:
            self.counters["claims_allocated"] += 1
        if created:
            out[-1] = ClaimDone(
                name, namespace, binding.uid, binding.name, allocated=allocated_here, created=True
            )
        else:
            out.append(ClaimDone(name, namespace, binding.uid, binding.name, allocated=allocated_here))
        return out

    async def _make(self, binding: Binding, decision: ClaimAllocation) -> bool:
        """Make a KEP-5004 claim unless it exists; True when this call made it."""
        namespace, name = binding.namespace, decision.claim
        try:
            await self._get(f"get resourceclaim {namespace}/{name}", _claim_path(namespace, name))
        except ApiError as exc:
            if exc.status != _NOT_FOUND:
                raise
        else:
            return False
        owner = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": binding.name,
            "uid": binding.uid,
            "controller": True,
        }
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {EXTENDED_CLAIM_ANNOTATION: "true"},
                **({"ownerReferences": [owner]} if binding.uid else {}),
            },
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": r.name,
                            "exactly": {
                                "deviceClassName": r.device_class,
                                "allocationMode": "ExactCount",
                                "count": r.count,
                            },
                        }
                        for r in decision.extended
                    ]
                }
            },
        }
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
        await self._send(f"create resourceclaim {namespace}/{name}", "POST", path, body)
        self.counters["claims_created"] += 1
        return True

    async def _release(self, change: ClaimDone) -> None:
        path = _claim_path(change.namespace, change.claim)
        what = f"resourceclaim {change.namespace}/{change.claim}"
        if change.created:
            try:
                await self._send(f"delete {what}", "DELETE", path, None)
            except ApiError as exc:
                if exc.status != _NOT_FOUND:
                    raise
            return
        try:
            claim = await self._get(f"get {what}", path)
        except ApiError as exc:
            if exc.status == _NOT_FOUND:
                return
            raise
        status = claim.setdefault("status", {})
        users = status.get("reservedFor") or []
        left = [u for u in users if not (u.get("uid") == change.pod_uid and u.get("name") == change.pod_name)]
        if len(left) == len(users) and not change.allocated:
            return
        status["reservedFor"] = left
        if change.allocated and not left:
            status.pop("allocation", None)
        if not left:
            status.pop("reservedFor", None)
        await self._send(f"release {what}", "PUT", path + "/status", claim)

    # --- calls --------------------------------------------------------------------------------------------
    async def _get(self, what: str, path: str) -> dict[str, Any]:
        body = await self.kube.request_with_retries(what, "GET", path, backoff=self.backoff, rng=self.rng)
        obj: dict[str, Any] = msgspec.json.decode(body)
        return obj

    async def _send(self, what: str, method: str, path: str, body: Any) -> None:
        await self.kube.request_with_retries(what, method, path, body, backoff=self.backoff, rng=self.rng)
