"""VolumeBinding and DRAGPUClaims: pods that need more than CPU and GPUs (issue 30), as benchmark workloads.

- **VolumeBinding** (scheduler_perf's SchedulingCSIPVs and SchedulingInTreePVs, with WaitForFirstConsumer
  claims): nodes in `ZONES` zones, each with one local static PersistentVolume pinned to it by hostname
  (class `STATIC_CLASS`: no provisioner, WaitForFirstConsumer) and a CSINode allowing `ATTACH_LIMIT`
  volumes of the simulated CSI driver; then pods of one GPU each with one PersistentVolumeClaim, the even
  ones of `STATIC_CLASS` (matched to a free local volume on the node chosen), the odd ones of
  `DYNAMIC_CLASS` (the simulated CSI driver, WaitForFirstConsumer, allowedTopologies: the first two zones),
  provisioned for the node chosen.
- **DRAGPUClaims** (scheduler_perf's SchedulingWithResourceClaimTemplate): plain GPU nodes whose simulated
  NVIDIA DRA driver publishes a ResourceSlice of their 8 GPUs each (and one IMEX channel), and pods of no
  device-plugin GPU with one entry in ``spec.resourceClaims`` made from the ResourceClaimTemplate
  `TEMPLATE` (one device of class ``gpu.nvidia.com``).

Both run before the measurement a number of plain pods, one per node spread evenly, as scheduler_perf's
initial pods (GPU pods for VolumeBinding, CPU pods for DRAGPUClaims, so no device is held twice).

The objects are written once, as the Kubernetes JSON a user writes (`Workload.setup`: the classes, the
local volumes, the template; `Group.setup`: each pod's claim), and translated by the state service's own
translations (`shared.kube.volumes`, `shared.kube.dra`) into the snapshot the in-process core reads
(`Workload.volumes`, `Workload.dra`). What the simulated cluster makes by itself (CSINodes, the driver's
slices and DeviceClasses, the resourceclaim controller's claims) is written here exactly as
`tools.kubesim.storage` and `tools.kubesim.dra` make it, for the in-process snapshot only; over the bus
the simulated API server makes it. In process, `ClaimsState` then does what the binder and the
simulated controllers do once a pod is bound: binds a static volume to its claim, provisions a volume for
a dynamic one on the pod's node, writes a DRA claim's allocation and the pod among its users.

Called through `tools.bench.workloads.build`. Deterministic: no randomness, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from shared.core.result import Binding
from shared.kube import dra as kube_dra
from shared.kube import volumes as kube_volumes
from shared.model import Node, Pod, PodStatus
from shared.model.builders import flat_queues, gang
from shared.model.dra import Dra, DraObject, PodClaim, ResourceClaim
from shared.model.volumes import Claim, PersistentVolume, StorageObject, Volumes
from tools.bench.manifests import NAMESPACE
from tools.bench.workload import Group, Workload, plain_nodes
from tools.kubesim.dra import (
    CHANNEL_CLASS,
    CHANNEL_DRIVER,
    GPU_DRIVER,
    channel_slice,
    device_class,
    gpu_slice,
)
from tools.kubesim.storage import DRIVER as CSI_DRIVER
from tools.kubesim.storage import LIMIT_LABEL

__all__ = [
    "ATTACH_LIMIT",
    "DYNAMIC_CLASS",
    "STATIC_CLASS",
    "TEMPLATE",
    "ClaimsState",
    "dra_gpu_claims",
    "gpu_slices",
    "volume_binding",
]

Obj = dict[str, Any]

STATIC_CLASS = "local-storage"
"""Local volumes made by hand: no provisioner, WaitForFirstConsumer (Kubernetes' local volume setup)."""
DYNAMIC_CLASS = "csi-zonal"
"""Provisioned by the simulated CSI driver for the node chosen, in the first two zones only."""
ATTACH_LIMIT = 39
"""Volumes of the CSI driver each node can attach (scheduler_perf's CSINode allocatable for EBS)."""
ZONES = 3
ZONE_LABEL = "topology.kubernetes.io/zone"
HOSTNAME_LABEL = "kubernetes.io/hostname"
LOCAL_CAPACITY = "100Gi"
STATIC_REQUEST = "50Gi"
DYNAMIC_REQUEST = "10Gi"
TEMPLATE = "one-gpu"
"""The ResourceClaimTemplate every DRAGPUClaims pod names: one device of class ``gpu.nvidia.com``."""
CLAIM_ENTRY = "gpu"
"""The pod's ``spec.resourceClaims`` entry."""
GPU_MEMORY_MIB = 81920


# --- the objects, as users (and the simulated cluster) write them -------------------------------------------
def _storage_class(name: str, provisioner: str, zones: Iterable[str] = ()) -> Obj:
    obj: Obj = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": provisioner,
        "volumeBindingMode": "WaitForFirstConsumer",
    }
    if zones:
        obj["allowedTopologies"] = [{"matchLabelExpressions": [{"key": ZONE_LABEL, "values": list(zones)}]}]
    return obj


def _pinned(node: str) -> Obj:
    """A volume's required node affinity to one node by hostname."""
    term = {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
    return {"required": {"nodeSelectorTerms": [term]}}


def _local_volume(node: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"local-{node}"},
        "spec": {
            "capacity": {"storage": LOCAL_CAPACITY},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STATIC_CLASS,
            "persistentVolumeReclaimPolicy": "Retain",
            "local": {"path": "/mnt/disks/bench"},
            "nodeAffinity": _pinned(node),
        },
    }


def _claim(name: str, storage_class: str, request: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": request}},
        },
    }


def _csi_node(node: str) -> Obj:
    """The CSINode the simulated cluster makes for a node labelled with `LIMIT_LABEL`."""
    driver = {
        "name": CSI_DRIVER,
        "nodeID": node,
        "topologyKeys": [HOSTNAME_LABEL],
        "allocatable": {"count": ATTACH_LIMIT},
    }
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": node},
        "spec": {"drivers": [driver]},
    }


def _provisioned(claim: Claim, storage_class: str, node: str) -> Obj:
    """The volume the simulated CSI provisioner makes for `claim` on `node` (`tools.kubesim.storage`)."""
    name = f"pvc-{claim.uid or claim.name}"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": claim.request_bytes},
            "accessModes": list(claim.access_modes),
            "storageClassName": storage_class,
            "csi": {"driver": CSI_DRIVER, "volumeHandle": name},
            "nodeAffinity": _pinned(node),
        },
    }


def _template() -> Obj:
    request = {"name": CLAIM_ENTRY, "exactly": {"deviceClassName": GPU_DRIVER, "count": 1}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def gpu_slices(node: Node) -> list[Obj]:
    """The slices the simulated NVIDIA driver publishes for a GPU node (`tools.kubesim.dra`): its GPUs, and
    the IMEX channel every GPU node has."""
    memory = f"{node.gpu_memory_mib or GPU_MEMORY_MIB}Mi"
    return [gpu_slice(node.name, node.gpus, "NVIDIA-H100", memory), channel_slice(node.name)]


def _made_claim(pod: str) -> Obj:
    """The claim the resourceclaim controller makes from `TEMPLATE` for `pod` (named without its random
    suffix here)."""
    spec = _template()["spec"]["spec"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{pod}-{CLAIM_ENTRY}",
            "namespace": NAMESPACE,
            "annotations": {"resource.kubernetes.io/pod-claim-name": CLAIM_ENTRY},
        },
        "spec": spec,
    }


# --- translation, as the state service does it ---------------------------------------------------------------
_STORAGE_RESOURCES: dict[str, tuple[str, Callable[[Any], StorageObject]]] = {
    "PersistentVolumeClaim": ("persistentvolumeclaims", kube_volumes.claim_of),
    "PersistentVolume": ("persistentvolumes", kube_volumes.volume_of),
    "StorageClass": ("storageclasses", kube_volumes.class_of),
    "CSINode": ("csinodes", kube_volumes.csi_node_of),
}
_DRA_RESOURCES: dict[str, tuple[str, Callable[[Any], DraObject]]] = {
    "DeviceClass": ("deviceclasses", kube_dra.class_of),
    "ResourceSlice": ("resourceslices", kube_dra.slice_of),
    "ResourceClaim": ("resourceclaims", kube_dra.claim_of),
    "ResourceClaimTemplate": ("resourceclaimtemplates", kube_dra.template_of),
}


def storage_object(obj: Obj) -> StorageObject:
    """A storage manifest as the state service's storage mirror reads it."""
    resource, translate = _STORAGE_RESOURCES[obj["kind"]]
    return translate(kube_volumes.decode(resource, json.dumps(obj)))


def dra_object(obj: Obj) -> DraObject:
    """A DRA manifest as the state service's DRA mirror reads it."""
    resource, translate = _DRA_RESOURCES[obj["kind"]]
    return translate(kube_dra.decode(resource, json.dumps(obj)))


# --- the workloads --------------------------------------------------------------------------------------------
def _zoned(nodes: list[Node]) -> list[Node]:
    """Nodes with their hostname, a zone (round robin over `ZONES`) and the CSI attach limit label (the
    simulated cluster gives such a node a CSINode with that limit)."""
    return [
        msgspec.structs.replace(
            n,
            labels={
                HOSTNAME_LABEL: n.name,
                ZONE_LABEL: f"zone{i % ZONES + 1}",
                LIMIT_LABEL: str(ATTACH_LIMIT),
            },
        )
        for i, n in enumerate(nodes)
    ]


def _pods(
    names: list[str],
    nodes: list[Node],
    initial: int,
    measured: int,
    *,
    prefix: str,
    initial_gpus: float,
    measured_gpus: float,
    dress: Callable[[int, Pod], tuple[Pod, tuple[Obj, ...]]],
) -> tuple[list[Group], list[Group]]:
    """`initial` running single-pod groups spread one per node, then `measured` pending ones, each pod
    `dress`ed with its claims (and the objects to create before it)."""
    stride = max(1, len(nodes) // max(initial, 1))
    running: list[Group] = []
    for j in range(initial):
        pg, pods = gang(
            f"{prefix}-init-{j:05d}",
            names[j % len(names)],
            1,
            initial_gpus,
            created=float(j),
            status=PodStatus.RUNNING,
            nodes=[nodes[(j * stride) % len(nodes)].name],
        )
        pg = msgspec.structs.replace(pg, namespace=NAMESPACE)
        running.append(Group(pg, tuple(msgspec.structs.replace(p, namespace=NAMESPACE) for p in pods)))
    later: list[Group] = []
    for j in range(measured):
        pg, pods = gang(
            f"{prefix}-{j:05d}", names[j % len(names)], 1, measured_gpus, created=float(initial + j)
        )
        pg = msgspec.structs.replace(pg, namespace=NAMESPACE)
        pod, setup = dress(j, msgspec.structs.replace(pods[0], namespace=NAMESPACE))
        later.append(Group(pg, (pod,), setup=setup))
    return running, later


def volume_binding(nodes: int, initial: int, measured: int, queues: int = 10) -> Workload:
    """VolumeBinding: `nodes` zoned nodes with a local volume each; `initial` one-GPU pods running, then
    `measured` one-GPU pods each with a WaitForFirstConsumer claim, static and dynamic in turn."""
    node_list = _zoned(plain_nodes(nodes))
    names = [f"q{i}" for i in range(queues)]

    def dress(j: int, pod: Pod) -> tuple[Pod, tuple[Obj, ...]]:
        claim = f"{pod.name}-data"
        obj = (
            _claim(claim, STATIC_CLASS, STATIC_REQUEST)
            if j % 2 == 0
            else _claim(claim, DYNAMIC_CLASS, DYNAMIC_REQUEST)
        )
        return msgspec.structs.replace(pod, claims=(claim,)), (obj,)

    running, later = _pods(
        names, node_list, initial, measured, prefix="vol", initial_gpus=1.0, measured_gpus=1.0, dress=dress
    )
    setup = (
        _storage_class(STATIC_CLASS, "kubernetes.io/no-provisioner"),
        _storage_class(DYNAMIC_CLASS, CSI_DRIVER, [f"zone{z + 1}" for z in range(min(2, ZONES))]),
        *(_local_volume(n.name) for n in node_list),
    )
    made = [_csi_node(n.name) for n in node_list]
    objects = [storage_object(o) for o in (*setup, *made, *(o for g in later for o in g.setup))]
    return Workload(
        name="VolumeBinding",
        nodes=tuple(node_list),
        queues=tuple(flat_queues(names)),
        initial=tuple(running),
        measured=tuple(later),
        generated=False,
        setup=setup,
        volumes=Volumes.of(objects),
    )


def dra_gpu_claims(nodes: int, initial: int, measured: int, queues: int = 10) -> Workload:
    """DRAGPUClaims: `nodes` plain 8-GPU nodes, each with a ResourceSlice of its GPUs; `initial` CPU pods
    running, then `measured` pods each with a claim from `TEMPLATE` (one GPU through DRA)."""
    node_list = plain_nodes(nodes)
    names = [f"q{i}" for i in range(queues)]

    def dress(_j: int, pod: Pod) -> tuple[Pod, tuple[Obj, ...]]:
        entry = PodClaim(name=CLAIM_ENTRY, claim=f"{pod.name}-{CLAIM_ENTRY}", template=TEMPLATE)
        return msgspec.structs.replace(pod, resource_claims=(entry,)), ()

    running, later = _pods(
        names, node_list, initial, measured, prefix="dra", initial_gpus=0.0, measured_gpus=0.0, dress=dress
    )
    setup = (_template(),)
    made = [
        device_class(GPU_DRIVER, GPU_DRIVER),
        device_class(CHANNEL_CLASS, CHANNEL_DRIVER),
        *(s for n in node_list for s in gpu_slices(n)),
        *(_made_claim(p.name) for g in later for p in g.pods),
    ]
    return Workload(
        name="DRAGPUClaims",
        nodes=tuple(node_list),
        queues=tuple(flat_queues(names)),
        initial=tuple(running),
        measured=tuple(later),
        setup=setup,
        dra=Dra.of([dra_object(o) for o in (*setup, *made)]),
    )


# --- in process: what the binder and the simulated controllers do once a pod is bound ----------------------
class ClaimsState:
    """The storage and DRA objects of an in-process run, changed as the cluster changes them when a pod is
    bound: `bound(binding)` after each binding, `volumes` and `dra` for the next snapshot."""

    def __init__(self, workload: Workload) -> None:
        self._claims = {c.key: c for c in workload.volumes.claims}
        self._pvs = {v.name: v for v in workload.volumes.volumes}
        self._classes = {c.name: c for c in workload.volumes.classes}
        self._rest: tuple[StorageObject, ...] = (
            *workload.volumes.classes,
            *workload.volumes.csi_nodes,
            *workload.volumes.capacities,
        )
        self._dra_claims = {c.key: c for c in workload.dra.claims}
        self._dra_rest: tuple[DraObject, ...] = (
            *workload.dra.classes,
            *workload.dra.slices,
            *workload.dra.templates,
        )
        self.volumes = workload.volumes
        self.dra = workload.dra
        self._storage_changed = self._dra_changed = False

    def bound(self, binding: Binding) -> None:
        """Bind or provision `binding`'s volumes and write its DRA claims' allocations, as the binder and
        the simulated volume controller, provisioner and resourceclaim controller do."""
        for vb in binding.volumes:
            key = f"{binding.namespace}/{vb.claim}"
            claim = self._claims[key]
            if vb.volume:
                pv = self._pvs[vb.volume]
            else:
                storage_class = self._classes[claim.storage_class]
                made = storage_object(_provisioned(claim, storage_class.name, binding.node))
                assert isinstance(made, PersistentVolume)
                pv = made
            self._pvs[pv.name] = msgspec.structs.replace(
                pv, claim_ref=key, claim_uid=claim.uid, phase="Bound"
            )
            self._claims[key] = msgspec.structs.replace(claim, volume_name=pv.name, bound=True)
            self._storage_changed = True
        for ca in binding.claims:
            key = f"{binding.namespace}/{ca.claim}"
            dra_claim: ResourceClaim = self._dra_claims[key]
            user = binding.uid or binding.pod
            self._dra_claims[key] = msgspec.structs.replace(
                dra_claim,
                allocated=True,
                devices=ca.devices or dra_claim.devices,
                node=ca.node if ca.devices else dra_claim.node,
                reserved_for=(*dra_claim.reserved_for, user),
            )
            self._dra_changed = True

    def refresh(self) -> None:
        """Make `volumes` and `dra` show every change since the last refresh."""
        if self._storage_changed:
            self.volumes = Volumes.of([*self._rest, *self._pvs.values(), *self._claims.values()])
            self._storage_changed = False
        if self._dra_changed:
            self.dra = Dra.of([*self._dra_rest, *self._dra_claims.values()])
            self._dra_changed = False
