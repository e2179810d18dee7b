"""Dynamic Resource Allocation in the simulated cluster: kube-controller-manager's resourceclaim
controller, a simulated NVIDIA DRA driver, a minimal ComputeDomain controller, and the kubelet's wait for
a pod's claims.

- **resourceclaim controller** (`DraController.run_once`, from `tools.kubesim.controllers.Controllers`):
  for each template entry of a pod's ``spec.resourceClaims`` without a claim yet, a claim
  ``<pod>-<entry>-<suffix>`` made from the template (owned by the pod, annotated
  ``resource.kubernetes.io/pod-claim-name``) and recorded in the pod's ``status.resourceClaimStatuses``;
  a claim's ``status.reservedFor`` entries for pods that no longer exist (or have finished) removed, and
  the allocation with them when no user remains; a claim made for a pod deleted with it.
- **GPU driver** (`GPU_DRIVER`): one ResourceSlice per GPU node (``<node>-gpu.nvidia.com``, pool the
  node's name) with a device ``gpu-<i>`` per ``nvidia.com/gpu`` of its allocatable, attributes ``uuid``,
  ``productName`` (the node's ``nvidia.com/gpu.product`` label), ``index``, capacity ``memory`` (its
  ``nvidia.com/gpu.memory`` label, MiB), and the DeviceClass ``gpu.nvidia.com``; every GPU node also
  publishes ``compute-domain.nvidia.com``'s IMEX channel ``channel-0`` with the DeviceClass
  ``compute-domain-default-channel.nvidia.com`` (NVIDIA's k8s-dra-driver-gpu names).
- **ComputeDomain** (resource.nvidia.com/v1beta1, served as a built-in here): each one gets the
  ResourceClaimTemplate its ``spec.channel.resourceClaimTemplate.name`` names, asking for one channel, so
  KAI's docs/dra example applies unchanged.
- **Kubelet** (`unprepared`, from `tools.kubesim.kubelet.Kubelet.start`): a pod whose claims are not all
  made, allocated and reserved for it stays Pending, ``ContainerCreating``.

Pure: no I/O (objects change through the cluster's store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.kubesim.errors import ApiError
from tools.kubesim.objects import clone, random_suffix
from tools.kubesim.store import Change

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = ["CHANNEL_CLASS", "CHANNEL_DRIVER", "GPU_DRIVER", "DraController", "has_claims", "unprepared"]

Obj = dict[str, Any]

GROUP = "resource.k8s.io"
CLAIMS = f"{GROUP}/resourceclaims"
TEMPLATES = f"{GROUP}/resourceclaimtemplates"
SLICES = f"{GROUP}/resourceslices"
CLASSES = f"{GROUP}/deviceclasses"
COMPUTE_DOMAINS = "resource.nvidia.com/computedomains"
GPU_DRIVER = "gpu.nvidia.com"
CHANNEL_DRIVER = "compute-domain.nvidia.com"
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
_DONE = frozenset({"Succeeded", "Failed"})


def has_claims(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def claim_names(pod: Obj) -> list[str | None]:
    """The claims a pod's entries use (None: a template's claim not made yet)."""
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        if isinstance(s, dict)
    }
    out: list[str | None] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or ():
        if not isinstance(entry, dict):
            continue
        if entry.get("resourceClaimName"):
            out.append(str(entry["resourceClaimName"]))
        else:
            out.append(made.get(entry.get("name")))
    return out


def unprepared(cluster: Cluster, pod: Obj) -> list[str]:
    """The pod's claims not made, not allocated or not reserved for it (the kubelet waits for them)."""
    if CLAIMS not in cluster.store.storages:
        return []
    ns = pod["metadata"].get("namespace", "")
    uid = pod["metadata"].get("uid", "")
    storage = cluster.store.storage(CLAIMS)
    out = []
    for i, name in enumerate(claim_names(pod)):
        claim = storage.get(ns, name) if name else None
        status = (claim or {}).get("status") or {}
        users = {u.get("uid") for u in status.get("reservedFor") or () if isinstance(u, dict)}
        if claim is None or not status.get("allocation") or uid not in users:
            out.append(name or f"#{i}")
    return out


def _class(name: str, driver: str, extra: str = "") -> Obj:
    expression = f'device.driver == "{driver}"' + extra
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


class DraController:
    """The resourceclaim controller, the simulated drivers and the ComputeDomain controller of a cluster."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.dirty = True
        store = cluster.store
        for key in ("pods", "nodes", CLAIMS, TEMPLATES, COMPUTE_DOMAINS):
            if key in store.storages:
                store.storage(key).listeners.append(self._changed)

    def _changed(self, change: Change) -> None:  # noqa: ARG002 -- a store listener's signature
        self.dirty = True

    def run_once(self) -> bool:
        if not self.dirty or CLAIMS not in self.cluster.store.storages:
            return False
        self.dirty = False
        progressed = self._driver()
        progressed = self._compute_domains() or progressed
        progressed = self._claims_from_templates() or progressed
        return self._release() or progressed

    # --- the drivers ----------------------------------------------------------------------------------------
    def _driver(self) -> bool:
        store = self.cluster.store
        changed = False
        for name, obj in (
            (GPU_DRIVER, _class(GPU_DRIVER, GPU_DRIVER)),
            (CHANNEL_CLASS, _class(CHANNEL_CLASS, CHANNEL_DRIVER)),
        ):
            if store.storage(CLASSES).get("", name) is None:
                self._create(CLASSES, None, obj)
                changed = True
        for node in list(store.storage("nodes").iter()):
            md = node["metadata"]
            alloc = (node.get("status") or {}).get("allocatable") or {}
            try:
                gpus = int(str(alloc.get("nvidia.com/gpu", "0")))
            except ValueError:
                gpus = 0
            if gpus <= 0:
                continue
            labels = md.get("labels") or {}
            node_name = md["name"]
            name = f"{node_name}-{GPU_DRIVER}"
            if store.storage(SLICES).get("", name) is None:
                memory = str(labels.get("nvidia.com/gpu.memory", "81920"))
                devices = [
                    {
                        "name": f"gpu-{i}",
                        "attributes": {
                            "uuid": {"string": f"GPU-{node_name}-{i}"},
                            "productName": {
                                "string": str(labels.get("nvidia.com/gpu.product", "NVIDIA-H100"))
                            },
                            "index": {"int": i},
                        },
                        "capacity": {"memory": {"value": f"{memory}Mi" if memory.isdigit() else "80Gi"}},
                    }
                    for i in range(gpus)
                ]
                self._create(SLICES, None, self._slice(name, GPU_DRIVER, node_name, devices))
                changed = True
            channel = f"{node_name}-{CHANNEL_DRIVER}"
            if store.storage(SLICES).get("", channel) is None:
                devices = [
                    {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}}
                ]
                self._create(SLICES, None, self._slice(channel, CHANNEL_DRIVER, node_name, devices))
                changed = True
        return changed

    @staticmethod
    def _slice(name: str, driver: str, node: str, devices: list[Obj]) -> Obj:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": driver,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "nodeName": node,
                "devices": devices,
            },
        }

    # --- ComputeDomain ----------------------------------------------------------------------------------------
    def _compute_domains(self) -> bool:
        store = self.cluster.store
        if COMPUTE_DOMAINS not in store.storages:
            return False
        changed = False
        for domain in list(store.storage(COMPUTE_DOMAINS).iter()):
            md = domain["metadata"]
            ns = md.get("namespace", "")
            template = (
                ((domain.get("spec") or {}).get("channel") or {}).get("resourceClaimTemplate") or {}
            ).get("name")
            if not template or store.storage(TEMPLATES).get(ns, template) is not None:
                continue
            owner = {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomain",
                "name": md["name"],
                "uid": md.get("uid", ""),
            }
            obj = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": template, "namespace": ns, "ownerReferences": [owner]},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "channel", "exactly": {"deviceClassName": CHANNEL_CLASS}}],
                            "config": [
                                {
                                    "requests": ["channel"],
                                    "opaque": {
                                        "driver": CHANNEL_DRIVER,
                                        "parameters": {
                                            "apiVersion": "resource.nvidia.com/v1beta1",
                                            "kind": "ComputeDomainChannelConfig",
                                            "domainID": md.get("uid", ""),
                                        },
                                    },
                                }
                            ],
                        }
                    }
                },
            }
            self._create(TEMPLATES, ns, obj)
            changed = True
        return changed

    # --- the resourceclaim controller ---------------------------------------------------------------------
    def _claims_from_templates(self) -> bool:
        store = self.cluster.store
        changed = False
        for pod in list(store.storage("pods").iter()):
            if not has_claims(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            md = pod["metadata"]
            ns = md.get("namespace", "")
            statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or ())
            have = {s.get("name") for s in statuses if isinstance(s, dict)}
            added = False
            for entry in pod["spec"]["resourceClaims"]:
                template_name = entry.get("resourceClaimTemplateName") if isinstance(entry, dict) else None
                if not template_name or entry.get("name") in have:
                    continue
                template = store.storage(TEMPLATES).get(ns, template_name)
                if template is None:
                    continue
                name = f"{md['name']}-{entry.get('name', '')}-{random_suffix(self.cluster.rng)}"
                owner = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": md["name"],
                    "uid": md.get("uid", ""),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
                claim = {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "annotations": {POD_CLAIM_ANNOTATION: str(entry.get("name", ""))},
                        "ownerReferences": [owner],
                    },
                    "spec": clone((template.get("spec") or {}).get("spec") or {}),
                }
                if self._create(CLAIMS, ns, claim) is None:
                    continue
                statuses.append({"name": entry.get("name"), "resourceClaimName": name})
                added = True
            if added:
                updated = clone(pod)
                updated.setdefault("status", {})["resourceClaimStatuses"] = statuses
                store.put("pods", updated)
                changed = True
        return changed

    def _release(self) -> bool:
        store = self.cluster.store
        live = {
            p["metadata"].get("uid")
            for p in store.storage("pods").iter()
            if (p.get("status") or {}).get("phase") not in _DONE
        }
        known = {p["metadata"].get("uid") for p in store.storage("pods").iter()}
        changed = False
        for claim in list(store.storage(CLAIMS).iter()):
            md = claim["metadata"]
            owners = [o for o in md.get("ownerReferences") or () if o.get("kind") == "Pod"]
            if owners and all(o.get("uid") not in known for o in owners):
                store.remove(CLAIMS, md.get("namespace", ""), md["name"])
                changed = True
                continue
            status = claim.get("status") or {}
            users = status.get("reservedFor") or []
            left = [u for u in users if u.get("resource") != "pods" or u.get("uid") in live]
            if len(left) == len(users):
                continue
            updated = clone(claim)
            updated["status"]["reservedFor"] = left
            if not left:
                updated["status"].pop("reservedFor", None)
                updated["status"].pop("allocation", None)
            store.put(CLAIMS, updated)
            changed = True
        return changed

    def _create(self, key: str, namespace: str | None, obj: Obj) -> Obj | None:
        try:
            return self.cluster.create(self.cluster.type_of(key), namespace, obj)
        except ApiError:
            return None
