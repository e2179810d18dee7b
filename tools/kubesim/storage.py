"""Storage in the simulated cluster: kube-controller-manager's volume controller, a CSI provisioner, CSINode
objects, and the kubelet's wait for a pod's claims.

- **Volume controller** (`StorageController.run_once`, from `tools.kubesim.controllers.Controllers`): a
  claim not yet bound is bound to the volume whose ``claimRef`` names it (the scheduler reserved it), or,
  when its class is Immediate (or it names no class), to the smallest Available volume of its class with
  room, its access modes and labels its selector matches; binding sets the claim's ``spec.volumeName``,
  ``pv.kubernetes.io/bind-completed`` and ``bound-by-controller``, phase Bound with the volume's capacity,
  and the volume's ``claimRef`` (with the claim's uid) and phase Bound.
- **CSI provisioner** (`DRIVER`): a claim of a class whose provisioner is `DRIVER` gets a volume
  ``pvc-<claim uid>`` of its request, class and access modes on that driver: for a WaitForFirstConsumer
  class once the claim carries ``volume.kubernetes.io/selected-node`` (the volume is then pinned to that
  node by ``kubernetes.io/hostname``), for an Immediate class at once. Classes of other provisioners (none
  runs here) and classes the cluster does not have provision nothing. A class whose parameter
  `FAIL_PARAMETER` is ``"true"`` makes it fail as the real external-provisioner fails when its driver
  answers ResourceExhausted: a Warning ``ProvisioningFailed`` on the claim, and, for a claim with a
  selected node, the annotation removed, which tells the scheduler to choose again.
- **CSINode**: one per node, for the simulated driver `DRIVER`; its attach limit is the node's label
  `LIMIT_LABEL` (a cluster file node's ``labels``), none without it.
- **Kubelet** (`unmounted`, from `tools.kubesim.kubelet.Kubelet.start`): a pod one of whose claims does not
  exist or is not bound stays Pending, its containers waiting ``ContainerCreating``, with a Warning
  ``FailedMount`` naming the claims, until they are.

Pure: no I/O (objects change through the cluster's store).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.kubesim.errors import ApiError
from tools.kubesim.objects import clone, rfc3339
from tools.kubesim.store import Change

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = [
    "DRIVER",
    "FAIL_PARAMETER",
    "LIMIT_LABEL",
    "PROVISIONING_FAILED",
    "StorageController",
    "claims_of",
    "unmounted",
]

Obj = dict[str, Any]

CLAIMS = "persistentvolumeclaims"
VOLUMES = "persistentvolumes"
CLASSES = "storage.k8s.io/storageclasses"
CSINODES = "storage.k8s.io/csinodes"
DRIVER = "csi.kubesim.kairos.io"
"""The simulated CSI driver every node runs."""
FAIL_PARAMETER = "kubesim.kairos.io/fail"
"""A StorageClass parameter: ``"true"`` makes the simulated provisioner fail every claim of the class."""
PROVISIONING_FAILED = "ProvisioningFailed"
"""The reason of the provisioner's Warning on a claim it could not provision (external-provisioner's)."""
LIMIT_LABEL = "kubesim.kairos.io/csi-volume-limit"
"""A node label: how many volumes of `DRIVER` the node can attach (its CSINode's allocatable count)."""
SELECTED_NODE = "volume.kubernetes.io/selected-node"
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
HOSTNAME = "kubernetes.io/hostname"
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def claims_of(pod: Obj) -> list[str]:
    """The claims a pod's volumes use (``persistentVolumeClaim.claimName``, ``<pod>-<volume>`` for an
    ephemeral volume)."""
    out: list[str] = []
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        if not isinstance(volume, dict):
            continue
        source = volume.get("persistentVolumeClaim")
        if isinstance(source, dict) and source.get("claimName"):
            out.append(str(source["claimName"]))
        elif volume.get("ephemeral") is not None:
            out.append(f"{pod['metadata']['name']}-{volume.get('name', '')}")
    return out


def _bytes(quantity: Any) -> int:
    """A storage quantity in bytes (0 when it does not parse: the API server validated what it stored)."""
    text = str(quantity or "0")
    for suffix, unit in _UNITS.items():
        if text.endswith(suffix):
            try:
                return int(float(text[: -len(suffix)]) * unit)
            except ValueError:
                return 0
    try:
        return int(float(text))
    except ValueError:
        return 0


def _class_of(claim: Obj) -> str:
    annotation = (claim["metadata"].get("annotations") or {}).get("volume.beta.kubernetes.io/storage-class")
    return str(
        annotation if annotation is not None else (claim.get("spec") or {}).get("storageClassName") or ""
    )


def _selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, op, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        have = labels.get(key)
        if (
            (op == "In" and have not in values)
            or (op == "NotIn" and have in values)
            or (op == "Exists" and have is None)
            or (op == "DoesNotExist" and have is not None)
        ):
            return False
    return True


class StorageController:
    """The volume controller, the CSI provisioner and the CSINode objects of one cluster."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.dirty = True
        store = cluster.store
        for key in (CLAIMS, VOLUMES, CLASSES):
            store.storage(key).listeners.append(self._changed)
        store.storage("nodes").listeners.append(self._node_changed)

    def _changed(self, change: Change) -> None:  # noqa: ARG002 -- a store listener's signature
        self.dirty = True

    def _node_changed(self, change: Change) -> None:
        if change.type == "ADDED":
            self._csi_node(change.obj)

    def run_once(self) -> bool:
        """Bind and provision what can be; True when something changed."""
        if not self.dirty:
            return False
        self.dirty = False
        progressed = False
        store = self.cluster.store
        classes = {c["metadata"]["name"]: c for c in store.storage(CLASSES).iter()}
        for claim in list(store.storage(CLAIMS).iter()):
            if claim["metadata"].get("deletionTimestamp"):
                continue
            spec = claim.get("spec") or {}
            if spec.get("volumeName") and (claim["metadata"].get("annotations") or {}).get(BIND_COMPLETED):
                continue
            progressed = self._sync(claim, classes) or progressed
        return progressed

    # --- the volume controller ------------------------------------------------------------------------------
    def _sync(self, claim: Obj, classes: dict[str, Obj]) -> bool:
        volumes = list(self.cluster.store.storage(VOLUMES).iter())
        md = claim["metadata"]
        key = (md.get("namespace", ""), md["name"])
        named = (claim.get("spec") or {}).get("volumeName")
        for pv in volumes:
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if (ref.get("namespace"), ref.get("name")) == key and ref.get("uid", md.get("uid")) == md.get(
                "uid"
            ):
                return self._bind(claim, pv)
            if named and pv["metadata"]["name"] == named and not ref:
                return self._bind(claim, pv)
        storage_class = classes.get(_class_of(claim))
        mode = (storage_class or {}).get("volumeBindingMode") or "Immediate"
        if mode == "Immediate":
            match = self._matching(claim, volumes)
            if match is not None:
                return self._bind(claim, match)
        if storage_class is None or storage_class.get("provisioner") != DRIVER:
            return False  # no volume to make here: another provisioner's class, or volumes made by hand
        selected = (md.get("annotations") or {}).get(SELECTED_NODE)
        if mode != "Immediate" and not selected:
            return False
        if str((storage_class.get("parameters") or {}).get(FAIL_PARAMETER, "")).lower() == "true":
            return self._fail(claim, storage_class)
        made = self._provision(claim, storage_class, selected)
        return made is not None and self._bind(claim, made)

    def _matching(self, claim: Obj, volumes: list[Obj]) -> Obj | None:
        spec = claim.get("spec") or {}
        wanted = set(spec.get("accessModes") or ())
        request = _bytes(((spec.get("resources") or {}).get("requests") or {}).get("storage"))
        fits = []
        for pv in volumes:
            pv_spec = pv.get("spec") or {}
            if pv_spec.get("claimRef") or (pv.get("status") or {}).get("phase", "Available") != "Available":
                continue
            if (pv_spec.get("storageClassName") or "") != _class_of(claim):
                continue
            size = _bytes((pv_spec.get("capacity") or {}).get("storage"))
            if size < request or not wanted <= set(pv_spec.get("accessModes") or ()):
                continue
            if not _selector_matches(spec.get("selector"), pv["metadata"].get("labels") or {}):
                continue
            fits.append((size, pv["metadata"]["name"], pv))
        return min(fits, key=lambda f: (f[0], f[1]))[2] if fits else None

    def _bind(self, claim: Obj, pv: Obj) -> bool:
        store = self.cluster.store
        md = claim["metadata"]
        bound_pv = clone(pv)
        bound_pv["spec"]["claimRef"] = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": md.get("namespace", ""),
            "name": md["name"],
            "uid": md.get("uid", ""),
        }
        bound_pv["status"] = {"phase": "Bound"}
        store.put(VOLUMES, bound_pv)
        bound_claim = clone(claim)
        bound_claim["spec"]["volumeName"] = pv["metadata"]["name"]
        annotations = bound_claim["metadata"].setdefault("annotations", {})
        annotations[BIND_COMPLETED] = "yes"
        annotations[BOUND_BY_CONTROLLER] = "yes"
        pv_spec = pv.get("spec") or {}
        bound_claim["status"] = {
            "phase": "Bound",
            "accessModes": list(pv_spec.get("accessModes") or ()),
            "capacity": dict(pv_spec.get("capacity") or {}),
        }
        store.put(CLAIMS, bound_claim)
        return True

    # --- the provisioner ------------------------------------------------------------------------------------
    def _provision(self, claim: Obj, storage_class: Obj, node: str | None) -> Obj | None:
        md = claim["metadata"]
        spec = claim.get("spec") or {}
        name = f"pvc-{md.get('uid', md['name'])}"
        existing = self.cluster.store.storage(VOLUMES).get("", name)
        if existing is not None:
            return existing
        pv: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {PROVISIONED_BY: storage_class["provisioner"]}},
            "spec": {
                "capacity": {
                    "storage": ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
                },
                "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
                "storageClassName": storage_class["metadata"]["name"],
                "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy") or "Delete",
                "csi": {"driver": storage_class["provisioner"], "volumeHandle": name},
            },
        }
        if node:
            pv["spec"]["nodeAffinity"] = {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]}
                    ]
                }
            }
        try:
            return self.cluster.create(self.cluster.type_of(VOLUMES), None, pv)
        except ApiError:
            return None

    def _fail(self, claim: Obj, storage_class: Obj) -> bool:
        """Provisioning refused by the driver: a Warning on the claim, and its selected node handed back
        (external-provisioner's reschedule), so the scheduler decides again; True when the claim changed."""
        name = storage_class["metadata"]["name"]
        message = (
            f'failed to provision volume with StorageClass "{name}": rpc error: code = ResourceExhausted '
            f"desc = the simulated driver {DRIVER} was told to fail (parameter {FAIL_PARAMETER})"
        )
        self.cluster.record_event(claim, "Warning", PROVISIONING_FAILED, message, DRIVER)
        if SELECTED_NODE not in (claim["metadata"].get("annotations") or {}):
            return False
        handed_back = clone(claim)
        del handed_back["metadata"]["annotations"][SELECTED_NODE]
        self.cluster.store.put(CLAIMS, handed_back)
        return True

    # --- CSINode --------------------------------------------------------------------------------------------
    def _csi_node(self, node: Obj) -> None:
        name = node["metadata"]["name"]
        if CSINODES not in self.cluster.store.storages or self.cluster.store.storage(CSINODES).get("", name):
            return
        driver: Obj = {"name": DRIVER, "nodeID": name, "topologyKeys": [HOSTNAME]}
        limit = (node["metadata"].get("labels") or {}).get(LIMIT_LABEL)
        if limit is not None and str(limit).isdigit():
            driver["allocatable"] = {"count": int(limit)}
        metadata = {"name": name, "uid": f"csinode-{name}", "creationTimestamp": rfc3339(self.cluster.now())}
        obj = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": metadata,
            "spec": {"drivers": [driver]},
        }
        self.cluster.store.put(CSINODES, obj)


# --- the kubelet's wait -----------------------------------------------------------------------------------
def unmounted(cluster: Cluster, pod: Obj) -> list[str]:
    """The pod's claims that do not exist or are not bound (the kubelet cannot mount them yet)."""
    ns = pod["metadata"].get("namespace", "")
    storage = cluster.store.storage(CLAIMS)
    out = []
    for name in claims_of(pod):
        claim = storage.get(ns, name)
        if claim is None or (claim.get("status") or {}).get("phase") != "Bound":
            out.append(name)
    return out


def mount_message(names: list[str]) -> str:
    """The kubelet's Warning while claims are not bound."""
    return (
        f"Unable to attach or mount volumes: unmounted volumes=[{' '.join(names)}]: "
        "timed out waiting for the condition (persistentvolumeclaims not bound)"
    )
