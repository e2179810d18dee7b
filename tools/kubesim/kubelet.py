"""What a simulated kubelet does when a bound pod's containers start, beyond reporting them running:
device admission, the containers' environment, and the reservation container's program.

Only pods that need it come here (`Kubelet.involved`): a pod asking for ``nvidia.com/gpu``, one taking
variables from ConfigMaps, or a pod of the reservation namespace; the node simulator starts every other
pod without any of this. `Kubelet.start` decides, in the kubelet's order:

1. **Admission** (`tools.kubesim.devices`): the containers get their devices, or the pod is refused
   (`Rejected`: phase Failed, reason ``UnexpectedAdmissionError``, message ``Pod was rejected: Allocate
   failed due to requested number of devices unavailable ...``), as the kubelet rejects a pod.
2. **Images** (`tools.kubesim.images`): a container whose image cannot be pulled (a registry host ending
   in ``.invalid``) keeps the pod Pending (`Waiting`) with the container waiting ``ErrImagePull``, then
   ``ImagePullBackOff`` from the next try on; the pod keeps its devices (admitted before the pull).
3. **Environment** (`tools.kubesim.containerenv`): a required ConfigMap or key that is missing keeps the
   pod Pending (`Waiting`) with the container waiting, reason ``CreateContainerConfigError``; the pod keeps
   its devices, and the node simulator tries again when a ConfigMap of its namespace changes and every
   `CONFIG_RETRY_SECONDS`, as the kubelet's pod worker does (and as it backs off an image pull).
4. **Start** (`Started`): what each container sees is recorded (`ContainerView`: the UUIDs the device
   plugin gave it, its resolved ``NVIDIA_VISIBLE_DEVICES``, which the device plugin sets for a container
   that asked for devices and the pod spec sets otherwise). The container ``resource-reservation`` of a pod
   in namespace ``kai-resource-reservation`` runs the reservation program (`reservation_patch`): NVML
   (`devices.FakeNvml` over its devices) read by `shared.kube.gpu_sharing.visible_device_uuids`, the
   result written by `reserved_device_patch`; the node simulator applies it to the pod as a merge patch.

A pod holds its devices and its record until it is deleted or terminates (`forget`). `node_devices` is
what ``GET /kubesim/v1/nodes/{node}/devices`` answers. Used by `tools.kubesim.nodesim`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.kube.gpu_sharing import (
    NVIDIA_VISIBLE_DEVICES,
    RESERVATION_CONTAINER,
    RESERVATION_NAMESPACE,
    reserved_device_patch,
    visible_device_uuids,
)
from tools.kubesim import dra, storage
from tools.kubesim.containerenv import (
    CONFIG_ERROR,
    ContainerConfigError,
    references_configmaps,
    resolve_env,
)
from tools.kubesim.devices import (
    DevicePlugin,
    FakeNvml,
    PodDevices,
    Refusal,
    device_count,
    device_uuid,
    node_device_uuids,
    requests_gpus,
)
from tools.kubesim.images import (
    ERR_IMAGE_PULL,
    IMAGE_PULL_BACKOFF,
    backoff_message,
    pull_failure,
    pulls_failing,
)
from tools.kubesim.operators.numa import NumaKubelet, may_align

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = [
    "CONFIG_RETRY_SECONDS",
    "ContainerView",
    "Kubelet",
    "PodRecord",
    "Rejected",
    "Started",
    "Waiting",
    "crashed_reservation",
    "rejected_pod",
    "reservation_patch",
    "waiting_pod",
]

Obj = dict[str, Any]

CONFIG_RETRY_SECONDS = 10.0
"""How often a pod whose containers wait for a ConfigMap is tried again (the kubelet's pod worker backs off
10 s after a failed sync)."""


@dataclass(frozen=True)
class ContainerView:
    """What one container of a started pod sees."""

    name: str
    init: bool
    devices: tuple[str, ...]
    """UUIDs of the devices the device plugin gave it, in index order."""
    visible: str | None
    """Its ``NVIDIA_VISIBLE_DEVICES``: the device plugin's for a container with devices, else the pod
    spec's (a literal or a ConfigMap value), None when unset."""
    env: dict[str, str] = field(default_factory=dict)
    """Its variables from literals and ConfigMaps."""


@dataclass(frozen=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    node: str
    containers: tuple[ContainerView, ...]


@dataclass(frozen=True)
class Rejected:
    """The kubelet does not admit the pod."""

    refusal: Refusal


@dataclass(frozen=True)
class Waiting:
    """A container's image cannot be pulled or its configuration cannot be built: the pod stays Pending."""

    problems: dict[tuple[bool, str], str]
    """(init container?, name) -> the kubelet's message, for the containers that cannot be created."""
    init_blocked: bool
    """An init container cannot be created, so nothing after it starts."""
    reasons: dict[tuple[bool, str], str] = field(default_factory=dict)
    """(init container?, name) -> the waiting reason where it is not ``CreateContainerConfigError``."""
    events: tuple[tuple[str, str, str], ...] = ()
    """(type, reason, message) of the Events the kubelet records for the image pulls of this try."""


@dataclass(frozen=True)
class Started:
    record: PodRecord
    reservation: tuple[str, ...] | None = None
    """The UUIDs the reservation container was given, when the pod runs one."""


def reservation_patch(uuids: Sequence[str]) -> dict[str, Any]:
    """What the reservation container's program does with the devices it was given: NVML lists them, it
    writes the one it holds into its pod's annotation. `InvalidObject` when it sees none or several."""
    nvml = FakeNvml(uuids)
    nvml.nvmlInit()
    try:
        seen = visible_device_uuids(nvml)
    finally:
        nvml.nvmlShutdown()
    return reserved_device_patch(seen)


class Kubelet:
    """Device plugin state and container views of every simulated node."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.plugin = DevicePlugin()
        self.records: dict[str, PodRecord] = {}
        """Started pods' containers, by pod uid."""
        self.waiting: dict[str, dict[str, str]] = {}
        """namespace -> pod uid -> pod name, for pods whose containers wait for a ConfigMap."""
        self.tracked: dict[str, str] = {}
        """pod uid -> namespace, for every pod holding devices, a record or a wait."""
        self.numa = NumaKubelet(cluster)
        """The Topology Manager's admission and the NodeResourceTopology objects (`operators.numa`)."""

    @staticmethod
    def involved(pod: Obj) -> bool:
        """Whether the pod's start needs the kubelet's work (devices, ConfigMap variables, a reservation)."""
        spec = pod["spec"]
        inits = spec.get("initContainers") or ()
        containers = spec.get("containers") or ()
        return (
            pod["metadata"].get("namespace") == RESERVATION_NAMESPACE
            or requests_gpus(containers)
            or requests_gpus(inits)
            or references_configmaps(containers)
            or references_configmaps(inits)
            or pulls_failing(containers)
            or pulls_failing(inits)
            or may_align(pod)
            or bool(storage.claims_of(pod))
            or dra.has_claims(pod)
        )

    def start(self, pod: Obj) -> Rejected | Waiting | Started:
        """Admit the pod's devices, resolve its containers' environment (see the module docstring)."""
        md = pod["metadata"]
        spec = pod["spec"]
        uid = str(md.get("uid", ""))
        ns = str(md.get("namespace", ""))
        node = str(spec.get("nodeName", ""))
        inits = spec.get("initContainers") or ()
        apps = spec.get("containers") or ()
        devices: PodDevices | None = None
        topology = self.numa.admit(pod, node)
        if topology is not None:
            return Rejected(topology)
        if unbound := storage.unmounted(self.cluster, pod):
            first = (False, str((apps or [{}])[0].get("name", "")))
            message = storage.mount_message(unbound)
            self.tracked[uid] = ns
            return Waiting(
                {first: message}, False, {first: "ContainerCreating"}, (("Warning", "FailedMount", message),)
            )
        if waiting := dra.unprepared(self.cluster, pod):
            first = (False, str((apps or [{}])[0].get("name", "")))
            message = f"waiting for resource claims {', '.join(waiting)} to be allocated and reserved"
            self.tracked[uid] = ns
            return Waiting({first: message}, False, {first: "ContainerCreating"}, ())
        if requests_gpus(apps) or requests_gpus(inits):
            admitted = self.plugin.admit(pod, node, device_count(self.cluster.find("nodes", None, node)))
            if isinstance(admitted, Refusal):
                return Rejected(admitted)
            devices = admitted
            if devices.grants:
                self.tracked[uid] = ns
        configmaps = self.cluster.store.storage("configmaps")

        def lookup(name: str) -> Obj | None:
            return configmaps.get(ns, name)

        problems: dict[tuple[bool, str], str] = {}
        reasons: dict[tuple[bool, str], str] = {}
        events: list[tuple[str, str, str]] = []
        waited = _waiting_reasons(pod)
        views: list[ContainerView] = []
        init_blocked = False
        for init, containers in ((True, inits), (False, apps)):
            for container in containers:
                name = str(container.get("name", ""))
                image = str(container.get("image", ""))
                failure = pull_failure(image)
                if failure is not None:
                    key = (init, name)
                    if waited.get(key) in (ERR_IMAGE_PULL, IMAGE_PULL_BACKOFF):
                        reasons[key], problems[key] = IMAGE_PULL_BACKOFF, backoff_message(image)
                        events.append(("Normal", "BackOff", backoff_message(image)))
                    else:
                        reasons[key], problems[key] = ERR_IMAGE_PULL, failure
                        events.append(("Warning", "Failed", f'Failed to pull image "{image}": {failure}'))
                    if init:
                        init_blocked = True
                        break
                    continue
                try:
                    env = resolve_env(container, ns, lookup)
                except ContainerConfigError as exc:
                    problems[init, name] = str(exc)
                    if init:
                        init_blocked = True
                        break
                    continue
                indexes = devices.of(name, init=init) if devices is not None else ()
                uuids = tuple(device_uuid(node, i) for i in indexes)
                visible = ",".join(uuids) if uuids else env.get(NVIDIA_VISIBLE_DEVICES)
                views.append(ContainerView(name, init, uuids, visible, env))
            if init_blocked:
                break
        if problems:
            self.waiting.setdefault(ns, {})[uid] = str(md["name"])
            self.tracked[uid] = ns
            return Waiting(problems, init_blocked, reasons, tuple(events))
        self._unwait(ns, uid)
        record = PodRecord(uid, ns, str(md["name"]), node, tuple(views))
        self.records[uid] = record
        self.tracked[uid] = ns
        self.numa.record(pod, node)
        reservation = None
        if ns == RESERVATION_NAMESPACE:
            reservation = next(
                (v.devices for v in views if v.name == RESERVATION_CONTAINER and not v.init), None
            )
        return Started(record, reservation)

    def _unwait(self, ns: str, uid: str) -> None:
        waiting = self.waiting.get(ns)
        if waiting is not None:
            waiting.pop(uid, None)
            if not waiting:
                del self.waiting[ns]

    def forget(self, uid: str) -> None:
        """The pod was deleted or terminated: its devices return to the node, its record goes."""
        self.numa.release(uid)
        ns = self.tracked.pop(uid, None)
        if ns is None:
            return
        self.plugin.release(uid)
        self.records.pop(uid, None)
        self._unwait(ns, uid)

    def node_devices(self, node: str) -> Obj | None:
        """The node's devices and what the containers of its running pods see (None: no such node)."""
        node_obj = self.cluster.find("nodes", None, node)
        if node_obj is None:
            return None
        pods = sorted(
            self.cluster.store.storage("pods").indexed("spec.nodeName", node),
            key=lambda p: (p["metadata"].get("namespace", ""), p["metadata"]["name"]),
        )
        containers: list[Obj] = []
        for pod in pods:
            if (pod.get("status") or {}).get("phase") != "Running":
                continue
            md = pod["metadata"]
            record = self.records.get(str(md.get("uid", "")))
            views = record.containers if record is not None else self._unrecorded(pod)
            containers.extend(
                {
                    "namespace": md.get("namespace", ""),
                    "pod": md["name"],
                    "container": view.name,
                    "init": view.init,
                    "devices": list(view.devices),
                    "visible": view.visible,
                }
                for view in views
            )
        return {
            "node": node,
            "devices": list(node_device_uuids(node, device_count(node_obj))),
            "containers": containers,
        }

    @staticmethod
    def _unrecorded(pod: Obj) -> tuple[ContainerView, ...]:
        """The views of a running pod the kubelet did not start with devices or ConfigMaps (an ordinary
        pod): no devices, ``NVIDIA_VISIBLE_DEVICES`` only from a literal."""
        spec = pod.get("spec") or {}
        views = []
        for init, containers in (
            (True, spec.get("initContainers") or ()),
            (False, spec.get("containers") or ()),
        ):
            for container in containers:
                visible = None
                for var in container.get("env") or ():
                    if isinstance(var, dict) and var.get("name") == NVIDIA_VISIBLE_DEVICES and "value" in var:
                        visible = str(var["value"])
                views.append(ContainerView(str(container.get("name", "")), init, (), visible))
        return tuple(views)


# --- the pod statuses the kubelet writes --------------------------------------------------------------------
def _waiting_reasons(pod: Obj) -> dict[tuple[bool, str], str]:
    """(init container?, name) -> the reason its status says it waits for, for the waiting containers."""
    status = pod.get("status") or {}
    out: dict[tuple[bool, str], str] = {}
    for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses")):
        for cs in status.get(key) or ():
            waiting = (cs.get("state") or {}).get("waiting")
            if isinstance(waiting, dict) and waiting.get("reason"):
                out[init, str(cs.get("name", ""))] = str(waiting["reason"])
    return out


def rejected_pod(pod: Obj, refusal: Refusal) -> Obj:
    """The pod as the kubelet leaves a pod it refused: Failed, with the reason and message."""
    status = {
        **(pod.get("status") or {}),
        "phase": "Failed",
        "reason": refusal.reason,
        "message": f"Pod was rejected: {refusal.message}",
    }
    return {**pod, "metadata": dict(pod["metadata"]), "status": status}


def _waiting(container: Obj, reason: str, message: str = "") -> Obj:
    state: Obj = {"reason": reason}
    if message:
        state["message"] = message
    image = container.get("image", "")
    return {
        "name": container.get("name", ""),
        "state": {"waiting": state},
        "lastState": {},
        "ready": False,
        "restartCount": 0,
        "image": image,
        "imageID": "",
        "started": False,
    }


def _condition(type_: str, state: str, ts: str, reason: str = "", message: str = "") -> Obj:
    out: Obj = {"type": type_, "status": state, "lastProbeTime": None, "lastTransitionTime": ts}
    if reason:
        out["reason"] = reason
        out["message"] = message
    return out


def waiting_pod(pod: Obj, waiting: Waiting, ts: str) -> Obj:
    """The pod as the kubelet reports it while containers wait for their image or configuration (Pending):
    the failing containers waiting ``ErrImagePull``, ``ImagePullBackOff`` or ``CreateContainerConfigError``,
    the others ``ContainerCreating`` (or
    ``PodInitializing`` behind an init container); init containers before a failing one completed."""
    spec = pod["spec"]
    old = pod.get("status") or {}
    init_statuses: list[Obj] = []
    failing_seen = False
    for container in spec.get("initContainers") or ():
        name = container.get("name", "")
        problem = waiting.problems.get((True, name))
        if problem is not None:
            init_statuses.append(
                _waiting(container, waiting.reasons.get((True, name), CONFIG_ERROR), problem)
            )
            failing_seen = True
        elif failing_seen:
            init_statuses.append(_waiting(container, "PodInitializing"))
        else:
            init_statuses.append(
                {
                    **_waiting(container, "Completed"),
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                    "ready": True,
                }
            )
    statuses = []
    for container in spec.get("containers") or ():
        key = (False, str(container.get("name", "")))
        problem = waiting.problems.get(key)
        if problem is not None:
            statuses.append(_waiting(container, waiting.reasons.get(key, CONFIG_ERROR), problem))
        else:
            statuses.append(
                _waiting(container, "PodInitializing" if waiting.init_blocked else "ContainerCreating")
            )
    unready = " ".join(str(c.get("name", "")) for c in spec.get("containers") or ())
    conditions = [
        _condition("PodReadyToStartContainers", "True", ts),
        (
            _condition(
                "Initialized",
                "False",
                ts,
                "ContainersNotInitialized",
                "containers with incomplete status: ["
                + " ".join(str(s["name"]) for s in init_statuses if "waiting" in s["state"])
                + "]",
            )
            if waiting.init_blocked
            else _condition("Initialized", "True", ts)
        ),
        _condition(
            "Ready", "False", ts, "ContainersNotReady", f"containers with unready status: [{unready}]"
        ),
        _condition(
            "ContainersReady",
            "False",
            ts,
            "ContainersNotReady",
            f"containers with unready status: [{unready}]",
        ),
        *(c for c in old.get("conditions") or () if c.get("type") == "PodScheduled"),
    ]
    status: Obj = {**old, "phase": "Pending", "conditions": conditions, "containerStatuses": statuses}
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    return {**pod, "metadata": dict(pod["metadata"]), "status": status}


def crashed_reservation(pod: Obj, container: str, message: str, ts: str) -> Obj:
    """The running reservation pod after its program failed: the container waits to restart
    (CrashLoopBackOff) after exiting 1, so the pod is not ready."""
    old = pod.get("status") or {}
    statuses = []
    for cs in old.get("containerStatuses") or ():
        if cs.get("name") != container:
            statuses.append(cs)
            continue
        statuses.append(
            {
                **cs,
                "state": {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off 10s restarting failed container={container} "
                        f"pod={pod['metadata']['name']}_{pod['metadata'].get('namespace', '')}",
                    }
                },
                "lastState": {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "message": message,
                        "startedAt": ts,
                        "finishedAt": ts,
                    }
                },
                "ready": False,
                "started": False,
                "restartCount": 1,
            }
        )
    conditions = [
        (
            {**c, "status": "False", "lastTransitionTime": ts, "reason": "ContainersNotReady"}
            if c.get("type") in ("Ready", "ContainersReady")
            else c
        )
        for c in old.get("conditions") or ()
    ]
    status = {**old, "conditions": conditions, "containerStatuses": statuses}
    return {**pod, "metadata": dict(pod["metadata"]), "status": status}
