"""The default StorageClass, as Kubernetes gives it: the DefaultStorageClass admission plugin on a claim's
creation, and kube-controller-manager's retroactive assignment to claims created before a default existed.

- `admit` (called by `tools.kubesim.cluster.Cluster.begin_create` for a PersistentVolumeClaim, before the
  admission webhooks, as the plugin runs in the real server's mutating chain): a claim that asks for no
  class (no ``spec.storageClassName``, not even ``""``, and no legacy
  ``volume.beta.kubernetes.io/storage-class`` annotation) gets the default class's name in
  ``spec.storageClassName``. A claim that names ``""`` asks for a volume of no class and is left alone.
- `RetroactiveDefault` (run by `tools.kubesim.controllers.Controllers`): a claim still asking for no class,
  not bound and naming no volume, gets the default class once one exists (the RetroactiveDefaultStorageClass
  behaviour, GA in Kubernetes 1.28), unless a volume of no class is there for the volume controller to
  bind it to.

The default class (`default_class`): the classes annotated ``storageclass.kubernetes.io/is-default-class``
(or its beta name) ``"true"``; with several, the newest by ``creationTimestamp``, then the first by name, as
kube-controller-manager's and the plugin's ``GetDefaultClass`` choose (the newest wins, so adding a second
default takes over new claims; older documentation says creation is refused then, which the code no longer
does). No I/O beyond the store it is handed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tools.kubesim.objects import clone
from tools.kubesim.storage import storage_bytes
from tools.kubesim.store import Change, Store

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = [
    "BETA_IS_DEFAULT",
    "IS_DEFAULT",
    "RetroactiveDefault",
    "admit",
    "asks_for_no_class",
    "default_class",
    "is_default",
]

Obj = dict[str, Any]
Key = tuple[str, str]

CLAIMS = "persistentvolumeclaims"
VOLUMES = "persistentvolumes"
CLASSES = "storage.k8s.io/storageclasses"
IS_DEFAULT = "storageclass.kubernetes.io/is-default-class"
BETA_IS_DEFAULT = "storageclass.beta.kubernetes.io/is-default-class"
LEGACY_CLASS = "volume.beta.kubernetes.io/storage-class"
"""A claim's class before ``spec.storageClassName`` existed: a claim carrying it asks for that class."""
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"


def is_default(storage_class: Obj) -> bool:
    """Whether a class is marked the default (either annotation, exactly ``"true"``)."""
    annotations = (storage_class.get("metadata") or {}).get("annotations") or {}
    return annotations.get(IS_DEFAULT) == "true" or annotations.get(BETA_IS_DEFAULT) == "true"


def default_class(classes: Iterable[Obj]) -> Obj | None:
    """The default class among `classes`: of those marked, the newest, then the first by name."""
    marked = [c for c in classes if is_default(c)]
    if not marked:
        return None
    # RFC 3339 timestamps in UTC of one format order as strings do; newest first, then name ascending.
    marked.sort(key=lambda c: str(c["metadata"].get("name", "")))
    marked.sort(key=lambda c: str(c["metadata"].get("creationTimestamp") or ""), reverse=True)
    return marked[0]


def asks_for_no_class(claim: Obj) -> bool:
    """Whether a claim names no class at all: ``spec.storageClassName`` absent or null (``""`` is a
    request for a volume of no class) and no legacy class annotation."""
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    if LEGACY_CLASS in annotations:
        return False
    spec = claim.get("spec")
    return not isinstance(spec, dict) or spec.get("storageClassName") is None


def admit(store: Store, claim: Obj) -> None:
    """The DefaultStorageClass admission plugin, in place on a claim being created."""
    if not asks_for_no_class(claim) or not isinstance(claim.get("spec"), dict):
        return
    chosen = default_class(store.storage(CLASSES).iter())
    if chosen is not None:
        claim["spec"]["storageClassName"] = chosen["metadata"]["name"]


class RetroactiveDefault:
    """kube-controller-manager's retroactive default class: the claims that asked for no class while no
    default existed get it once one does.

    Incremental: the store's listeners queue a claim that asks for no class when it changes, and every such
    claim when a class is marked default; `run_once` updates the queued claims still waiting."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.waiting: dict[Key, None] = {}
        """Claims asking for no class, not bound, naming no volume."""
        self.queue: dict[Key, None] = {}
        store = cluster.store
        store.storage(CLAIMS).listeners.append(self._claim_changed)
        store.storage(CLASSES).listeners.append(self._class_changed)
        for claim in store.storage(CLAIMS).iter():
            self._track(claim)

    def _claim_changed(self, change: Change) -> None:
        md = change.obj["metadata"]
        key = (md.get("namespace", ""), md["name"])
        self.waiting.pop(key, None)
        if change.type != "DELETED":
            self._track(change.obj)

    def _track(self, claim: Obj) -> None:
        md = claim["metadata"]
        if md.get("deletionTimestamp") or not asks_for_no_class(claim):
            return
        if (claim.get("spec") or {}).get("volumeName") or BIND_COMPLETED in (md.get("annotations") or {}):
            return
        key = (md.get("namespace", ""), md["name"])
        self.waiting[key] = None
        self.queue[key] = None

    def _class_changed(self, change: Change) -> None:
        if change.type != "DELETED" and is_default(change.obj):
            self.queue.update(self.waiting)

    def run_once(self) -> bool:
        """Give the default class to the queued claims that still ask for none; True when one changed."""
        if not self.queue:
            return False
        batch, self.queue = self.queue, {}
        store = self.cluster.store
        chosen = default_class(store.storage(CLASSES).iter())
        if chosen is None:
            return False
        name = chosen["metadata"]["name"]
        claims = store.storage(CLAIMS)
        changed = False
        for ns, claim_name in batch:
            claim = claims.get(ns, claim_name)
            if claim is None or (ns, claim_name) not in self.waiting or self._volume_of_no_class(claim):
                continue
            updated = clone(claim)
            updated.setdefault("spec", {})["storageClassName"] = name
            store.put(CLAIMS, updated)
            changed = True
        return changed

    def _volume_of_no_class(self, claim: Obj) -> bool:
        """Whether an Available volume of no class is there, with room and the access modes, for the volume
        controller to bind the claim to (kube-controller-manager assigns the default only when it finds
        none)."""
        spec = claim.get("spec") or {}
        wanted = set(spec.get("accessModes") or ())
        request = storage_bytes(((spec.get("resources") or {}).get("requests") or {}).get("storage"))
        for pv in self.cluster.store.storage(VOLUMES).iter():
            pv_spec = pv.get("spec") or {}
            if pv_spec.get("storageClassName") or pv_spec.get("claimRef"):
                continue
            if (pv.get("status") or {}).get("phase", "Available") != "Available":
                continue
            if storage_bytes((pv_spec.get("capacity") or {}).get("storage")) < request:
                continue
            if wanted <= set(pv_spec.get("accessModes") or ()):
                return True
        return False
