"""The binder's volume step (``volumebinding``, a `services.binder.steps.BindStep`, the first by default):
before a pod's binding, carry out what placement decided for its WaitForFirstConsumer claims
(`Binding.volumes`, `shared.core.volumes`), and undo it if the binding is refused.

Run by `services.binder.steps.BindSteps` for a binding with volume decisions (`VolumeSteps.applies`; an
ordinary pod's bind makes no call here). Per claim, in the decision's order, as kube-scheduler's volume
binder does it (``bindAPIUpdate``):

- a static volume: the volume is read and, unless it is already reserved for this claim, its ``claimRef``
  set to the claim (with ``pv.kubernetes.io/bound-by-controller``) in an update carrying the resourceVersion
  read, so two binders never reserve one volume; kube-controller-manager's volume controller then binds
  the claim to it (kube-scheduler, too, writes only the volume and leaves the claim to the controller, whose
  ``spec.volumeName`` cannot be taken back). A volume reserved for another claim, or a claim bound to
  another volume, refuses the pod's bind (`ClusterRefused`): the cluster moved since the decision;
- provisioning: the claim gets ``volume.kubernetes.io/selected-node`` = the pod's node (a merge patch),
  which the claim's provisioner acts on; a claim already selected for another node refuses the bind.

Both are idempotent, so a bind the recovery scan repeats finds them done. If a claim's step fails, what
this call changed is undone before the refusal is raised; if a later step fails or the pod's binding is
refused, the runner calls `undo`. Either way in reverse order: the volume's ``claimRef`` removed while it
still names the claim's uid, the annotation removed; an undo that fails is logged and counted, never raised
(the refusal stands). A binding without an answer keeps them: the recovery scan binds the pod later. Unlike kube-scheduler, the binder does not wait for the volume controller or the
provisioner to finish before binding the pod: the kubelet does not start a pod whose claims are unbound.
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
from shared.core.result import VolumeBinding
from shared.kube.volumes import BOUND_BY_CONTROLLER, SELECTED_NODE
from shared.kubeapi.client import JSON, MERGE_PATCH, ApiError, Kube

__all__ = ["Done", "VolumeSteps"]

log = logging.getLogger("kairos.binder.volumes")


@dataclass(frozen=True)
class Done:
    """One change the step made, to be undone if the pod's binding is refused."""

    kind: str
    """"volume" (a claimRef set on `name`) or "claim" (the selected-node annotation set on it)."""
    name: str
    namespace: str = ""
    claim_uid: str = ""


def _volume_path(name: str) -> str:
    return f"/api/v1/persistentvolumes/{name}"


def _claim_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}"


@dataclass
class VolumeSteps:
    """The ``volumebinding`` bind step (`services.binder.steps.BindStep`)."""

    name: ClassVar[str] = "volumebinding"
    kube: Kube
    counters: Counters = field(default_factory=Counters)
    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)

    def applies(self, binding: Binding) -> bool:
        """A binding with volume decisions (WaitForFirstConsumer claims placement decided)."""
        return bool(binding.volumes)

    async def prepare(self, binding: Binding) -> list[Done]:
        """Carry out the pod's volume decisions; on a refusal, undo what was done and raise it."""
        done: list[Done] = []
        try:
            for decision in binding.volumes:
                change = await self._one(binding, decision)
                if change is not None:
                    done.append(change)
        except ApiError as exc:
            await self.undo(done)
            raise ClusterRefused("bind", binding.pod, f"volumes: {exc}") from exc
        except Exception:
            await self.undo(done)
            raise
        return done

    async def undo(self, done: list[Done]) -> None:
        """Take back what `prepare` changed, newest first; failures are logged and counted."""
        for change in reversed(done):
            try:
                if change.kind == "volume":
                    await self._release_volume(change)
                else:
                    await self._unselect(change)
                self.counters["volume_steps_undone"] += 1
            except Exception as exc:  # noqa: BLE001 -- an undo that fails must not hide the refusal
                self.counters["volume_undo_errors"] += 1
                log.warning("could not undo %s %s: %s", change.kind, change.name, exc)

    # --- the steps ----------------------------------------------------------------------------------------
    async def _one(self, binding: Binding, decision: VolumeBinding) -> Done | None:
        namespace = binding.namespace
        claim = await self._get(
            f"get claim {namespace}/{decision.claim}", _claim_path(namespace, decision.claim)
        )
        meta = claim.get("metadata", {})
        uid = str(meta.get("uid", ""))
        spec = claim.get("spec", {})
        bound_to = spec.get("volumeName") or ""
        if decision.volume:
            if bound_to and bound_to != decision.volume:
                raise ClusterRefused(
                    "bind",
                    binding.pod,
                    f"claim {decision.claim} is bound to {bound_to}, not {decision.volume}",
                )
            return await self._reserve_volume(binding, decision, uid)
        if bound_to:
            return None  # provisioned and bound since the decision: nothing left to ask for
        selected = (meta.get("annotations") or {}).get(SELECTED_NODE)
        if selected == binding.node:
            return None
        if selected:
            raise ClusterRefused(
                "bind", binding.pod, f"claim {decision.claim} is being provisioned for node {selected}"
            )
        patch = {"metadata": {"annotations": {SELECTED_NODE: binding.node}}}
        await self._send(
            f"select node for claim {namespace}/{decision.claim}",
            "PATCH",
            _claim_path(namespace, decision.claim),
            patch,
            MERGE_PATCH,
        )
        self.counters["volume_claims_selected"] += 1
        return Done("claim", decision.claim, namespace)

    async def _reserve_volume(self, binding: Binding, decision: VolumeBinding, uid: str) -> Done | None:
        name = decision.volume
        pv = await self._get(f"get volume {name}", _volume_path(name))
        spec = pv.setdefault("spec", {})
        ref = spec.get("claimRef") or {}
        if ref.get("name"):
            ours = ref.get("name") == decision.claim and ref.get("namespace") == binding.namespace
            if ours and (not ref.get("uid") or ref.get("uid") == uid):
                return None
            held = f"{ref.get('namespace', '')}/{ref.get('name', '')}"
            raise ClusterRefused("bind", binding.pod, f"volume {name} is reserved for claim {held}")
        spec["claimRef"] = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": binding.namespace,
            "name": decision.claim,
            "uid": uid,
        }
        annotations = pv.setdefault("metadata", {}).setdefault("annotations", {})
        annotations[BOUND_BY_CONTROLLER] = "yes"
        await self._send(f"reserve volume {name}", "PUT", _volume_path(name), pv)
        self.counters["volume_claims_reserved"] += 1
        return Done("volume", name, binding.namespace, uid)

    async def _release_volume(self, change: Done) -> None:
        pv = await self._get(f"get volume {change.name}", _volume_path(change.name))
        spec = pv.get("spec", {})
        ref = spec.get("claimRef") or {}
        if not ref or (change.claim_uid and ref.get("uid") != change.claim_uid):
            return
        spec.pop("claimRef", None)
        (pv.get("metadata", {}).get("annotations") or {}).pop(BOUND_BY_CONTROLLER, None)
        await self._send(f"release volume {change.name}", "PUT", _volume_path(change.name), pv)

    async def _unselect(self, change: Done) -> None:
        patch = {"metadata": {"annotations": {SELECTED_NODE: None}}}
        path = _claim_path(change.namespace, change.name)
        await self._send(
            f"unselect claim {change.namespace}/{change.name}", "PATCH", path, patch, MERGE_PATCH
        )

    # --- calls --------------------------------------------------------------------------------------------
    async def _get(self, what: str, path: str) -> dict[str, Any]:
        body = await self.kube.request_with_retries(what, "GET", path, backoff=self.backoff, rng=self.rng)
        obj: dict[str, Any] = msgspec.json.decode(body)
        return obj

    async def _send(self, what: str, method: str, path: str, body: Any, content_type: str = JSON) -> None:
        await self.kube.request_with_retries(
            what, method, path, body, backoff=self.backoff, rng=self.rng, content_type=content_type
        )
