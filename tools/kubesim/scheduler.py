"""A trivial stand-in for kube-scheduler: binds pods of the default scheduler, first fit.

Only pods whose `spec.schedulerName` is `default-scheduler` (what the API server fills in when it is
absent) are considered; pods of any other scheduler (Kairos's `kai-scheduler`) are never touched. A pod
goes to the first node by name that is Ready, schedulable, matches its `nodeSelector`, tolerates its
NoSchedule/NoExecute taints and has room for its requests (cpu, memory, pods and every extended
resource, against allocatable minus the requests of the node's unfinished pods). A pod that fits nowhere
gets PodScheduled=False (reason Unschedulable) and is tried again after a pod finishes or leaves or a
node changes. Affinity, topology spread and preemption are not simulated. Called from `Cluster.settle`.
Pure: no I/O.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from shared.kube.effective_requests import effective_requests, is_sidecar
from tools.kubesim.objects import is_ready, quantity, rfc3339
from tools.kubesim.store import Change, Key

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = ["DEFAULT_SCHEDULER", "DefaultScheduler", "pod_requests"]

Obj = dict[str, Any]
DEFAULT_SCHEDULER = "default-scheduler"


def pod_requests(pod: Obj) -> dict[str, Fraction]:
    """The pod's effective requests as kube-scheduler and the kubelet count them: the containers and the
    sidecars (init containers with ``restartPolicy: Always``) together, at least what each init
    container's turn needs (`shared.kube.effective_requests`), plus overhead (limits stand in for missing
    requests, as the API server defaults them)."""
    spec = pod.get("spec") or {}

    def of(container: Obj) -> dict[str, Fraction]:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        out: dict[str, Fraction] = {}
        for name, value in merged.items():
            q = quantity(value)
            if q is not None:
                out[name] = q
        return out

    total = effective_requests(
        (of(c) for c in spec.get("containers") or ()),
        ((is_sidecar(c.get("restartPolicy")), of(c)) for c in spec.get("initContainers") or ()),
    )
    for name, value in (spec.get("overhead") or {}).items():
        extra = quantity(value)
        if extra is not None:
            total[name] = total.get(name, Fraction(0)) + extra
    return total


def _tolerates(pod: Obj, taint: Obj) -> bool:
    for t in (pod.get("spec") or {}).get("tolerations") or ():
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


class DefaultScheduler:
    """First-fit binding of default-scheduler pods."""

    def __init__(self, cluster: Cluster, *, enabled: bool = True) -> None:
        self.cluster = cluster
        self.enabled = enabled
        self.todo: dict[Key, None] = {}
        self.waiting: dict[Key, None] = {}
        if enabled:
            cluster.store.storage("pods").listeners.append(self._pod_change)
            cluster.store.storage("nodes").listeners.append(self._node_change)

    def _pod_change(self, change: Change) -> None:
        pod = change.obj
        md = pod["metadata"]
        key = (md.get("namespace", ""), md["name"])
        spec = pod.get("spec") or {}
        if change.type == "DELETED" or spec.get("nodeName"):
            self.todo.pop(key, None)
            self.waiting.pop(key, None)
            if change.type == "DELETED" or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self._retry()
            return
        if (
            spec.get("schedulerName", DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER
            and key not in self.waiting
            and not md.get("deletionTimestamp")
            and not spec.get("schedulingGates")
        ):
            self.todo[key] = None

    def _node_change(self, change: Change) -> None:
        del change
        self._retry()

    def _retry(self) -> None:
        if self.waiting:
            self.todo.update(self.waiting)
            self.waiting.clear()

    def run_once(self) -> bool:
        if not self.todo:
            return False
        pods = self.cluster.store.storage("pods")
        node_storage = self.cluster.store.storage("nodes")
        nodes = [n for _, name in node_storage.keys_sorted() if (n := node_storage.get("", name)) is not None]
        used: dict[str, dict[str, Fraction]] = {}
        batch = list(self.todo)
        self.todo.clear()
        for key in batch:
            pod = pods.get(*key)
            if (
                pod is None
                or (pod.get("spec") or {}).get("nodeName")
                or pod["metadata"].get("deletionTimestamp")
            ):
                continue
            want = pod_requests(pod)
            target = next((n for n in nodes if self._fits(pod, want, n, used)), None)
            if target is None:
                self.waiting[key] = None
                self._mark_unschedulable(pod, len(nodes))
                continue
            name = target["metadata"]["name"]
            node_used = used[name]
            for res, q in want.items():
                node_used[res] = node_used.get(res, Fraction(0)) + q
            node_used["pods"] = node_used.get("pods", Fraction(0)) + 1
            self.cluster.assign(pod, name)
        return True

    def _used(self, node_name: str, used: dict[str, dict[str, Fraction]]) -> dict[str, Fraction]:
        if node_name not in used:
            total: dict[str, Fraction] = {"pods": Fraction(0)}
            for pod in self.cluster.store.storage("pods").indexed("spec.nodeName", node_name):
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                total["pods"] += 1
                for res, q in pod_requests(pod).items():
                    total[res] = total.get(res, Fraction(0)) + q
            used[node_name] = total
        return used[node_name]

    def _fits(
        self, pod: Obj, want: dict[str, Fraction], node: Obj, used: dict[str, dict[str, Fraction]]
    ) -> bool:
        spec = node.get("spec") or {}
        if spec.get("unschedulable") or not is_ready(node):
            return False
        labels = node["metadata"].get("labels") or {}
        for k, v in ((pod.get("spec") or {}).get("nodeSelector") or {}).items():
            if labels.get(k) != v:
                return False
        for taint in spec.get("taints") or ():
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod, taint):
                return False
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        node_used = self._used(node["metadata"]["name"], used)
        pods_cap = quantity(allocatable.get("pods", "110")) or Fraction(0)
        if node_used.get("pods", Fraction(0)) + 1 > pods_cap:
            return False
        for res, q in want.items():
            if q <= 0:
                continue
            cap = quantity(allocatable.get(res))
            if cap is None or node_used.get(res, Fraction(0)) + q > cap:
                return False
        return True

    def _mark_unschedulable(self, pod: Obj, n_nodes: int) -> None:
        status = dict(pod.get("status") or {})
        conditions = [c for c in status.get("conditions") or () if c.get("type") != "PodScheduled"]
        message = f"0/{n_nodes} nodes are available: no node fits the pod (default scheduler of the simulated cluster)."
        old = next((c for c in status.get("conditions") or () if c.get("type") == "PodScheduled"), None)
        if old is not None and old.get("reason") == "Unschedulable" and old.get("message") == message:
            return
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(self.cluster.now()),
            }
        )
        status["conditions"] = conditions
        self.cluster.store.put("pods", {**pod, "metadata": dict(pod["metadata"]), "status": status})
