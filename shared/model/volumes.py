"""Persistent storage as the core sees it: claims, volumes, classes, CSI nodes and storage capacity.

Immutable msgspec Structs, one per Kubernetes kind the volume filters read (kube-scheduler's VolumeBinding,
VolumeRestrictions, NodeVolumeLimits and VolumeZone; `shared.core.volumes`), gathered in `Volumes`, which
rides on `Snapshot.volumes`. A pod names its claims in `Pod.claims` (`claims_of` for the names Kubernetes
gives generic ephemeral volumes' claims). Built by `shared.kube.volumes` from the API objects; a claim or
class that does not translate keeps its name and carries its `problem` (the object and the field), so a
pod that uses it is held with those words rather than silently scheduled.

Units: storage in bytes. Pure: no I/O, no clock.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from shared.model.objects import LabelSelector, LabelSelectorTerm

__all__ = [
    "AWS_EBS",
    "AZURE_DISK",
    "BLOCK",
    "CINDER",
    "FILESYSTEM",
    "GCE_PD",
    "IMMEDIATE",
    "MIGRATED_DRIVERS",
    "MIGRATED_PLUGINS_ANNOTATION",
    "NO_PROVISIONER",
    "PORTWORX",
    "READ_WRITE_ONCE_POD",
    "VOLUME_MODES",
    "WAIT_FOR_FIRST_CONSUMER",
    "Claim",
    "CsiNode",
    "InlineVolume",
    "PersistentVolume",
    "StorageCapacity",
    "StorageClass",
    "StorageObject",
    "TopologyTerm",
    "Volumes",
    "ephemeral_claim_name",
]

BindingMode = Literal["Immediate", "WaitForFirstConsumer"]
IMMEDIATE: BindingMode = "Immediate"
WAIT_FOR_FIRST_CONSUMER: BindingMode = "WaitForFirstConsumer"
READ_WRITE_ONCE_POD = "ReadWriteOncePod"
FILESYSTEM = "Filesystem"
"""The ``volumeMode`` of a claim or volume that names none (Kubernetes' default)."""
BLOCK = "Block"
VOLUME_MODES = (BLOCK, FILESYSTEM)
NO_PROVISIONER = "kubernetes.io/no-provisioner"
"""The provisioner of a class whose volumes are only ever created by hand (local volumes)."""


AWS_EBS = "kubernetes.io/aws-ebs"
GCE_PD = "kubernetes.io/gce-pd"
AZURE_DISK = "kubernetes.io/azure-disk"
CINDER = "kubernetes.io/cinder"
PORTWORX = "kubernetes.io/portworx-volume"
MIGRATED_DRIVERS = {
    AWS_EBS: "ebs.csi.aws.com",
    GCE_PD: "pd.csi.storage.gke.io",
    AZURE_DISK: "disk.csi.azure.com",
    CINDER: "cinder.csi.openstack.org",
    PORTWORX: "pxd.portworx.com",
}
"""In-tree volume plugin -> the CSI driver CSI migration hands its volumes to (csi-translation-lib's names),
for the plugins whose disks attach to a node (NodeVolumeLimits counts them against that driver's limit)."""
MIGRATED_PLUGINS_ANNOTATION = "storage.kubernetes.io/migrated-plugins"
"""On a CSINode: the in-tree plugins migrated to CSI on the node, comma-separated (set by the kubelet)."""


def ephemeral_claim_name(pod: str, volume: str) -> str:
    """The claim Kubernetes creates for a pod's generic ephemeral volume: ``<pod>-<volume>``."""
    return f"{pod}-{volume}"


class Claim(msgspec.Struct, frozen=True, kw_only=True, tag="pvc"):
    """A PersistentVolumeClaim."""

    name: str
    namespace: str
    uid: str = ""
    controller_uid: str = ""
    """The uid of its controller owner (the ``ownerReferences`` entry with ``controller: true``; "": none).
    A generic ephemeral volume's claim is the pod's only when the pod is its controller."""
    storage_class: str = ""
    """The class it asks for ("" : none, so it binds only to a volume without a class, never provisioned)."""
    access_modes: tuple[str, ...] = ()
    request_bytes: int = 0
    """``spec.resources.requests.storage`` (0 when unset)."""
    selector: LabelSelector | None = None
    """``spec.selector``: only volumes whose labels it matches (None: any)."""
    volume_mode: str = FILESYSTEM
    """``spec.volumeMode``: only volumes of the same mode (Filesystem when unset, on either side)."""
    volume_name: str = ""
    """``spec.volumeName``: the volume it is (being) bound to."""
    bound: bool = False
    """Fully bound: a volume named and the binding completed (phase Bound, or kube-controller-manager's
    ``pv.kubernetes.io/bind-completed``)."""
    selected_node: str = ""
    """``volume.kubernetes.io/selected-node``: the node a provisioner was asked to provision for."""
    deleting: bool = False
    problem: str = ""
    """Why the claim cannot be used as written (it did not translate), naming the object and the field."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class PersistentVolume(msgspec.Struct, frozen=True, kw_only=True, tag="pv"):
    """A PersistentVolume."""

    name: str
    capacity_bytes: int = 0
    access_modes: tuple[str, ...] = ()
    storage_class: str = ""
    volume_mode: str = FILESYSTEM
    """``spec.volumeMode`` (Filesystem when unset)."""
    node_affinity: tuple[LabelSelectorTerm, ...] = ()
    """Required node affinity: the node must meet one of the terms (none: any node)."""
    claim_ref: str = ""
    """The claim it is bound or reserved to, "namespace/name" ("": free)."""
    claim_uid: str = ""
    phase: str = "Available"
    csi_driver: str = ""
    in_tree_plugin: str = ""
    """The in-tree plugin of its source when it is one CSI migration moves (a key of `MIGRATED_DRIVERS`)."""
    volume_handle: str = ""
    """The disk it is: ``csi.volumeHandle``, or the in-tree source's id (an EBS volume id, a PD name, an
    Azure disk URI, a Cinder or Portworx volume id); a disk attaches once, whoever names it."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Its labels (a claim's selector; the zone and region labels VolumeZone reads)."""
    deleting: bool = False


class TopologyTerm(msgspec.Struct, frozen=True):
    """One term of a class's ``allowedTopologies``: every label key must have one of its values."""

    requirements: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)


class StorageClass(msgspec.Struct, frozen=True, kw_only=True, tag="storageclass"):
    """A StorageClass."""

    name: str
    provisioner: str = ""
    binding_mode: BindingMode = IMMEDIATE
    allowed_topologies: tuple[TopologyTerm, ...] = ()
    """Where its provisioner can create volumes (terms ORed; none: anywhere)."""
    problem: str = ""
    """Why the class cannot be used as written (it did not translate), naming the object and the field."""

    @property
    def provisions(self) -> bool:
        """Whether claims of this class can be provisioned dynamically."""
        return bool(self.provisioner) and self.provisioner != NO_PROVISIONER


class CsiNode(msgspec.Struct, frozen=True, kw_only=True, tag="csinode"):
    """A CSINode: how many volumes of each CSI driver the node can attach (drivers without a count: no
    limit)."""

    name: str
    limits: dict[str, int] = msgspec.field(default_factory=dict)
    migrated_plugins: tuple[str, ...] = ()
    """The in-tree plugins its `MIGRATED_PLUGINS_ANNOTATION` lists."""


class InlineVolume(msgspec.Struct, frozen=True):
    """An in-tree disk a pod names in its own ``spec.volumes`` (no claim): the plugin (a key of
    `MIGRATED_DRIVERS`) and the disk's id (as `PersistentVolume.volume_handle`)."""

    plugin: str
    handle: str


class StorageCapacity(msgspec.Struct, frozen=True, kw_only=True, tag="csistoragecapacity"):
    """A CSIStorageCapacity: room for new volumes of a class on the nodes its topology selects."""

    name: str
    namespace: str
    storage_class: str
    node_topology: LabelSelector | None = None
    """None: no node has access (Kubernetes' nil ``nodeTopology``)."""
    capacity_bytes: int | None = None
    maximum_volume_size: int | None = None
    """When set, the largest volume it can create (preferred over `capacity_bytes`, as kube-scheduler)."""


StorageObject = Claim | PersistentVolume | StorageClass | CsiNode | StorageCapacity


class Volumes(msgspec.Struct, frozen=True, kw_only=True):
    """Every storage object one scheduling cycle reads, in a stable order."""

    claims: tuple[Claim, ...] = ()
    volumes: tuple[PersistentVolume, ...] = ()
    classes: tuple[StorageClass, ...] = ()
    csi_nodes: tuple[CsiNode, ...] = ()
    capacities: tuple[StorageCapacity, ...] = ()

    @classmethod
    def of(cls, objects: list[StorageObject]) -> Volumes:
        """The objects sorted into their kinds, each kind in name order."""
        claims = sorted((o for o in objects if isinstance(o, Claim)), key=lambda c: c.key)
        pvs = sorted((o for o in objects if isinstance(o, PersistentVolume)), key=lambda v: v.name)
        classes = sorted((o for o in objects if isinstance(o, StorageClass)), key=lambda c: c.name)
        nodes = sorted((o for o in objects if isinstance(o, CsiNode)), key=lambda n: n.name)
        capacities = sorted(
            (o for o in objects if isinstance(o, StorageCapacity)), key=lambda c: (c.namespace, c.name)
        )
        return cls(
            claims=tuple(claims),
            volumes=tuple(pvs),
            classes=tuple(classes),
            csi_nodes=tuple(nodes),
            capacities=tuple(capacities),
        )

    def __bool__(self) -> bool:
        return bool(self.claims or self.volumes or self.classes or self.csi_nodes or self.capacities)
