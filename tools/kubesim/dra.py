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

The controllers work per change, as kube-controller-manager's do: the store's listeners queue the nodes,
ComputeDomains, pods and claims a write concerns and keep the indexes that replace scans (`DraController`);
`resync` queues everything, and after a settled cluster it finds nothing to do.

Pure: no I/O (objects change through the cluster's store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.kubesim.errors import ApiError
from tools.kubesim.objects import clone, controller_ref, random_suffix
from tools.kubesim.store import Change, Key, unindex

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = [
    "CHANNEL_CLASS",
    "CHANNEL_DRIVER",
    "GPU_DRIVER",
    "DraController",
    "channel_slice",
    "device_class",
    "gpu_slice",
    "has_claims",
    "resource_slice",
    "unprepared",
]

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


def device_class(name: str, driver: str, extra: str = "") -> Obj:
    """A DeviceClass that selects a driver's devices (``extra``: more of the CEL expression, appended)."""
    expression = f'device.driver == "{driver}"' + extra
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def resource_slice(name: str, driver: str, node: str, devices: list[Obj]) -> Obj:
    """The one ResourceSlice of a driver's pool on a node (the pool is named after the node)."""
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


def gpu_slice(node: str, gpus: int, product: str, memory: str) -> Obj:
    """The GPU driver's slice of a node: ``gpus`` devices of one product, each of ``memory`` (a quantity)."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "uuid": {"string": f"GPU-{node}-{i}"},
                "productName": {"string": product},
                "index": {"int": i},
            },
            "capacity": {"memory": {"value": memory}},
        }
        for i in range(gpus)
    ]
    return resource_slice(f"{node}-{GPU_DRIVER}", GPU_DRIVER, node, devices)


def channel_slice(node: str) -> Obj:
    """The ComputeDomain driver's slice of a GPU node: its one IMEX channel."""
    devices = [{"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}}]
    return resource_slice(f"{node}-{CHANNEL_DRIVER}", CHANNEL_DRIVER, node, devices)


class DraController:
    """The resourceclaim controller, the simulated drivers and the ComputeDomain controller of a cluster.

    Incremental, as kube-controller-manager's controllers are: the store's listeners queue what a change
    may concern (a node for the driver, a ComputeDomain, a pod with claims, a claim), and `run_once` works
    through the queues only. Indexes kept from the changes stand in for the scans: which pods exist and
    which have finished, the claims each pod is among the users of, the pods waiting for a template.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.nodes: dict[str, None] = {}
        """Nodes whose slices to publish (when missing) at the next `run_once`."""
        self.domains: dict[Key, None] = {}
        self.pods: dict[Key, None] = {}
        """Pods whose template entries to make claims for."""
        self.claims: dict[Key, None] = {}
        """Claims whose owners and users to check."""
        self.classes_due = True
        """Whether the driver's DeviceClasses may be missing (at start, and after one is deleted)."""
        self._retry: dict[Key, None] = {}
        """Pods a claim could not be made for: tried again after the next change of anything."""
        self._live: dict[str, bool] = {}
        """Pod uid -> whether the pod has not finished, for every pod."""
        self._users: dict[Key, set[str]] = {}
        """Claim -> uids of the pods its ``status.reservedFor`` names."""
        self._reserving: dict[str, set[Key]] = {}
        """Pod uid -> claims whose ``status.reservedFor`` names it."""
        self._awaiting: dict[Key, set[Key]] = {}
        """(namespace, template) -> pods with an entry naming that template, which does not exist yet."""
        store = cluster.store
        for key, listener in (
            ("pods", self._pod_changed),
            ("nodes", self._node_changed),
            (CLAIMS, self._claim_changed),
            (TEMPLATES, self._template_changed),
            (COMPUTE_DOMAINS, self._domain_changed),
            (SLICES, self._slice_changed),
            (CLASSES, self._class_changed),
        ):
            if key in store.storages:
                store.storage(key).listeners.append(listener)
                # Start-up: what the store holds already is taken in as if it had just been written.
                for obj in list(store.storage(key).iter()):
                    listener(Change("ADDED", obj, None, 0))

    # --- the queues and indexes, from the store's changes ----------------------------------------------------
    def _pod_changed(self, change: Change) -> None:
        pod = change.obj
        md = pod["metadata"]
        uid = str(md.get("uid", ""))
        key = (md.get("namespace", ""), md["name"])
        self._touched()
        if change.type == "DELETED":
            self._live.pop(uid, None)
            self.claims.update(dict.fromkeys(self._reserving.get(uid, ())))
            for storage, ns, name in self.cluster.store.dependents.get(uid, ()):
                if storage == CLAIMS:
                    self.claims[ns, name] = None
            return
        live = (pod.get("status") or {}).get("phase") not in _DONE
        if self._live.get(uid, True) and not live:
            self.claims.update(dict.fromkeys(self._reserving.get(uid, ())))
        self._live[uid] = live
        if has_claims(pod) and not md.get("deletionTimestamp"):
            self.pods[key] = None

    def _claim_changed(self, change: Change) -> None:
        md = change.obj["metadata"]
        key = (md.get("namespace", ""), md["name"])
        self._touched()
        for uid in self._users.pop(key, ()):
            unindex(self._reserving, uid, key)
        if change.type == "DELETED":
            return
        users = {
            str(u.get("uid"))
            for u in (change.obj.get("status") or {}).get("reservedFor") or ()
            if isinstance(u, dict) and u.get("resource") == "pods"
        }
        if users:
            self._users[key] = users
            for uid in users:
                self._reserving.setdefault(uid, set()).add(key)
        self.claims[key] = None

    def _template_changed(self, change: Change) -> None:
        md = change.obj["metadata"]
        ns = md.get("namespace", "")
        self._touched()
        if change.type != "DELETED":
            self.pods.update(dict.fromkeys(self._awaiting.pop((ns, md["name"]), ())))
        elif COMPUTE_DOMAINS in self.cluster.store.storages:
            # A domain's template deleted: the ComputeDomain controller makes it again.
            for domain in self.cluster.store.storage(COMPUTE_DOMAINS).iter(ns):
                self.domains[ns, domain["metadata"]["name"]] = None

    def _domain_changed(self, change: Change) -> None:
        md = change.obj["metadata"]
        self._touched()
        if change.type != "DELETED":
            self.domains[md.get("namespace", ""), md["name"]] = None

    def _node_changed(self, change: Change) -> None:
        self._touched()
        if change.type != "DELETED":
            self.nodes[change.obj["metadata"]["name"]] = None

    def _slice_changed(self, change: Change) -> None:
        # A slice of the driver's deleted: the driver publishes it again.
        node = (change.obj.get("spec") or {}).get("nodeName")
        if change.type == "DELETED" and node:
            self._touched()
            self.nodes[str(node)] = None

    def _class_changed(self, change: Change) -> None:
        if change.type == "DELETED":
            self._touched()
            self.classes_due = True

    def _touched(self) -> None:
        """Something changed: the pods a claim could not be made for are tried again."""
        if self._retry:
            self.pods.update(self._retry)
            self._retry = {}

    # --- the work ---------------------------------------------------------------------------------------------
    def resync(self) -> None:
        """Queue every node, ComputeDomain, pod with claims and claim, as a controller's periodic resync does
        (the store's listeners queue each change already: after `run_once` a resync finds nothing to do)."""
        store = self.cluster.store
        self.classes_due = True
        self.nodes.update(dict.fromkeys(n["metadata"]["name"] for n in store.storage("nodes").iter()))
        for key, queue in (("pods", self.pods), (CLAIMS, self.claims), (COMPUTE_DOMAINS, self.domains)):
            if key in store.storages:
                for obj in store.storage(key).iter():
                    queue[obj["metadata"].get("namespace", ""), obj["metadata"]["name"]] = None

    def run_once(self) -> bool:
        """Publish, make and release what the queued changes call for; True when something changed."""
        if CLAIMS not in self.cluster.store.storages:
            return False
        if not (self.classes_due or self.nodes or self.domains or self.pods or self.claims):
            return False
        progressed = self._driver()
        progressed = self._compute_domains() or progressed
        progressed = self._claims_from_templates() or progressed
        return self._release() or progressed

    # --- the drivers ----------------------------------------------------------------------------------------
    def _driver(self) -> bool:
        store = self.cluster.store
        changed = False
        if self.classes_due:
            self.classes_due = False
            for name, obj in (
                (GPU_DRIVER, device_class(GPU_DRIVER, GPU_DRIVER)),
                (CHANNEL_CLASS, device_class(CHANNEL_CLASS, CHANNEL_DRIVER)),
            ):
                if store.storage(CLASSES).get("", name) is None:
                    self._create(CLASSES, None, obj)
                    changed = True
        names, self.nodes = self.nodes, {}
        nodes = store.storage("nodes")
        for queued in names:
            node = nodes.get("", queued)
            if node is None:
                continue
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
            if store.storage(SLICES).get("", f"{node_name}-{GPU_DRIVER}") is None:
                mib = str(labels.get("nvidia.com/gpu.memory", "81920"))
                product = str(labels.get("nvidia.com/gpu.product", "NVIDIA-H100"))
                memory = f"{mib}Mi" if mib.isdigit() else "80Gi"
                self._create(SLICES, None, gpu_slice(node_name, gpus, product, memory))
                changed = True
            if store.storage(SLICES).get("", f"{node_name}-{CHANNEL_DRIVER}") is None:
                self._create(SLICES, None, channel_slice(node_name))
                changed = True
        return changed

    # --- ComputeDomain ----------------------------------------------------------------------------------------
    def _compute_domains(self) -> bool:
        store = self.cluster.store
        if COMPUTE_DOMAINS not in store.storages:
            return False
        changed = False
        keys, self.domains = self.domains, {}
        domains = store.storage(COMPUTE_DOMAINS)
        for domain_ns, domain_name in keys:
            domain = domains.get(domain_ns, domain_name)
            if domain is None:
                continue
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
        keys, self.pods = self.pods, {}
        pods = store.storage("pods")
        for pod_ns, pod_name in keys:
            pod = pods.get(pod_ns, pod_name)
            if pod is None or not has_claims(pod) or pod["metadata"].get("deletionTimestamp"):
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
                    self._awaiting.setdefault((ns, str(template_name)), set()).add((ns, md["name"]))
                    continue
                name = f"{md['name']}-{entry.get('name', '')}-{random_suffix(self.cluster.rng)}"
                claim = {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        "annotations": {POD_CLAIM_ANNOTATION: str(entry.get("name", ""))},
                        "ownerReferences": [controller_ref(pod)],
                    },
                    "spec": clone((template.get("spec") or {}).get("spec") or {}),
                }
                if self._create(CLAIMS, ns, claim) is None:
                    self._retry[ns, md["name"]] = None
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
        """Delete the claims made for pods that are gone; drop from each queued claim's users the pods that
        are gone or finished, and its allocation with the last of them."""
        store = self.cluster.store
        keys, self.claims = self.claims, {}
        claims = store.storage(CLAIMS)
        changed = False
        for claim_ns, claim_name in keys:
            claim = claims.get(claim_ns, claim_name)
            if claim is None:
                continue
            md = claim["metadata"]
            owners = [o for o in md.get("ownerReferences") or () if o.get("kind") == "Pod"]
            if owners and all(o.get("uid") not in self._live for o in owners):
                store.remove(CLAIMS, md.get("namespace", ""), md["name"])
                changed = True
                continue
            status = claim.get("status") or {}
            users = status.get("reservedFor") or []
            left = [u for u in users if u.get("resource") != "pods" or self._live.get(u.get("uid"), False)]
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
