"""The pod-grouper loop: a PodGroup for every pod of ours that has none, as KAI's pod-grouper makes them.

Run by the state service's Kubernetes owner, woken after each flush of the mirror. For each pod the mirror
lists as ungrouped it walks the pod's owner chain through the API (a Job, a ReplicaSet and its
Deployment, a JobSet, a PyTorchJob...: any kind, `shared.kubeapi.paths`), lets the pure
`services.state.controllers.grouping.group_pod` decide, creates that PodGroup (or brings an existing one in line with
`podgroup_update`), and then annotates the pod with `pod-group-name`: the pod's next watch event carries
it into KV. Owners are fetched once per pass however many of their pods are waiting; an owner that cannot
be read (gone, forbidden) ends the chain, and the pod is grouped by the part that could be read. A plugin
that reads more of the cluster (an MPIJob's launcher pods, a RayJob's RayCluster, ...) says what it needs
(`ReadsNeeded`); the loop reads it, once per pass too (a PodGroup from the mirror), and asks again, at most
`MAX_READ_ROUNDS` times. The Karta objects (KAI's fallback grouper for kinds no plugin claims) are listed
at most every `KARTAS_REFRESH` seconds.

A pod the decision refuses (a malformed owner spec or label) is logged, counted, reported on the pod (a
Warning Event and PodScheduled=False naming the owner and the field, through the mirror's problems) and left
alone until the pod changes; temporary API failures are retried a second later (`services.state.controllers.podwork`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from urllib.parse import quote

import msgspec

from services.state.controllers.grouping import (
    GrouperConfig,
    OwnerRef,
    group_pod,
    owner_refs_to_follow,
    podgroup_update,
)
from services.state.controllers.grouping.model import Grouping, ObjectRead, PodsRead, Read, ReadsNeeded
from services.state.controllers.podwork import PodWorkLoop
from services.state.mirror.cache import Mirror
from shared.bus.service import ServiceContext
from shared.errors import InvalidObject
from shared.kube import keys, translate, wire
from shared.kube.translate.events import InvolvedObject
from shared.kubeapi.client import ApiError, Kube
from shared.kubeapi.paths import create_object, get_object, object_path

log = logging.getLogger("kairos.state.podgrouper")

MAX_OWNER_DEPTH = 8
MAX_READ_ROUNDS = 8
KARTAS_PATH = "/apis/run.ai/v1alpha1/kartas"
KARTAS_REFRESH = 10.0
"""Seconds the Karta list (the fallback grouper's descriptions of kinds) is kept before it is read again."""
NO_KARTA_CRD_RETRY = 60.0
"""Seconds before the list is tried again on a cluster without the Karta CRD (KAI looks again after a
minute too)."""
PODGROUP_GROUP = "scheduling.run.ai/"
MERGE_PATCH = "application/merge-patch+json"
ALREADY_EXISTS = 409
UNREADABLE_OWNER = frozenset({403, 404})


class PodGrouperLoop(PodWorkLoop):
    def __init__(
        self, ctx: ServiceContext, kube: Kube, mirror: Mirror, config: GrouperConfig, concurrency: int = 8
    ) -> None:
        super().__init__()
        self.ctx = ctx
        self.kube = kube
        self.mirror = mirror
        self.config = config
        self._limit = asyncio.Semaphore(concurrency)
        self._owners: dict[tuple[str, OwnerRef], asyncio.Task[wire.Owner | None]] = {}
        self._reads: dict[Read, asyncio.Task[Any]] = {}
        self._creating: dict[tuple[str, str], tuple[dict[str, Any], asyncio.Task[None]]] = {}
        """(namespace, PodGroup) -> the manifest being created this pass, and the create."""
        self._kartas: list[dict[str, Any]] = []
        self._kartas_due = 0.0
        self._kartas_lock = asyncio.Lock()

    def candidates(self) -> list[wire.Pod]:
        return self.mirror.ungrouped()

    def begin_round(self) -> None:
        self._owners.clear()
        self._reads.clear()
        self._creating.clear()

    async def work(self, pod: wire.Pod) -> bool:
        return await self._group(pod)

    async def _group(self, pod: wire.Pod) -> bool:
        meta = pod.metadata
        owners: list[wire.Owner] = []
        try:
            async with self._limit:
                owners = await self._chain(pod)
                grouping = await self._decide(pod, owners)
                if grouping is None:
                    return False
                existing = self.mirror.raw.podgroups.get(f"{grouping.namespace}/{grouping.name}")
                if existing is None:
                    await self._create_once(grouping)
                else:
                    patch = podgroup_update(existing, grouping, config=self.config)
                    if patch is not None:
                        await self.kube.request(
                            f"update podgroup {grouping.namespace}/{grouping.name}",
                            "PATCH",
                            object_path(
                                keys.PODGROUP_API_VERSION, "PodGroup", grouping.namespace, grouping.name
                            ),
                            patch,
                            content_type=MERGE_PATCH,
                        )
                await self.kube.request(
                    f"annotate pod {meta.namespace}/{meta.name}",
                    "PATCH",
                    object_path("v1", "Pod", meta.namespace, meta.name),
                    grouping.pod_patch,
                    content_type=MERGE_PATCH,
                )
                self.ctx.counters["pods_grouped"] += 1
                log.debug(
                    "pod %s/%s -> podgroup %s (%s)",
                    meta.namespace,
                    meta.name,
                    grouping.name,
                    grouping.grouper,
                )
        except InvalidObject as exc:
            self.refuse(pod, str(exc), _faulty_owner(owners, exc))
            self.ctx.counters["podgrouper_refused"] += 1
            log.warning("pod %s/%s cannot be grouped: %s", meta.namespace, meta.name, exc)
        except ApiError as exc:
            self.ctx.counters["podgrouper_api_errors"] += 1
            log.warning("pod %s/%s: grouping failed, will retry: %s", meta.namespace, meta.name, exc)
            return exc.temporary
        return False

    async def kartas(self) -> list[dict[str, Any]]:
        """The cluster's Karta objects, read again once `KARTAS_REFRESH` has passed (a 404, no Karta CRD:
        none, for `NO_KARTA_CRD_RETRY`); a failed read keeps the last list."""
        async with self._kartas_lock:
            return await self._read_kartas()

    async def _read_kartas(self) -> list[dict[str, Any]]:
        now = asyncio.get_running_loop().time()
        if now < self._kartas_due:
            return self._kartas
        try:
            raw = await self.kube.request("list kartas", "GET", KARTAS_PATH)
        except ApiError as exc:
            if exc.status in UNREADABLE_OWNER:
                self._kartas, self._kartas_due = [], now + NO_KARTA_CRD_RETRY
            else:
                self._kartas_due = now + KARTAS_REFRESH
                log.info("kartas unreadable (%s): keeping the %d known", exc.status, len(self._kartas))
            return self._kartas
        items = msgspec.json.decode(raw).get("items")
        self._kartas = [k for k in items if isinstance(k, dict)] if isinstance(items, list) else []
        self._kartas_due = now + KARTAS_REFRESH
        return self._kartas

    async def _decide(self, pod: wire.Pod, owners: list[wire.Owner]) -> Grouping | None:
        """`group_pod`, with the reads its plugin asks for."""
        classes = set(self.mirror.raw.priorityclasses)
        reads: dict[Read, Any] = {}
        kartas = await self.kartas()
        for _ in range(MAX_READ_ROUNDS):
            try:
                return group_pod(
                    pod, owners, priority_classes=classes, config=self.config, reads=reads, kartas=kartas
                )
            except ReadsNeeded as needed:
                for read in needed.reads:
                    task = self._reads.get(read)
                    if task is None:
                        task = asyncio.create_task(self._read(read))
                        self._reads[read] = task
                    reads[read] = await task
        name = wire.object_name(pod.metadata.namespace, pod.metadata.name)
        raise InvalidObject(
            "Pod", name, "metadata.ownerReferences", "its owner's plugin kept asking for reads"
        )

    async def _read(self, read: Read) -> Any:
        if (
            isinstance(read, ObjectRead)
            and read.kind == "PodGroup"
            and read.api_version.startswith(PODGROUP_GROUP)
        ):
            # From the mirror, which watches every PodGroup: no API call per pod for the plugins that look
            # for an existing or legacy PodGroup (KAI reads them from its informer cache too).
            found = self.mirror.raw.podgroups.get(f"{read.namespace}/{read.name}")
            return None if found is None else msgspec.to_builtins(found)
        if isinstance(read, ObjectRead):
            try:
                raw = await get_object(self.kube, read.api_version, read.kind, read.namespace, read.name)
            except ApiError as exc:
                if exc.status in UNREADABLE_OWNER:
                    return None
                raise
            found = msgspec.json.decode(raw)
            return found if isinstance(found, dict) else None
        return await self._list_pods(read)

    async def _list_pods(self, read: PodsRead) -> list[wire.Pod]:
        selector = ",".join(f"{key}={value}" for key, value in read.selector)
        path = f"/api/v1/namespaces/{read.namespace}/pods?labelSelector={quote(selector, safe='=,')}"
        raw = await self.kube.request(f"list pods {read.namespace} {selector}", "GET", path)
        items = msgspec.json.decode(raw).get("items") or []
        pods: list[wire.Pod] = []
        for item in items:
            try:
                pods.append(wire.convert(wire.Pod, item))
            except InvalidObject:
                continue  # a pod the mirror holds back for its own problem: not one the plugin counts
        return pods

    async def _create_once(self, grouping: Grouping) -> None:
        """Create the PodGroup once per pass for all the pods that name it before the mirror has seen it
        (a gang's pods are grouped side by side: each created it again, answered 409); a pod whose decision
        differs from the one being created tries its own create, as before."""
        key = (grouping.namespace, grouping.name)
        known = self._creating.get(key)
        if known is not None and known[0] == grouping.podgroup:
            await asyncio.shield(known[1])
            return
        task = asyncio.create_task(self._create(grouping.podgroup))
        self._creating[key] = (grouping.podgroup, task)
        await task

    async def _create(self, manifest: dict[str, Any]) -> None:
        try:
            await create_object(self.kube, manifest)
        except ApiError as exc:
            if exc.status != ALREADY_EXISTS:  # another pod of the same owner was quicker
                raise
            self.ctx.counters["podgroups_existed"] += 1
        else:
            self.ctx.counters["podgroups_created"] += 1

    async def _chain(self, pod: wire.Pod) -> list[wire.Owner]:
        """The owners from the pod's own up to the top, as far as they can be read."""
        namespace = pod.metadata.namespace
        owners: list[wire.Owner] = []
        obj: wire.Pod | wire.Owner = pod
        for _ in range(MAX_OWNER_DEPTH):
            refs = owner_refs_to_follow(obj)
            if not refs:
                break
            key = (namespace, refs[0])
            task = self._owners.get(key)
            if task is None:
                task = asyncio.create_task(self._fetch(namespace, refs[0]))
                self._owners[key] = task
            owner = await task
            if owner is None:
                break
            owners.append(owner)
            obj = owner
        return owners

    async def _fetch(self, namespace: str, ref: OwnerRef) -> wire.Owner | None:
        try:
            raw = await get_object(self.kube, ref.api_version, ref.kind, namespace, ref.name)
        except ApiError as exc:
            if exc.status in UNREADABLE_OWNER:
                log.info(
                    "owner %s %s/%s unreadable (%s): grouping by what is below it",
                    ref.kind,
                    namespace,
                    ref.name,
                    exc.status,
                )
                return None
            raise
        return wire.decode(wire.Owner, raw)


def _faulty_owner(owners: list[wire.Owner], exc: InvalidObject) -> InvolvedObject | None:
    """The owner of the chain a refusal names (a RayCluster's worker group, a LeaderWorkerSet's size), to
    tell it too; None when the refusal is about the pod or an object outside the chain."""
    for owner in owners:
        meta = owner.metadata
        if owner.kind == exc.kind and wire.object_name(meta.namespace, meta.name) == exc.name:
            return translate.involved_object(owner)
    return None
