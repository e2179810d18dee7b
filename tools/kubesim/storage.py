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

The controller works per change, as kube-controller-manager's do: the store's listeners queue the claims a
write concerns and keep the indexes that replace scans (`StorageController`); `resync` queues every unbound
claim, and after a settled cluster it finds nothing to do.

Pure: no I/O (objects change through the cluster's store).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from shared.kube.quantity import QuantityError
from shared.kube.quantity import value as quantity_value
from tools.kubesim.errors import ApiError
from tools.kubesim.objects import clone, rfc3339
from tools.kubesim.store import Change, Key, unindex

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = [
    "DRIVER",
    "FAIL_PARAMETER",
    "LIMIT_LABEL",
    "PROVISIONING_FAILED",
    "StorageController",
    "claims_of",
    "storage_bytes",
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


def storage_bytes(quantity: Any) -> int:
    """A storage quantity in bytes, rounded up as Kubernetes reads it (`shared.kube.quantity`, the project's
    one reading of quantities); 0 when it is absent or does not read (the API server validated what it
    stored)."""
    if quantity is None:
        return 0
    try:
        return quantity_value(quantity)
    except QuantityError:
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


def _unbound(claim: Obj) -> bool:
    """Whether the volume controller still has work on the claim: not being deleted, not bound yet."""
    if claim["metadata"].get("deletionTimestamp"):
        return False
    named = (claim.get("spec") or {}).get("volumeName")
    return not (named and (claim["metadata"].get("annotations") or {}).get(BIND_COMPLETED))


def _claim_ref(pv: Obj | None) -> Key | None:
    """The (namespace, name) of the claim a volume's ``claimRef`` names, None without one."""
    ref = ((pv or {}).get("spec") or {}).get("claimRef")
    if not ref:
        return None
    return (str(ref.get("namespace") or ""), str(ref.get("name") or ""))


def _available(pv: Obj) -> bool:
    return (
        not (pv.get("spec") or {}).get("claimRef")
        and (pv.get("status") or {}).get("phase", "Available") == "Available"
    )


def _volume_class(pv: Obj) -> str:
    return str((pv.get("spec") or {}).get("storageClassName") or "")


class StorageController:
    """The volume controller, the CSI provisioner and the CSINode objects of one cluster.

    Incremental, as kube-controller-manager's controllers are: the store's listeners put the claims a
    change may concern on `queue` (the claim itself; for a volume, the claim its ``claimRef`` names, the
    claims whose ``spec.volumeName`` names it and, when it is Available, the unbound claims of its class
    that an Immediate class lets bind to it; for a class, its unbound claims), and `run_once` syncs those
    only. Indexes kept from the changes stand in for the scans: the unbound claims by class and by the
    volume they name, the volumes by the claim their ``claimRef`` names, the Available volumes by class.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.queue: dict[Key, None] = {}
        """Claims to sync at the next `run_once`, in the order their changes came."""
        self._unbound: dict[Key, tuple[str, str]] = {}
        """Claims not deleted and not yet bound -> (their class, the volume their spec names or "")."""
        self._unbound_by_class: dict[str, set[Key]] = {}
        self._naming: dict[str, set[Key]] = {}
        """Volume name -> unbound claims whose ``spec.volumeName`` names it."""
        self._referring: dict[Key, set[str]] = {}
        """Claim (namespace, name) -> volumes whose ``claimRef`` names it."""
        self._available: dict[str, set[str]] = {}
        """Class -> volumes without a ``claimRef``, phase Available."""
        store = cluster.store
        store.storage(CLAIMS).listeners.append(self._claim_changed)
        store.storage(VOLUMES).listeners.append(self._volume_changed)
        store.storage(CLASSES).listeners.append(self._class_changed)
        store.storage("nodes").listeners.append(self._node_changed)
        # Start-up: whatever the store holds already is indexed and synced once.
        for pv in store.storage(VOLUMES).iter():
            self._index_volume(pv)
        for claim in store.storage(CLAIMS).iter():
            self._index_claim(claim)

    # --- the indexes, from the store's changes -----------------------------------------------------------
    def _claim_changed(self, change: Change) -> None:
        md = change.obj["metadata"]
        key = (md.get("namespace", ""), md["name"])
        self._forget_claim(key)
        if change.type != "DELETED":
            self._index_claim(change.obj)

    def _index_claim(self, claim: Obj) -> None:
        md = claim["metadata"]
        if not _unbound(claim):
            return
        key = (md.get("namespace", ""), md["name"])
        class_name = _class_of(claim)
        named = str((claim.get("spec") or {}).get("volumeName") or "")
        self._unbound[key] = (class_name, named)
        self._unbound_by_class.setdefault(class_name, set()).add(key)
        if named:
            self._naming.setdefault(named, set()).add(key)
        self.queue[key] = None

    def _forget_claim(self, key: Key) -> None:
        entry = self._unbound.pop(key, None)
        if entry is None:
            return
        class_name, named = entry
        unindex(self._unbound_by_class, class_name, key)
        if named:
            unindex(self._naming, named, key)

    def _volume_changed(self, change: Change) -> None:
        old = change.old if change.type == "MODIFIED" else change.obj if change.type == "DELETED" else None
        new = None if change.type == "DELETED" else change.obj
        if old is not None:
            self._unindex_volume(old)
        if new is not None:
            self._index_volume(new)
        for pv in (old, new):
            ref = _claim_ref(pv)
            if ref is not None and ref in self._unbound:
                self.queue[ref] = None
        name = change.obj["metadata"]["name"]
        for key in self._naming.get(name, ()):
            self.queue[key] = None
        if new is not None and _available(new):
            class_name = _volume_class(new)
            waiting = self._unbound_by_class.get(class_name)
            if waiting and self._binding_mode(class_name) == "Immediate":
                for key in waiting:
                    self.queue[key] = None

    def _index_volume(self, pv: Obj) -> None:
        name = pv["metadata"]["name"]
        ref = _claim_ref(pv)
        if ref is not None:
            self._referring.setdefault(ref, set()).add(name)
        if _available(pv):
            self._available.setdefault(_volume_class(pv), set()).add(name)

    def _unindex_volume(self, pv: Obj) -> None:
        name = pv["metadata"]["name"]
        ref = _claim_ref(pv)
        if ref is not None:
            unindex(self._referring, ref, name)
        unindex(self._available, _volume_class(pv), name)

    def _class_changed(self, change: Change) -> None:
        for key in self._unbound_by_class.get(change.obj["metadata"]["name"], ()):
            self.queue[key] = None

    def _node_changed(self, change: Change) -> None:
        if change.type == "ADDED":
            self._csi_node(change.obj)

    def _binding_mode(self, class_name: str) -> str:
        """A class's volumeBindingMode; Immediate for a claim of no class or of one the cluster lacks."""
        storage_class = self.cluster.store.storage(CLASSES).get("", class_name) if class_name else None
        return str((storage_class or {}).get("volumeBindingMode") or "Immediate")

    # --- the work ---------------------------------------------------------------------------------------------
    def resync(self) -> None:
        """Queue every claim not yet bound, as a controller's periodic resync does (the store's listeners
        queue each change already: after `run_once` a resync finds nothing left to do)."""
        for claim in self.cluster.store.storage(CLAIMS).iter():
            if _unbound(claim):
                md = claim["metadata"]
                self.queue[md.get("namespace", ""), md["name"]] = None

    def run_once(self) -> bool:
        """Bind and provision what can be of the queued claims; True when something changed."""
        if not self.queue:
            return False
        batch, self.queue = self.queue, {}
        claims = self.cluster.store.storage(CLAIMS)
        progressed = False
        for ns, name in batch:
            claim = claims.get(ns, name)
            if claim is None or not _unbound(claim):
                continue
            progressed = self._sync(claim) or progressed
        return progressed

    # --- the volume controller ------------------------------------------------------------------------------
    def _sync(self, claim: Obj) -> bool:
        store = self.cluster.store
        volumes = store.storage(VOLUMES)
        md = claim["metadata"]
        key = (md.get("namespace", ""), md["name"])
        for pv_name in sorted(self._referring.get(key, ())):
            pv = volumes.get("", pv_name)
            ref = ((pv or {}).get("spec") or {}).get("claimRef") or {}
            if pv is not None and ref.get("uid", md.get("uid")) == md.get("uid"):
                return self._bind(claim, pv)
        named = (claim.get("spec") or {}).get("volumeName")
        if named:
            pv = volumes.get("", str(named))
            if pv is not None and not (pv.get("spec") or {}).get("claimRef"):
                return self._bind(claim, pv)
        class_name = _class_of(claim)
        storage_class = store.storage(CLASSES).get("", class_name) if class_name else None
        mode = (storage_class or {}).get("volumeBindingMode") or "Immediate"
        if mode == "Immediate":
            match = self._matching(claim, self._available.get(class_name, ()))
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

    def _matching(self, claim: Obj, names: Iterable[str]) -> Obj | None:
        """The smallest of the Available volumes `names` of the claim's class that has room, its access
        modes and labels its selector matches (the name breaks ties)."""
        spec = claim.get("spec") or {}
        wanted = set(spec.get("accessModes") or ())
        request = storage_bytes(((spec.get("resources") or {}).get("requests") or {}).get("storage"))
        volumes = self.cluster.store.storage(VOLUMES)
        fits = []
        for name in names:
            pv = volumes.get("", name)
            if pv is None or not _available(pv) or _volume_class(pv) != _class_of(claim):
                continue
            pv_spec = pv.get("spec") or {}
            size = storage_bytes((pv_spec.get("capacity") or {}).get("storage"))
            if size < request or not wanted <= set(pv_spec.get("accessModes") or ()):
                continue
            if not _selector_matches(spec.get("selector"), pv["metadata"].get("labels") or {}):
                continue
            fits.append((size, name, pv))
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
