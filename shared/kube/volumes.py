"""Kubernetes storage objects -> the model's (`shared.model.volumes`): the JSON Kairos reads of
PersistentVolumeClaims, PersistentVolumes, StorageClasses, CSINodes and CSIStorageCapacities, and their
translations, validated.

Called by the state service's storage mirror (`services.state.mirror.volume_mirror`) for every object its
informers see, and by `shared.kube.translate.pod_of` for a pod's claims (`claims_of`). A claim or class
that does not translate (a malformed quantity, an unknown binding mode, a bad selector) is not dropped: it
becomes the model object under its name with its `problem` naming the object and the field, so a pod
that uses it is held with those words (`shared.core.volumes`) and nothing else is affected. A volume,
CSINode or capacity that does not translate raises `InvalidObject` naming the object and the field; the
mirror keeps it out (a volume it cannot read is one no claim gets).

Names Kairos reads and writes (annotations, the provisioner of hand-made volumes) are kube-controller-
manager's and kube-scheduler's. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import msgspec

from shared.errors import InvalidObject
from shared.kube import selectors, wire
from shared.kube.kinds import WireObject, WireStruct, decoder
from shared.kube.quantity import QuantityError, value
from shared.kube.values import shown
from shared.model.objects import LabelSelectorTerm
from shared.model.volumes import (
    AWS_EBS,
    AZURE_DISK,
    CINDER,
    FILESYSTEM,
    GCE_PD,
    IMMEDIATE,
    MIGRATED_PLUGINS_ANNOTATION,
    PORTWORX,
    VOLUME_MODES,
    WAIT_FOR_FIRST_CONSUMER,
    BindingMode,
    Claim,
    CsiNode,
    InlineVolume,
    PersistentVolume,
    StorageCapacity,
    StorageClass,
    TopologyTerm,
    ephemeral_claim_name,
)

__all__ = [
    "BIND_COMPLETED",
    "BOUND_BY_CONTROLLER",
    "KINDS",
    "SELECTED_NODE",
    "STORAGE_CLASS_ANNOTATION",
    "WireClaim",
    "WireCsiNode",
    "WireCsiStorageCapacity",
    "WireStorageClass",
    "WireVolume",
    "capacity_of",
    "claim_of",
    "claims_of",
    "class_of",
    "controller_uid",
    "csi_node_of",
    "ephemeral_claims_of",
    "inline_of",
    "volume_of",
]

SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""Set on a claim by the scheduler: the node its provisioner should create a volume for."""
BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
"""Set on a claim by the volume controller once its binding is complete."""
BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
STORAGE_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
"""The class before ``spec.storageClassName`` existed; still read first, as Kubernetes does."""


# --- the wire -------------------------------------------------------------------------------------------
class ObjectReference(WireStruct, frozen=True, kw_only=True):
    namespace: str = ""
    name: str = ""
    uid: str = ""


class ClaimResources(WireStruct, frozen=True, kw_only=True):
    requests: wire.ResourceList = msgspec.field(default_factory=dict)


class ClaimSpec(WireStruct, frozen=True, kw_only=True):
    access_modes: list[str] = msgspec.field(default_factory=list)
    resources: ClaimResources = msgspec.field(default_factory=ClaimResources)
    storage_class_name: str | None = None
    volume_name: str = ""
    selector: wire.LabelSelector | None = None
    volume_mode: str | None = None


class ClaimStatus(WireStruct, frozen=True, kw_only=True):
    phase: str = ""


class WireClaim(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "PersistentVolumeClaim"
    spec: ClaimSpec = msgspec.field(default_factory=ClaimSpec)
    status: ClaimStatus = msgspec.field(default_factory=ClaimStatus)


class VolumeNodeAffinity(WireStruct, frozen=True, kw_only=True):
    required: wire.NodeSelector | None = None


class CsiSource(WireStruct, frozen=True, kw_only=True):
    driver: str = ""
    volume_handle: str = ""


class VolumeIdSource(WireStruct, frozen=True, kw_only=True):
    """awsElasticBlockStore, cinder and portworxVolume: the disk by its id."""

    volume_id: str = msgspec.field(default="", name="volumeID")


class GcePdSource(WireStruct, frozen=True, kw_only=True):
    pd_name: str = ""


class AzureDiskSource(WireStruct, frozen=True, kw_only=True):
    disk_uri: str = msgspec.field(default="", name="diskURI")


class VolumeSpec(WireStruct, frozen=True, kw_only=True):
    capacity: wire.ResourceList = msgspec.field(default_factory=dict)
    access_modes: list[str] = msgspec.field(default_factory=list)
    storage_class_name: str = ""
    volume_mode: str | None = None
    node_affinity: VolumeNodeAffinity | None = None
    claim_ref: ObjectReference | None = None
    csi: CsiSource | None = None
    aws_elastic_block_store: VolumeIdSource | None = None
    gce_persistent_disk: GcePdSource | None = None
    azure_disk: AzureDiskSource | None = None
    cinder: VolumeIdSource | None = None
    portworx_volume: VolumeIdSource | None = None


class VolumeStatus(WireStruct, frozen=True, kw_only=True):
    phase: str = ""


class WireVolume(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "PersistentVolume"
    spec: VolumeSpec = msgspec.field(default_factory=VolumeSpec)
    status: VolumeStatus = msgspec.field(default_factory=VolumeStatus)


class TopologyRequirement(WireStruct, frozen=True, kw_only=True):
    key: str = ""
    values: list[str] = msgspec.field(default_factory=list)


class TopologySelectorTerm(WireStruct, frozen=True, kw_only=True):
    match_label_expressions: list[TopologyRequirement] = msgspec.field(default_factory=list)


class WireStorageClass(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "StorageClass"
    provisioner: str = ""
    volume_binding_mode: str | None = None
    allowed_topologies: list[TopologySelectorTerm] = msgspec.field(default_factory=list)


class DriverAllocatable(WireStruct, frozen=True, kw_only=True):
    count: int | None = None


class CsiNodeDriver(WireStruct, frozen=True, kw_only=True):
    name: str = ""
    node_id: str = msgspec.field(default="", name="nodeID")
    allocatable: DriverAllocatable | None = None


class CsiNodeSpec(WireStruct, frozen=True, kw_only=True):
    drivers: list[CsiNodeDriver] = msgspec.field(default_factory=list)


class WireCsiNode(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "CSINode"
    spec: CsiNodeSpec = msgspec.field(default_factory=CsiNodeSpec)


class WireCsiStorageCapacity(WireObject, frozen=True, kw_only=True):
    KIND: ClassVar[str] = "CSIStorageCapacity"
    storage_class_name: str = ""
    node_topology: wire.LabelSelector | None = None
    capacity: str | int | float | None = None
    maximum_volume_size: str | int | float | None = None


WireStorage = WireClaim | WireVolume | WireStorageClass | WireCsiNode | WireCsiStorageCapacity

KINDS: Mapping[str, type[Any]] = {
    "persistentvolumeclaims": WireClaim,
    "persistentvolumes": WireVolume,
    "storageclasses": WireStorageClass,
    "csinodes": WireCsiNode,
    "csistoragecapacities": WireCsiStorageCapacity,
}
"""Resource name -> the wire type of its objects."""
decode: Callable[[str, bytes | str], WireStorage] = decoder(KINDS)
"""One object of `resource` (a key of `KINDS`) from its JSON; InvalidObject names the kind and the object."""


# --- translation ----------------------------------------------------------------------------------------
def claims_of(pod: wire.Pod) -> tuple[str, ...]:
    """The claims a pod's volumes use, in volume order, each once: ``persistentVolumeClaim.claimName``,
    and ``<pod>-<volume>`` for a generic ephemeral volume (the claim Kubernetes creates for it)."""
    names: dict[str, None] = {}
    for volume in pod.spec.volumes:
        if volume.persistent_volume_claim is not None and volume.persistent_volume_claim.claim_name:
            names[volume.persistent_volume_claim.claim_name] = None
        elif volume.ephemeral is not None:
            names[ephemeral_claim_name(pod.metadata.name, volume.name)] = None
    return tuple(names)


def ephemeral_claims_of(pod: wire.Pod) -> tuple[str, ...]:
    """Of `claims_of`, the claims of the pod's generic ephemeral volumes, in volume order."""
    names = (
        ephemeral_claim_name(pod.metadata.name, v.name) for v in pod.spec.volumes if v.ephemeral is not None
    )
    return tuple(dict.fromkeys(names))


def controller_uid(meta: wire.ObjectMeta) -> str:
    """The uid of the object's controller owner ("" when none), as ``metav1.GetControllerOf`` finds it."""
    for ref in meta.owner_references:
        if ref.controller:
            return ref.uid
    return ""


def claim_of(raw: WireClaim) -> Claim:
    """The model claim; one that does not translate keeps its name and carries the problem."""
    meta = raw.metadata
    base = Claim(name=meta.name, namespace=meta.namespace, uid=meta.uid, controller_uid=controller_uid(meta))
    try:
        return _claim(raw, base)
    except InvalidObject as exc:
        return msgspec.structs.replace(base, problem=str(exc))


def _claim(raw: WireClaim, base: Claim) -> Claim:
    meta, spec = raw.metadata, raw.spec
    where = (raw.KIND, raw.label)
    storage = spec.resources.requests.get("storage")
    request = 0 if storage is None else _bytes(where, "spec.resources.requests.storage", storage)
    selector = None
    if spec.selector is not None:
        selector = selectors.label_selector(where, "spec.selector", spec.selector)
    storage_class = meta.annotations.get(STORAGE_CLASS_ANNOTATION)
    if storage_class is None:
        storage_class = spec.storage_class_name or ""
    return msgspec.structs.replace(
        base,
        storage_class=storage_class,
        access_modes=tuple(spec.access_modes),
        request_bytes=request,
        selector=selector,
        volume_mode=_volume_mode(where, spec.volume_mode),
        volume_name=spec.volume_name,
        bound=bool(spec.volume_name)
        and (raw.status.phase == "Bound" or meta.annotations.get(BIND_COMPLETED) is not None),
        selected_node=meta.annotations.get(SELECTED_NODE, ""),
        deleting=meta.deletion_timestamp is not None,
    )


def volume_of(raw: WireVolume) -> PersistentVolume:
    """The model volume; InvalidObject names the field that does not translate."""
    meta, spec = raw.metadata, raw.spec
    where = (raw.KIND, raw.label)
    storage = spec.capacity.get("storage")
    capacity = 0 if storage is None else _bytes(where, "spec.capacity.storage", storage)
    terms: tuple[LabelSelectorTerm, ...] = ()
    if spec.node_affinity is not None and spec.node_affinity.required is not None:
        at = "spec.nodeAffinity.required.nodeSelectorTerms"
        terms = selectors.node_selector(where, at, spec.node_affinity.required)
    ref = spec.claim_ref
    plugin, handle = _in_tree(spec)
    return PersistentVolume(
        name=meta.name,
        capacity_bytes=capacity,
        access_modes=tuple(spec.access_modes),
        storage_class=meta.annotations.get(STORAGE_CLASS_ANNOTATION, spec.storage_class_name),
        volume_mode=_volume_mode(where, spec.volume_mode),
        node_affinity=terms,
        claim_ref=f"{ref.namespace}/{ref.name}" if ref is not None and ref.name else "",
        claim_uid=ref.uid if ref is not None else "",
        phase=raw.status.phase or "Available",
        csi_driver=spec.csi.driver if spec.csi is not None else "",
        in_tree_plugin=plugin,
        volume_handle=spec.csi.volume_handle if spec.csi is not None else handle,
        labels=dict(meta.labels),
        deleting=meta.deletion_timestamp is not None,
    )


def class_of(raw: WireStorageClass) -> StorageClass:
    """The model class; one that does not translate keeps its name and carries the problem."""
    base = StorageClass(name=raw.metadata.name, provisioner=raw.provisioner)
    try:
        return _storage_class(raw, base)
    except InvalidObject as exc:
        return msgspec.structs.replace(base, problem=str(exc))


def _storage_class(raw: WireStorageClass, base: StorageClass) -> StorageClass:
    where = (raw.KIND, raw.label)
    mode: BindingMode = IMMEDIATE
    if raw.volume_binding_mode == WAIT_FOR_FIRST_CONSUMER:
        mode = WAIT_FOR_FIRST_CONSUMER
    elif raw.volume_binding_mode not in (None, IMMEDIATE):
        raise InvalidObject(
            *where,
            "volumeBindingMode",
            f"must be Immediate or WaitForFirstConsumer, got {raw.volume_binding_mode!r}",
        )
    topologies = []
    for i, term in enumerate(raw.allowed_topologies):
        requirements: dict[str, tuple[str, ...]] = {}
        for j, req in enumerate(term.match_label_expressions):
            if not req.key or not req.values:
                at = f"allowedTopologies[{i}].matchLabelExpressions[{j}]"
                raise InvalidObject(*where, at, "needs a key and at least one value")
            requirements[req.key] = tuple(req.values)
        topologies.append(TopologyTerm(requirements))
    return msgspec.structs.replace(base, binding_mode=mode, allowed_topologies=tuple(topologies))


def _in_tree(spec: VolumeSpec) -> tuple[str, str]:
    """(plugin, disk id) of a volume's in-tree source that CSI migration moves; ("", "") for any other."""
    ebs, pd, azure, cinder, portworx = (
        spec.aws_elastic_block_store,
        spec.gce_persistent_disk,
        spec.azure_disk,
        spec.cinder,
        spec.portworx_volume,
    )
    sources = (
        (AWS_EBS, ebs.volume_id if ebs is not None else ""),
        (GCE_PD, pd.pd_name if pd is not None else ""),
        (AZURE_DISK, azure.disk_uri if azure is not None else ""),
        (CINDER, cinder.volume_id if cinder is not None else ""),
        (PORTWORX, portworx.volume_id if portworx is not None else ""),
    )
    for plugin, handle in sources:
        if handle:
            return plugin, _disk_id(plugin, handle)
    return "", ""


def _disk_id(plugin: str, handle: str) -> str:
    """The disk's id as CSI migration names it: an EBS volume given as ``aws://<zone>/<id>`` is ``<id>``."""
    if plugin == AWS_EBS and handle.startswith("aws://"):
        return handle.rsplit("/", 1)[-1]
    return handle


_INLINE_SOURCES = (
    (AWS_EBS, "aws_elastic_block_store", "volumeID"),
    (GCE_PD, "gce_persistent_disk", "pdName"),
    (AZURE_DISK, "azure_disk", "diskURI"),
    (CINDER, "cinder", "volumeID"),
    (PORTWORX, "portworx_volume", "volumeID"),
)


def inline_of(pod: wire.Pod) -> tuple[InlineVolume, ...]:
    """The in-tree disks the pod's volumes name without a claim (each disk once), which NodeVolumeLimits
    counts under CSI migration; a source without its id names no disk (the API server refuses one)."""
    found: dict[InlineVolume, None] = {}
    for volume in pod.spec.volumes:
        for plugin, attr, field in _INLINE_SOURCES:
            source = getattr(volume, attr)
            if source is None:
                continue
            handle = source.get(field)
            if isinstance(handle, str) and handle:
                found[InlineVolume(plugin, _disk_id(plugin, handle))] = None
    return tuple(found)


def csi_node_of(raw: WireCsiNode) -> CsiNode:
    """The model CSINode: each driver's attach limit (drivers without one are unlimited)."""
    limits: dict[str, int] = {}
    for i, driver in enumerate(raw.spec.drivers):
        count = driver.allocatable.count if driver.allocatable is not None else None
        if count is None:
            continue
        if count < 0:
            raise InvalidObject(
                raw.KIND, raw.label, f"spec.drivers[{i}].allocatable.count", f"must be >= 0, got {count}"
            )
        limits[driver.name] = count
    listed = raw.metadata.annotations.get(MIGRATED_PLUGINS_ANNOTATION, "")
    migrated = tuple(dict.fromkeys(p.strip() for p in listed.split(",") if p.strip()))
    return CsiNode(name=raw.metadata.name, limits=limits, migrated_plugins=migrated)


def capacity_of(raw: WireCsiStorageCapacity) -> StorageCapacity:
    """The model capacity; InvalidObject names the field that does not translate."""
    where = (raw.KIND, raw.label)
    topology = None
    if raw.node_topology is not None:
        topology = selectors.label_selector(where, "nodeTopology", raw.node_topology)
    return StorageCapacity(
        name=raw.metadata.name,
        namespace=raw.metadata.namespace,
        storage_class=raw.storage_class_name,
        node_topology=topology,
        capacity_bytes=None if raw.capacity is None else _bytes(where, "capacity", raw.capacity),
        maximum_volume_size=(
            None
            if raw.maximum_volume_size is None
            else _bytes(where, "maximumVolumeSize", raw.maximum_volume_size)
        ),
    )


# --- helpers --------------------------------------------------------------------------------------------
def _volume_mode(where: tuple[str, str], mode: str | None) -> str:
    """``spec.volumeMode``: Filesystem when unset (the API server's default), else Block or Filesystem."""
    if mode is None:
        return FILESYSTEM
    if mode not in VOLUME_MODES:
        raise InvalidObject(*where, "spec.volumeMode", f"must be Block or Filesystem, got {shown(mode)}")
    return mode


def _bytes(where: tuple[str, str], field: str, raw: str | int | float) -> int:
    try:
        amount = value(raw)
    except QuantityError:
        # Worded without a sentence-ending period inside: the reason is quoted in a node count message.
        raise InvalidObject(
            *where, field, f"{shown(raw)} is not a storage quantity (such as 10Gi or 500M)"
        ) from None
    if amount < 0:
        raise InvalidObject(*where, field, f"must not be negative, got {raw!r}")
    return amount
