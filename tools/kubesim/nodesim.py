"""The node simulator (KWOK-like): what the kubelets of the simulated nodes would report.

- A node without a kubelet status gets one (`complete_node`): Ready and the pressure conditions, an
  InternalIP and Hostname address, nodeInfo with a kubelet version, capacity and allocatable (each from the
  other, or KWOK's defaults of 32 cpu, 256Gi memory, 110 pods when both are missing). A node whose Ready
  condition someone set stays as they set it.
- A pod bound to a node (spec.nodeName set) turns Running `run_delay` seconds later: phase Running,
  conditions PodReadyToStartContainers/Initialized/ContainersReady/Ready/PodScheduled True,
  containerStatuses ready and running, podIP, hostIP, startTime.
- A pod that asks for ``nvidia.com/gpu``, takes variables from ConfigMaps or runs in the reservation
  namespace starts through `tools.kubesim.kubelet` (device admission, the containers' environment, the
  reservation container's program): it may be refused (Failed), wait for a ConfigMap (Pending, tried
  again when a ConfigMap of its namespace changes and every 10 s) or run, its devices held until it is
  deleted or terminates. Other pods skip that work entirely.
- A running pod with the label or annotation `kairos.io/run-seconds: "N"` turns Succeeded N seconds after it
  started (containerStatuses terminated with exit code 0, reason Completed); so does, at once, a pod whose
  containers run the Kairos image's entrypoint as it is (`exits_at_once`: a scaling pod); any other pod
  runs until deleted. Restart policies are not simulated: the pod of a Deployment succeeds too.
- Graceful termination, for a pod with the label or annotation `kairos.io/stop-seconds: "N"` (its
  containers take N seconds to exit after the kubelet's SIGTERM): deleted on its node with a grace period
  (the DELETE's ``gracePeriodSeconds``, else the pod's ``terminationGracePeriodSeconds``, else 30;
  `termination_grace`), it stays, Running, with ``deletionTimestamp`` and ``deletionGracePeriodSeconds``
  set, holding its devices. min(N, grace) seconds later its containers have stopped: phase Succeeded (they
  exited 0 by themselves) or Failed (killed at the end of the grace period, exit code 137), and the kubelet
  deletes it with grace 0, as its status manager does. A DELETE with grace 0 removes it at once (``kubectl
  delete --force``); a shorter grace shortens the wait. A pod without the label, an unbound pod or a
  finished one is deleted at once (containers that exit as soon as they are told).

Time is the cluster's clock; `run_once(now)` fires what is due and `next_deadline()` says when the next
timer is due, so tests drive it without sleeping. Called from `Cluster.settle`. Pure: no I/O.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import TYPE_CHECKING, Any

import msgspec

from shared.errors import InvalidObject
from shared.kube.gpu_sharing import RESERVATION_CONTAINER
from tools.kubesim.kubelet import (
    CONFIG_RETRY_SECONDS,
    Kubelet,
    Rejected,
    Started,
    Waiting,
    crashed_reservation,
    rejected_pod,
    reservation_patch,
    waiting_pod,
)
from tools.kubesim.nodes import KUBELET_VERSION
from tools.kubesim.objects import meta, parse_time, rfc3339
from tools.kubesim.store import Change, Key

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = [
    "RUN_SECONDS",
    "STOP_SECONDS",
    "NodeSimulator",
    "exits_at_once",
    "run_seconds_of",
    "stop_seconds_of",
    "termination_grace",
]

Obj = dict[str, Any]

RUN_SECONDS = "kairos.io/run-seconds"
"""Pod label or annotation: seconds the pod runs before it succeeds (shared.clusterfile.RUN_SECONDS_LABEL)."""
STOP_SECONDS = "kairos.io/stop-seconds"
"""Pod label or annotation: seconds its containers take to exit after SIGTERM (graceful termination)."""
DEFAULT_GRACE_SECONDS = 30
"""The API server's default ``terminationGracePeriodSeconds``."""
KILLED_EXIT_CODE = 137
"""A container killed (SIGKILL) at the end of its grace period."""
_KWOK_DEFAULT_RESOURCES = {"cpu": "32", "memory": "256Gi", "pods": "110"}
_TERMINATED = ("Succeeded", "Failed")


def run_seconds_of(pod: Obj) -> float | None:
    """The pod's simulated run time, None when it runs until deleted (or the value is not a number >= 0).
    A pod whose every container runs the Kairos image's entrypoint as it is (`exits_at_once`) runs 0 s."""
    seconds = _seconds(pod, RUN_SECONDS)
    if seconds is None and exits_at_once(pod):
        return 0.0
    return seconds


KAIROS_IMAGE = "kairos"
"""The Kairos image's repository name; its entrypoint without a command prints its help and exits 0."""


def exits_at_once(pod: Obj) -> bool:
    """Whether every container runs the Kairos image (``kairos``, any registry or tag) with no command or
    arguments of its own, which exits at once (`kairos --help`), as the node-scale-adjuster's scaling pods
    do: bound, they end and give their GPU back."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if not isinstance(containers, list) or not containers:
        return False
    for c in containers:
        if not isinstance(c, dict) or c.get("command") or c.get("args"):
            return False
        image = c.get("image")
        if not isinstance(image, str):
            return False
        repository = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
        if repository != KAIROS_IMAGE:
            return False
    return True


def stop_seconds_of(pod: Obj) -> float | None:
    """How long the pod's containers take to exit after SIGTERM; None: at once (no graceful termination)."""
    return _seconds(pod, STOP_SECONDS)


def termination_grace(pod: Obj, options: Obj) -> int | None:
    """The grace period a DELETE with `options` (DeleteOptions) gives `pod`: seconds it stays terminating
    on its node; None when it is removed at once (see the module docstring)."""
    spec = pod.get("spec") or {}
    if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in _TERMINATED:
        return None
    if stop_seconds_of(pod) is None:
        return None
    grace = options.get("gracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not math.isfinite(grace):
        return None
    return int(grace) if grace > 0 else None


def _seconds(pod: Obj, key: str) -> float | None:
    md = meta(pod)
    value = (md.get("labels") or {}).get(key) or (md.get("annotations") or {}).get(key)
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _container_status(container: Obj, uid: str, state: Obj, *, started: bool) -> Obj:
    """A container's status as the kubelet reports it once the container is up (or, for an init
    container, done): in `state`, ready, never restarted, its image, an id made from the pod's uid."""
    name = container.get("name", "")
    image = container.get("image", "")
    return {
        "name": name,
        "state": state,
        "lastState": {},
        "ready": True,
        "restartCount": 0,
        "image": image,
        "imageID": f"kubesim://{image}",
        "containerID": f"kubesim://{uid[:8]}-{name}",
        "started": started,
    }


def _ip(base: int, n: int) -> str:
    value = base + n
    return ".".join(str((value >> shift) & 255) for shift in (24, 16, 8, 0))


_POD_IP_BASE = 10 << 24  # 10.0.0.0/8
_NODE_IP_BASE = (172 << 24) | (16 << 16)  # 172.16.0.0/12


class NodeSimulator:
    """Kubelet behaviour of every simulated node."""

    def __init__(self, cluster: Cluster, *, run_delay: float) -> None:
        self.cluster = cluster
        self.run_delay = run_delay
        self.timers: list[tuple[float, int, str, str, str, str]] = []
        """Heap of (deadline, sequence, action "start" | "retry" | "finish", namespace, name, pod uid);
        "retry" is a start tried again at once because a ConfigMap it waits for changed."""
        self._seq = itertools.count()
        self.scheduled: set[tuple[str, str]] = set()
        """(pod uid, action) already on the heap."""
        self.started_at: dict[str, float] = {}
        self.stop_at: dict[str, float] = {}
        """Pod uid -> when the containers of a terminating pod have stopped (its earliest planned stop)."""
        self.dirty_pods: dict[Key, None] = {}
        self.dirty_nodes: dict[str, None] = {}
        self._pod_ips = itertools.count(1)
        self._conditions: dict[tuple[str, str], list[Obj]] = {}
        self._node_ips = itertools.count(1)
        self._host_ips: dict[str, tuple[Obj, str]] = {}
        """Node name -> (the node object it was read from, its InternalIP): read again once the node changed."""
        self.kubelet = Kubelet(cluster)
        """Devices, container environments and reservation programs (`tools.kubesim.kubelet`)."""
        cluster.store.storage("pods").listeners.append(self._pod_change)
        cluster.store.storage("nodes").listeners.append(self._node_change)
        cluster.store.storage("configmaps").listeners.append(self._configmap_change)

    def _pod_change(self, change: Change) -> None:
        md = change.obj["metadata"]
        tracked = self.kubelet.tracked
        if change.type == "DELETED":
            uid = md.get("uid", "")
            self.started_at.pop(uid, None)
            self.scheduled.discard((uid, "start"))
            self.scheduled.discard((uid, "retry"))
            self.scheduled.discard((uid, "finish"))
            self.stop_at.pop(uid, None)
            if tracked:
                self.kubelet.forget(uid)
            return
        if tracked and (change.obj.get("status") or {}).get("phase") in _TERMINATED:
            self.kubelet.forget(md.get("uid", ""))
        if (change.obj.get("spec") or {}).get("nodeName"):
            self.dirty_pods[md.get("namespace", ""), md["name"]] = None

    def _configmap_change(self, change: Change) -> None:
        """A ConfigMap changed: the pods of its namespace waiting for one try to start again now."""
        waiting = self.kubelet.waiting.get(change.obj["metadata"].get("namespace", ""))
        if not waiting:
            return
        now = self.cluster.now()
        ns = change.obj["metadata"].get("namespace", "")
        for uid, name in list(waiting.items()):
            self._push_key(now, "retry", ns, name, uid)

    def _node_change(self, change: Change) -> None:
        if change.type != "DELETED":
            self.dirty_nodes[change.obj["metadata"]["name"]] = None

    @staticmethod
    def termination_grace(pod: Obj, options: Obj) -> int | None:
        """`termination_grace`: the cluster's DELETE asks the kubelet whether the pod terminates gracefully."""
        return termination_grace(pod, options)

    def next_deadline(self) -> float | None:
        return self.timers[0][0] if self.timers else None

    # --- nodes --------------------------------------------------------------------------------------------------
    def complete_node(self, node: Obj) -> bool:
        """Fill in what a kubelet reports about its node (in place); True when anything was missing."""
        status = node.setdefault("status", {})
        changed = False
        capacity = status.get("capacity")
        allocatable = status.get("allocatable")
        if not capacity or not allocatable:
            resources = dict(capacity or allocatable or _KWOK_DEFAULT_RESOURCES)
            status["capacity"] = dict(capacity or resources)
            status["allocatable"] = dict(allocatable or resources)
            changed = True
        now = rfc3339(self.cluster.now())
        if not any(c.get("type") == "Ready" for c in status.get("conditions") or ()):
            conditions = list(status.get("conditions") or ())
            for type_, state, reason, message in (
                (
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ):
                if not any(c.get("type") == type_ for c in conditions):
                    conditions.append(
                        {
                            "type": type_,
                            "status": state,
                            "reason": reason,
                            "message": message,
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    )
            status["conditions"] = conditions
            changed = True
        if not status.get("addresses"):
            status["addresses"] = [
                {"type": "InternalIP", "address": _ip(_NODE_IP_BASE, next(self._node_ips))},
                {"type": "Hostname", "address": meta(node).get("name", "")},
            ]
            changed = True
        if not status.get("nodeInfo"):
            status["nodeInfo"] = {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "6.1.0-kubesim",
                "osImage": "kubesim (simulated node)",
                "containerRuntimeVersion": "kubesim://1.0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "operatingSystem": "linux",
                "architecture": "amd64",
            }
            status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": 10250}}
            changed = True
        return changed

    def _adopt_nodes(self) -> bool:
        if not self.dirty_nodes:
            return False
        storage = self.cluster.store.storage("nodes")
        names = list(self.dirty_nodes)
        self.dirty_nodes.clear()
        wrote = False
        for name in names:
            node = storage.get("", name)
            if node is None:
                continue
            candidate = {**node, "metadata": dict(node["metadata"]), "status": dict(node.get("status") or {})}
            if self.complete_node(candidate):
                self.cluster.store.put("nodes", candidate)
                wrote = True
        return wrote

    # --- pods ---------------------------------------------------------------------------------------------------
    def _push(self, at: float, action: str, pod: Obj) -> None:
        md = pod["metadata"]
        self._push_key(at, action, md.get("namespace", ""), md["name"], md.get("uid", ""))

    def _push_key(self, at: float, action: str, namespace: str, name: str, uid: str) -> None:
        if (uid, action) in self.scheduled:
            return
        self.scheduled.add((uid, action))
        heapq.heappush(self.timers, (at, next(self._seq), action, namespace, name, uid))

    def _plan(self, now: float) -> None:
        storage = self.cluster.store.storage("pods")
        keys = list(self.dirty_pods)
        self.dirty_pods.clear()
        for key in keys:
            pod = storage.get(*key)
            if pod is None:
                continue
            phase = (pod.get("status") or {}).get("phase")
            if pod["metadata"].get("deletionTimestamp"):
                if pod["metadata"].get("deletionGracePeriodSeconds") and phase not in _TERMINATED:
                    self._plan_stop(pod, phase, now)
                continue
            if phase == "Pending" and pod["spec"].get("nodeName"):
                self._push(now + self.run_delay, "start", pod)
            elif phase == "Running":
                seconds = run_seconds_of(pod)
                if seconds is not None:
                    uid = pod["metadata"].get("uid", "")
                    start = self.started_at.get(uid)
                    if start is None:
                        start = parse_time((pod.get("status") or {}).get("startTime")) or now
                    self._push(start + seconds, "finish", pod)

    def _plan_stop(self, pod: Obj, phase: str | None, now: float) -> None:
        """A terminating pod: its containers stop `stop_seconds_of` after SIGTERM, at most its grace."""
        md = pod["metadata"]
        uid = md.get("uid", "")
        grace = float(md.get("deletionGracePeriodSeconds") or 0)
        running = phase == "Running"
        at = now + (min(stop_seconds_of(pod) or 0.0, grace) if running else 0.0)
        if uid in self.stop_at and self.stop_at[uid] <= at:
            return
        self.stop_at[uid] = at
        heapq.heappush(self.timers, (at, next(self._seq), "stop", md.get("namespace", ""), md["name"], uid))

    def _stop(self, pod: Obj, now: float) -> None:
        """The terminating pod's containers have stopped: its terminal status, then the kubelet's delete."""
        md = pod["metadata"]
        uid = md.get("uid", "")
        self.stop_at.pop(uid, None)
        stop = stop_seconds_of(pod)
        grace = float(md.get("deletionGracePeriodSeconds") or 0)
        killed = (pod.get("status") or {}).get("phase") != "Running" or stop is None or stop >= grace
        self.cluster.store.put("pods", self._finished(pod, now, KILLED_EXIT_CODE if killed else 0))
        self.started_at.pop(uid, None)
        self.cluster.delete(
            self.cluster.type_of("pods"),
            md.get("namespace", ""),
            md["name"],
            {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
        )

    def run_once(self, now: float) -> bool:
        """Complete new nodes, plan timers for changed pods, fire the timers due at `now`."""
        progressed = self._adopt_nodes()
        if self.dirty_pods:
            self._plan(now)
        storage = self.cluster.store.storage("pods")
        while self.timers and self.timers[0][0] <= now:
            _, _, action, ns, name, uid = heapq.heappop(self.timers)
            self.scheduled.discard((uid, action))
            pod = storage.get(ns, name)
            if pod is None or pod["metadata"].get("uid") != uid:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                if action == "stop" and self.stop_at.get(uid, math.inf) <= now:
                    self._stop(pod, now)
                    progressed = True
                continue
            phase = (pod.get("status") or {}).get("phase")
            if action in ("start", "retry") and phase == "Pending" and pod["spec"].get("nodeName"):
                if self.kubelet.involved(pod):
                    progressed = self._start_with_kubelet(pod, now) or progressed
                else:
                    self.cluster.store.put("pods", self._running(pod, now))
                    self.started_at[uid] = now
                    progressed = True
            elif action == "finish" and phase == "Running":
                self.cluster.store.put("pods", self._finished(pod, now, 0))
                self.started_at.pop(uid, None)
                progressed = True
        return progressed

    def _start_with_kubelet(self, pod: Obj, now: float) -> bool:
        """Start a pod that needs devices, ConfigMap variables or runs a reservation (`Kubelet.start`)."""
        outcome = self.kubelet.start(pod)
        store = self.cluster.store
        match outcome:
            case Rejected(refusal):
                store.put("pods", rejected_pod(pod, refusal))
                self.cluster.record_event(pod, "Warning", refusal.reason, refusal.message, "kubelet")
                return True
            case Waiting():
                self._push(now + CONFIG_RETRY_SECONDS, "start", pod)
                waiting = waiting_pod(pod, outcome, rfc3339(now))
                old, new = pod.get("status") or {}, waiting["status"]
                if all(new.get(k) == old.get(k) for k in ("containerStatuses", "initContainerStatuses")):
                    return False  # waiting as before: nothing to report again
                store.put("pods", waiting)
                for type_, reason, message in outcome.events:
                    self.cluster.record_event(pod, type_, reason, message, "kubelet")
                if not outcome.events:
                    message = next(iter(outcome.problems.values()))
                    self.cluster.record_event(pod, "Warning", "Failed", f"Error: {message}", "kubelet")
                return True
            case Started(record, reservation):
                running = store.put("pods", self._running(pod, now))
                self.started_at[record.uid] = now
                if reservation is not None:
                    self._run_reservation(running, reservation, now)
                return True

    def _run_reservation(self, pod: Obj, uuids: tuple[str, ...], now: float) -> None:
        """The reservation container's program: read NVML, annotate its own pod with the device."""
        md = pod["metadata"]
        try:
            patch = reservation_patch(uuids)
        except InvalidObject as exc:
            self.cluster.store.put(
                "pods", crashed_reservation(pod, RESERVATION_CONTAINER, exc.problem, rfc3339(now))
            )
            self.cluster.record_event(
                pod,
                "Warning",
                "BackOff",
                f"Back-off restarting failed container {RESERVATION_CONTAINER}",
                "kubelet",
            )
            return
        self.cluster.patch(
            self.cluster.type_of("pods"),
            md.get("namespace", ""),
            md["name"],
            "application/merge-patch+json",
            msgspec.json.encode(patch),
        )

    def _host_ip(self, node_name: str) -> str:
        node = self.cluster.store.storage("nodes").get("", node_name)
        known = self._host_ips.get(node_name)
        if known is not None and known[0] is node:
            return known[1]
        ip = ""
        for address in ((node or {}).get("status") or {}).get("addresses") or ():
            if address.get("type") == "InternalIP":
                ip = str(address.get("address", ""))
                break
        if node is not None:
            self._host_ips[node_name] = (node, ip)
        return ip

    def _running_conditions(self, ts: str, scheduled: Obj) -> list[Obj]:
        """The conditions of a pod that started at `ts`: one shared list per (start, scheduled) second, as
        pods start in bursts (a whole gang at once)."""
        key = (ts, str(scheduled.get("lastTransitionTime", "")))
        cached = self._conditions.get(key)
        if cached is None:
            if len(self._conditions) > 16:
                self._conditions.clear()
            fresh = [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
            ] + [scheduled]
            sharer = self.cluster.store.sharer
            cached = sharer.part(fresh) if sharer is not None else fresh
            self._conditions[key] = cached
        return cached

    def _running(self, pod: Obj, now: float) -> Obj:
        ts = rfc3339(now)
        spec = pod["spec"]
        old = pod.get("status") or {}
        scheduled = next(
            (
                c
                for c in old.get("conditions") or ()
                if c.get("type") == "PodScheduled" and c.get("status") == "True"
            ),
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": ts},
        )
        conditions = self._running_conditions(ts, scheduled)
        host_ip = self._host_ip(spec["nodeName"])
        pod_ip = _ip(_POD_IP_BASE, next(self._pod_ips))
        uid = pod["metadata"].get("uid", "")
        status: Obj = {
            **old,
            "phase": "Running",
            "conditions": conditions,
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}] if host_ip else [],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": ts,
            "containerStatuses": [
                _container_status(c, uid, {"running": {"startedAt": ts}}, started=True)
                for c in spec.get("containers") or ()
            ],
        }
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [
                _container_status(
                    c,
                    uid,
                    {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": ts, "finishedAt": ts}},
                    started=False,
                )
                for c in spec["initContainers"]
            ]
        return {**pod, "metadata": dict(pod["metadata"]), "status": status}

    def _finished(self, pod: Obj, now: float, exit_code: int) -> Obj:
        """The pod once its containers exited with `exit_code`: Succeeded for 0, else Failed."""
        ts = rfc3339(now)
        old = pod.get("status") or {}
        conditions = []
        for cond in old.get("conditions") or ():
            if cond.get("type") in ("Ready", "ContainersReady", "PodReadyToStartContainers"):
                updated = {**cond, "status": "False", "lastTransitionTime": ts}
                if cond["type"] != "PodReadyToStartContainers":
                    updated["reason"] = "PodCompleted"
                conditions.append(updated)
            else:
                conditions.append(cond)
        statuses = []
        for cs in old.get("containerStatuses") or ():
            started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", ts)
            statuses.append(
                {
                    **cs,
                    "ready": False,
                    "started": False,
                    "state": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": "Completed" if exit_code == 0 else "Error",
                            "startedAt": started,
                            "finishedAt": ts,
                            "containerID": cs.get("containerID", ""),
                        }
                    },
                }
            )
        phase = "Succeeded" if exit_code == 0 else "Failed"
        status = {**old, "phase": phase, "conditions": conditions, "containerStatuses": statuses}
        return {**pod, "metadata": dict(pod["metadata"]), "status": status}
