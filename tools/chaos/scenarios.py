"""The chaos suite's staged faults: situations the load never makes by itself, each staged on a node and in
a namespace of its own (tainted, so the load stays off it; the load's watch and the checker never see it).

- `BudgetScenario` (fault `budget-refusal`): a preemption a PodDisruptionBudget refuses. A preemptible
  victim (priority class `train`) fills the node, a budget keeps it (`minAvailable: 1`), and a preemptor
  (`inference`, same queue) fits only there. While the budget holds the scheduler proposes the eviction and
  the API server refuses it with a 429: the victim must stay, and the binder must report the refusal
  (`FailedEviction`) rather than push it through. Once the budget is deleted, the next cycle, decided on the
  cluster as it then is, evicts the victim and binds the preemptor.
- `SharerScenario` (fault `terminating-sharer`): a GPU sharer deleted with a grace period while its
  container takes time to stop (kubesim's `kairos.io/stop-seconds`). The node has one GPU; a whole-GPU pod
  created while the sharer terminates must not be given that device until the sharer's containers have
  stopped, and must be bound once they have.

Used by `tools.chaos.runner.ChaosRun` in chaos runs and soaks. Manifests are built here, pure; the
scenarios send them through the runner's retrying create.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgspec

__all__ = ["BudgetResult", "BudgetScenario", "SharerResult", "SharerScenario"]

Obj = dict[str, Any]
Post = Callable[[aiohttp.ClientSession, Obj], Awaitable[None]]
TAINT = "chaos.kairos.io/staged"
QUEUE = "chaos-a"
STOP_SECONDS = "kairos.io/stop-seconds"


def _namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def _node(name: str, gpus: int) -> Obj:
    allocatable = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.memory": "81920"},
        },
        "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": allocatable, "allocatable": allocatable},
    }


def _pod(
    namespace: str,
    node: str,
    name: str,
    *,
    priority_class: str = "train",
    gpus: int = 0,
    fraction: str = "",
    labels: dict[str, str] | None = None,
) -> Obj:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    annotations = {"pod-group-name": name}
    if fraction:
        annotations["gpu-fraction"] = fraction
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": name, "kai.scheduler/queue": QUEUE, **(labels or {})},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "priorityClassName": priority_class,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "chaos",
                    "resources": {"requests": {"cpu": "100m"}, "limits": limits},
                }
            ],
        },
    }


def _podgroup(namespace: str, name: str, priority_class: str = "train") -> Obj:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": 1, "queue": QUEUE, "priorityClassName": priority_class},
    }


def _phase(pod: Obj | None) -> str:
    return str((pod or {}).get("status", {}).get("phase", ""))


def _node_of(pod: Obj | None) -> str:
    return str((pod or {}).get("spec", {}).get("nodeName", ""))


class _Staged:
    """A staged fault's namespace and node, and the reads every scenario makes."""

    namespace = ""
    node = ""

    def __init__(self, http: aiohttp.ClientSession, post: Post, timeout: float) -> None:
        self.http = http
        self.post = post
        self.timeout = timeout

    async def _pod(self, name: str) -> Obj | None:
        async with self.http.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}") as resp:
            if resp.status != 200:
                await resp.read()
                return None
            body: Obj = await resp.json()
            return body

    async def _until(self, what: str, check: Callable[[Obj | None], bool], pod: str) -> float:
        """Poll pod `pod` until `check` holds; the monotonic time it did. TimeoutError after `timeout`."""
        deadline = time.monotonic() + self.timeout
        while not check(await self._pod(pod)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{type(self).__name__}: {what} within {self.timeout:.0f} s")
            await asyncio.sleep(0.2)
        return time.monotonic()

    async def _delete(self, path: str) -> None:
        async with self.http.delete(path) as resp:
            await resp.read()

    async def _clean(self) -> None:
        """The namespace (and with it the pods, PodGroups and Events) and the node go."""
        await self._delete(f"/api/v1/namespaces/{self.namespace}")
        await self._delete(f"/api/v1/nodes/{self.node}")


# --- a preemption a disruption budget refuses --------------------------------------------------------------
class BudgetResult(msgspec.Struct, kw_only=True):
    refused: int
    """FailedEviction Events the binder wrote on the victim while the budget held (each one refusal)."""
    victim_kept: bool
    """The victim was still there, not being deleted, when the budget was removed."""
    preemptor_bound_s: float | None
    """From the budget's removal until the preemptor had a node (None: not within the timeout)."""


class BudgetScenario(_Staged):
    namespace = "chaos-budget"
    node = "chaos-budget-node"
    victim = "victim"
    preemptor = "preemptor"
    budget = "keep-victim"

    def manifests(self) -> dict[str, Obj]:
        """The scenario's objects by role."""
        return {
            "namespace": _namespace(self.namespace),
            "node": _node(self.node, 8),
            "victim-group": _podgroup(self.namespace, self.victim),
            "victim": _pod(self.namespace, self.node, self.victim, gpus=8),
            "budget": {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": self.budget, "namespace": self.namespace},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": self.victim}}},
            },
            "preemptor-group": _podgroup(self.namespace, self.preemptor, "inference"),
            "preemptor": _pod(self.namespace, self.node, self.preemptor, priority_class="inference", gpus=8),
        }

    async def arm(self) -> None:
        """Node, victim running on it, budget, preemptor: from here on evictions are refused."""
        objects = self.manifests()
        for role in ("namespace", "node", "victim-group", "victim"):
            await self.post(self.http, objects[role])
        await self._until("the victim running", lambda pod: _phase(pod) == "Running", self.victim)
        for role in ("budget", "preemptor-group", "preemptor"):
            await self.post(self.http, objects[role])

    async def refused(self) -> int:
        """Until the binder reported a refusal on the victim (or the timeout): how many it reported."""
        deadline = time.monotonic() + self.timeout
        while (count := await self._refusals()) == 0 and time.monotonic() < deadline:  # noqa: ASYNC110 -- polls the API server
            await asyncio.sleep(0.2)
        return count

    async def disarm(self) -> BudgetResult:
        """Count the refusals, check the victim stayed, delete the budget, wait for the preemptor's bind;
        then remove the scenario's objects."""
        refused = await self._refusals()
        victim = await self._pod(self.victim)
        kept = victim is not None and not victim["metadata"].get("deletionTimestamp")
        await self._delete(f"/apis/policy/v1/namespaces/{self.namespace}/poddisruptionbudgets/{self.budget}")
        removed = time.monotonic()
        try:
            bound: float | None = await self._until(
                "the preemptor bound", lambda pod: bool(_node_of(pod)), self.preemptor
            )
        except TimeoutError:
            bound = None
        await self._clean()
        return BudgetResult(
            refused=refused,
            victim_kept=kept,
            preemptor_bound_s=None if bound is None else round(bound - removed, 2),
        )

    async def _refusals(self) -> int:
        async with self.http.get(f"/api/v1/namespaces/{self.namespace}/events") as resp:
            events: list[Obj] = (await resp.json()).get("items", [])
        return sum(
            int(e.get("count") or 1)
            for e in events
            if e.get("reason") == "FailedEviction"
            and (e.get("involvedObject") or {}).get("name") == self.victim
        )


# --- a GPU sharer that takes its time to stop --------------------------------------------------------------
class SharerResult(msgspec.Struct, kw_only=True):
    overlapped: bool
    """The whole-GPU pod was given the node while the sharer's containers still ran."""
    whole_bound_s: float | None
    """From the sharer's containers stopping (the pod gone) until the whole-GPU pod had a node (None: not
    within the timeout)."""
    terminating_s: float
    """How long the sharer was terminating (deleted, containers still running)."""


class SharerScenario(_Staged):
    namespace = "chaos-sharer"
    node = "chaos-sharer-node"
    sharer = "sharer"
    whole = "whole"

    def __init__(self, http: aiohttp.ClientSession, post: Post, timeout: float, stop_seconds: float) -> None:
        super().__init__(http, post, timeout)
        self.stop_seconds = stop_seconds

    def manifests(self) -> dict[str, Obj]:
        stop = {STOP_SECONDS: str(round(self.stop_seconds))}
        return {
            "namespace": _namespace(self.namespace),
            "node": _node(self.node, 1),
            "sharer-group": _podgroup(self.namespace, self.sharer),
            "sharer": _pod(self.namespace, self.node, self.sharer, fraction="0.5", labels=stop),
            "whole-group": _podgroup(self.namespace, self.whole),
            "whole": _pod(self.namespace, self.node, self.whole, gpus=1),
        }

    async def run(self) -> SharerResult:
        """The sharer running on the one-GPU node, deleted with a grace period longer than its stop; the
        whole-GPU pod created meanwhile, its node watched until the sharer is gone and it is bound."""
        objects = self.manifests()
        for role in ("namespace", "node", "sharer-group", "sharer"):
            await self.post(self.http, objects[role])
        await self._until("the sharer running", lambda pod: _phase(pod) == "Running", self.sharer)
        grace = round(self.stop_seconds * 3) + 5
        await self._delete(
            f"/api/v1/namespaces/{self.namespace}/pods/{self.sharer}?gracePeriodSeconds={grace}"
        )
        deleted = time.monotonic()
        for role in ("whole-group", "whole"):
            await self.post(self.http, objects[role])
        overlapped = False
        gone: float | None = None
        deadline = deleted + self.timeout
        while time.monotonic() < deadline:
            sharer_running = _phase(await self._pod(self.sharer)) in ("Running", "Pending")
            whole_node = _node_of(await self._pod(self.whole))
            if sharer_running and whole_node:
                overlapped = True
            if not sharer_running and gone is None:
                gone = time.monotonic()
            if whole_node and gone is not None:
                break
            await asyncio.sleep(0.2)
        whole_node = _node_of(await self._pod(self.whole))
        bound = None if gone is None or not whole_node else round(max(0.0, time.monotonic() - gone), 2)
        terminating = (gone or time.monotonic()) - deleted
        await self._clean()
        return SharerResult(overlapped=overlapped, whole_bound_s=bound, terminating_s=round(terminating, 2))
