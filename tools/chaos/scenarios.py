"""The chaos suite's disruption-budget fault: a preemption that a PodDisruptionBudget refuses.

The chaos load never needs an eviction (its nodes have room to spare), so this fault brings its own: a
node of its own (tainted, so the load stays off it), a preemptible victim filling it (priority class
`train`), a PodDisruptionBudget that keeps the victim (`minAvailable: 1`), and a preemptor that can only run
there (priority class `inference`, same queue). While the budget holds, the scheduler proposes the eviction
and the API server refuses it with a 429; the victim must stay, and the binder must not retry the refusal
until it gets through (it reports it, `FailedEviction`). Once the budget is deleted the next cycle, decided
on the cluster as it then is, evicts the victim and binds the preemptor.

Everything lives in its own namespace, so the load's watch and the checker never see it. Used by
`tools.chaos.runner.ChaosRun` (kind `budget-refusal`) in chaos runs and soaks. Manifests are built here,
pure; `BudgetScenario` sends them through the runner's HTTP session.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgspec

__all__ = ["NAMESPACE", "BudgetResult", "BudgetScenario"]

Obj = dict[str, Any]
NAMESPACE = "chaos-budget"
NODE = "chaos-budget-node"
TAINT = "chaos.kairos.io/budget"
QUEUE = "chaos-a"
GPUS = 8
VICTIM = "victim"
PREEMPTOR = "preemptor"
BUDGET = "keep-victim"


class BudgetResult(msgspec.Struct, kw_only=True):
    refused: int
    """FailedEviction Events the binder wrote on the victim while the budget held (each one refusal)."""
    victim_kept: bool
    """The victim was still there, not being deleted, when the budget was removed."""
    preemptor_bound_s: float | None
    """From the budget's removal until the preemptor had a node (None: not within the timeout)."""


def _pod(name: str, priority_class: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": name, "kai.scheduler/queue": QUEUE},
            "annotations": {"pod-group-name": name},
        },
        "spec": {
            "schedulerName": "kai-scheduler",
            "priorityClassName": priority_class,
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "main",
                    "image": "chaos",
                    "resources": {"requests": {"cpu": "100m"}, "limits": {"nvidia.com/gpu": str(GPUS)}},
                }
            ],
        },
    }


def _podgroup(name: str, priority_class: str) -> Obj:
    return {
        "apiVersion": "scheduling.run.ai/v2alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minMember": 1, "queue": QUEUE, "priorityClassName": priority_class},
    }


def manifests() -> dict[str, Obj]:
    """The scenario's objects by role."""
    return {
        "namespace": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        "node": {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": NODE,
                "labels": {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.memory": "81920"},
            },
            "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]},
            "status": {
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(GPUS)},
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(GPUS)},
            },
        },
        "victim-group": _podgroup(VICTIM, "train"),
        "victim": _pod(VICTIM, "train"),
        "budget": {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": BUDGET, "namespace": NAMESPACE},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": VICTIM}}},
        },
        "preemptor-group": _podgroup(PREEMPTOR, "inference"),
        "preemptor": _pod(PREEMPTOR, "inference"),
    }


Post = Callable[[aiohttp.ClientSession, Obj], Awaitable[None]]


class BudgetScenario:
    """One run of the fault against a started stack, through `post` (the runner's retrying create)."""

    def __init__(self, http: aiohttp.ClientSession, post: Post, timeout: float) -> None:
        self.http = http
        self.post = post
        self.timeout = timeout
        self.objects = manifests()

    async def arm(self) -> None:
        """Node, victim running on it, budget, preemptor: from here on evictions are refused."""
        for role in ("namespace", "node", "victim-group", "victim"):
            await self.post(self.http, self.objects[role])
        await self._until(
            "the victim running", lambda pod: (pod or {}).get("status", {}).get("phase") == "Running", VICTIM
        )
        await self.post(self.http, self.objects["budget"])
        for role in ("preemptor-group", "preemptor"):
            await self.post(self.http, self.objects[role])

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
        victim = await self._pod(VICTIM)
        kept = victim is not None and not victim["metadata"].get("deletionTimestamp")
        async with self.http.delete(
            f"/apis/policy/v1/namespaces/{NAMESPACE}/poddisruptionbudgets/{BUDGET}"
        ) as resp:
            await resp.read()
        removed = time.monotonic()
        bound: float | None = None
        try:
            await self._until(
                "the preemptor bound",
                lambda pod: bool((pod or {}).get("spec", {}).get("nodeName")),
                PREEMPTOR,
            )
            bound = round(time.monotonic() - removed, 2)
        except TimeoutError:
            bound = None
        await self._clean()
        return BudgetResult(refused=refused, victim_kept=kept, preemptor_bound_s=bound)

    async def _pod(self, name: str) -> Obj | None:
        async with self.http.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") as resp:
            if resp.status == 404:
                return None
            body: Obj = await resp.json()
            return body if resp.status == 200 else None

    async def _until(self, what: str, check: Callable[[Obj | None], bool], pod: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not check(await self._pod(pod)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"budget fault: {what} within {self.timeout:.0f} s")
            await asyncio.sleep(0.2)

    async def _refusals(self) -> int:
        async with self.http.get(f"/api/v1/namespaces/{NAMESPACE}/events") as resp:
            events: list[Obj] = (await resp.json()).get("items", [])
        return sum(
            int(e.get("count") or 1)
            for e in events
            if e.get("reason") == "FailedEviction" and (e.get("involvedObject") or {}).get("name") == VICTIM
        )

    async def _clean(self) -> None:
        """The namespace (and with it the pods, PodGroups and Events) and the node go."""
        for path in (f"/api/v1/namespaces/{NAMESPACE}", f"/api/v1/nodes/{NODE}"):
            async with self.http.delete(path) as resp:
                await resp.read()
