"""GPU sharing in the cluster, KAI's way: reservation pods hold shared devices, a sharer's ConfigMaps name
them, and a sync in every binder replica takes back what no sharer holds and puts back what went missing.

Run as the ``gpusharing`` bind step (`services.binder.steps.BindStep`, the last by default: a bind with GPU
groups runs `GpuSharing.prepare` after the volume and claim steps, before its ``pods/binding`` POST) and
by `services.binder.service` (`GpuSharing.run`, next to the recovery scan, with `cluster=kube`). The names
and bodies are `shared.kube.gpu_sharing`'s, the decisions `services.binder.gpu_sharing_plan`'s; this module
only calls the API.

A fractional pod's bind, in this order (each step idempotent, so a binder killed at any point and a second
binder binding the same pod again end with one reservation per group and the pod bound):

1. GET the pod (annotations, containers, uid, labels).
2. One merge patch: the group labels and ``kairos.io/gpu-groups`` (`gpu_sharing_plan.sharer_patch`). From here on
   the pod is a live sharer, so no sync anywhere deletes its groups' reservations.
3. Per group, under a per-(node, group) lock (KAI's group mutex): touch the reservation pod (a merge
   patch, see `gpu_sharing_plan.touch_patch`), or create it when absent (409: another binder just did;
   reuse it), then wait for ``run.ai/reserve_for_gpu_index`` (the binder's one watch on the reservation
   pods; the lock and the watch are `services.binder.reservation_watch`'s), at most `reservation_timeout`
   seconds. A timeout, a Failed reservation (the kubelet's UnexpectedAdmissionError) or its deletion
   meanwhile deletes it and raises `ReservationFailed`, a `TemporaryError` saying why (after a timeout,
   what the pod's container waits for, e.g. ``ErrImagePull`` and the runtime's message): the bind is
   deferred and the recovery scan binds again later. A bind whose reservations failed `attempts` times in
   a row in this binder gives up instead (a device that never comes: an image that cannot be pulled, a
   runtime class the node lacks): a Warning Event ``GPUReservationFailed`` on the pod names the reservation
   pod and why, the pod's group labels are taken back (`gpu_sharing_plan.unshare_patch`, so the sync deletes its
   groups' other reservations), and `ClusterRefused` makes the binder release the pod's claim and
   reservation, so the pod goes back to the scheduler instead of holding the node for ever.
4. The capabilities ConfigMap (``NVIDIA_VISIBLE_DEVICES``, ``GPU_PORTION``, ``RUNAI_NUM_OF_GPUS``) and the
   envFrom one, owned by the pod: created, or patched on 409. Skipped (and counted,
   ``gpu_sharing_without_configmap``) for a pod admitted without ``runai/shared-gpu-configmap``. With
   `ReservationSettings.hami_core` the capabilities ConfigMap also gets ``CUDA_DEVICE_MEMORY_LIMIT``
   (`services.binder.hami`), from the chosen node's GPU memory label; a node without a usable one binds the
   pod without it, with a Warning Event ``GPUMemoryLimitUnknown`` naming the node and the label.

Undoing the step (`GpuSharing.undo`, after the pod's binding was refused) changes nothing, deliberately: the
sync below takes back what no sharer holds. A reservation pod serves every sharer of its group on the node,
so deleting it at once could take the device from another pod; the pod's group labels cannot be taken off
safely either, as a refused binding means the pod is gone, bound elsewhere, or another pod under its name
now (a merge patch carries no uid precondition); its ConfigMaps are owned by the pod and go with it.

The sync (at start, every `reservation_sync` seconds, and `reservation_grace` seconds after a sharer is
deleted or finishes, seen by an informer on ``kairos.io/gpu-sharing=true`` pods): reservations first, then
sharers, are listed; `gpu_sharing.orphaned_reservations` (groups this binder is binding count as live) are
deleted with their uid and resourceVersion as preconditions (a 404 or 409 means someone else decided
first). A sharer being deleted counts until its containers have stopped (`gpu_sharing.is_live_sharer`: it
is gone, or its phase is terminal): its container still uses the device, so the sync that follows its
deletionTimestamp keeps its reservation, and the one that follows its end deletes it. For each bound sharer, a missing reservation pod is recreated and its device written into the
sharer's capabilities ConfigMap, with a Warning Event `GPUReservationMissing` naming the reservation pod
(and, when the device changed, saying the running container keeps the old one until restarted); a missing
ConfigMap is recreated with a Warning Event `GPUSharingConfigMapMissing` naming it. Events are
`shared.kube.translate.event` bodies, the state service's write-back builder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import msgspec

from services.binder import gpu_sharing_plan, hami
from services.binder.cluster_client import ClusterRefused, pod_replaced
from services.binder.reservation_watch import DeviceWatch, GroupLocks
from shared.backoff import Backoff
from shared.bus.middleware import Counters
from shared.contracts.messages import Binding
from shared.errors import InvalidObject, TemporaryError
from shared.kube import gpu_sharing as gs
from shared.kube import keys, translate, wire
from shared.kubeapi.client import JSON, MERGE_PATCH, ApiError, Kube
from shared.kubeapi.informer import Informer
from shared.kubeapi.paths import collection_path, object_path
from shared.telemetry.spans import counting_retries, note_retry

log = logging.getLogger("kairos.binder.reservations")

CONFLICT = 409
NOT_FOUND = 404
EVENT_COMPONENT = "kairos-binder"


@dataclass(frozen=True)
class ReservationSettings:
    """The binder's `reservation_*` options (see `services.binder.service.BinderOptions`)."""

    image: str = "kairos"
    command: tuple[str, ...] = ("python", "-m", "services.gpu_agent.reservation")
    service_account: str = "kairos-reservation"
    runtime_class: str = ""
    timeout: float = 60.0
    sync: float = 30.0
    grace: float = 5.0
    attempts: int = 3
    """Reservation tries of one bind (a pod on a node) before it gives up (see the module docstring)."""
    hami_core: bool = False
    """Write ``CUDA_DEVICE_MEMORY_LIMIT`` into a sharer's capabilities ConfigMap (the binder option
    `hami_core_enabled`, KAI's hamicore binder plugin)."""


class ReservationFailed(TemporaryError):  # noqa: N818 -- a TemporaryError, named for what failed
    """A reservation pod got no device in time, failed, or vanished: deleted; the bind is tried again."""

    def __init__(self, node: str, group: str, reservation: str, problem: str, delay: float) -> None:
        self.node = node
        self.group = group
        self.reservation = reservation
        where = f"{gs.RESERVATION_NAMESPACE}/{reservation}"
        super().__init__(f"GPU group {group} on {node}: reservation pod {where} {problem}", delay=delay)


class _Waiting(msgspec.Struct, frozen=True):
    reason: str = ""
    message: str = ""


class _ContainerState(msgspec.Struct, frozen=True):
    waiting: _Waiting | None = None


class _ContainerStatus(msgspec.Struct, frozen=True):
    name: str = ""
    state: _ContainerState = msgspec.field(default_factory=_ContainerState)


class _Status(msgspec.Struct, frozen=True, rename="camel"):
    phase: str = ""
    reason: str = ""
    message: str = ""
    container_statuses: list[_ContainerStatus] | None = None


class _Reservation(msgspec.Struct, frozen=True):
    """The part of a reservation pod the wait reads (wire.Pod has no status reason)."""

    metadata: wire.ObjectMeta = msgspec.field(default_factory=wire.ObjectMeta)
    status: _Status = msgspec.field(default_factory=_Status)

    def stuck(self) -> str:
        """Why it has reported no device, as its status says: what a container waits for, else its phase."""
        for container in self.status.container_statuses or ():
            waiting = container.state.waiting
            if waiting is not None and waiting.reason:
                detail = f": {waiting.message}" if waiting.message else ""
                return f"its container {container.name} is waiting: {waiting.reason}{detail}"
        phase = self.status.phase or "Pending"
        if phase == "Running":
            return "it runs but has not written its device"
        return f"it is {phase}" + (f" ({self.status.reason})" if self.status.reason else "")


_RESERVATION = msgspec.json.Decoder(_Reservation)


class _PodList(msgspec.Struct, frozen=True):
    items: list[wire.Pod] | None = None


_POD_LIST = msgspec.json.Decoder(_PodList)


def _pods(body: bytes, what: str) -> list[wire.Pod]:
    try:
        return _POD_LIST.decode(body).items or []
    except msgspec.DecodeError as exc:
        raise InvalidObject("pod list", what, "items", str(exc)) from exc


async def _no_checkpoint(_step: str) -> None:
    return None


@dataclass
class GpuSharing:
    """The binder's GPU-sharing calls against one API server (see the module docstring); its bind side is
    the ``gpusharing`` bind step (`services.binder.steps.BindStep`)."""

    name: ClassVar[str] = "gpusharing"
    kube: Kube
    counters: Counters = field(default_factory=Counters)
    settings: ReservationSettings = field(default_factory=ReservationSettings)
    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)
    clock: Callable[[], float] = time.time
    """Wall clock (Unix s): reservation ages and Event times."""
    checkpoint: Callable[[str], Awaitable[None]] = _no_checkpoint
    """Awaited after each durable step of a bind (``labelled``, ``reserved``, ``configmaps``): the specs
    stop a bind there, as a crash would."""
    locks: GroupLocks = field(default_factory=GroupLocks)
    busy: Counter[str] = field(default_factory=Counter)
    """Group label values of the binds in flight in this binder: live for the sync."""
    tries: dict[tuple[str, str], int] = field(default_factory=dict)
    """(pod key, node) -> reservation tries of that bind that failed in a row (see `settings.attempts`)."""
    first_sync: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    """Set once `run`'s first full sync has finished (or failed)."""
    _due: dict[str, float] = field(default_factory=dict, init=False)
    """Group label value -> when (loop time) to sync it: a sharer of it was deleted or finished."""
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    devices: DeviceWatch = field(init=False)
    """The one watch every bind waiting for a reservation's device shares."""

    def __post_init__(self) -> None:
        self.devices = DeviceWatch(self.kube)

    # --- a bind -----------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def binding(self, groups: Sequence[str]) -> AsyncIterator[None]:
        """Marks `groups` busy while a bind of them is in flight here (the sync leaves them alone)."""
        values = [gs.group_label_value(g) for g in groups]
        self.busy.update(values)
        try:
            yield
        finally:
            self.busy.subtract(values)
            for value in values:
                if self.busy[value] <= 0:
                    del self.busy[value]

    def applies(self, binding: Binding) -> bool:
        """A binding with GPU groups (a pod sharing devices)."""
        return bool(binding.gpu_groups)

    async def prepare(self, binding: Binding) -> None:
        """Steps 1-4 for a binding with GPU groups, its groups marked busy meanwhile (`binding`): once it
        returns, the pod is labelled with them, a live sharer the sync keeps their reservations for.
        `ClusterRefused` when the cluster says no for good (the pod is gone or on another node),
        `TemporaryError` when it may work later; what it made before either is left to the sync."""
        async with self.binding(binding.gpu_groups):
            await self._prepare(binding)

    async def undo(self, done: None) -> None:
        """Nothing: what a refused sharer's bind made is the sync's to take back (see the module docstring)."""

    async def _prepare(self, binding: Binding) -> None:
        what = f"pod {binding.namespace}/{binding.name}"
        try:
            pod = wire.decode_pod(
                await self._send(
                    f"get {what}", "GET", object_path("v1", "Pod", binding.namespace, binding.name)
                )
            )
            if binding.uid and pod.metadata.uid != binding.uid:  # nothing is written on its successor
                raise pod_replaced("bind", binding.pod, binding.uid, pod.metadata.uid)
            if pod.spec.node_name and pod.spec.node_name != binding.node:
                raise ClusterRefused(
                    "bind", binding.pod, f"already bound to {pod.spec.node_name}, not {binding.node}"
                )
            if not gs.is_fractional(pod):
                # GPU groups on a pod that asks for no share (not KAI's case): only record them, as before.
                await self._merge_patch_pod(what, binding, translate.gpu_groups_patch(binding.gpu_groups))
                self.counters["gpu_groups_not_fractional"] += 1
                return
            prefix = pod.metadata.annotations.get(gs.CONFIGMAP_ANNOTATION)
            ref = gs.fraction_container(pod) if prefix else None  # a wrong container name refuses first
            await self._merge_patch_pod(
                what, binding, gpu_sharing_plan.sharer_patch(pod.metadata.labels, binding.gpu_groups)
            )
            await self.checkpoint("labelled")
            sharer = f"{binding.namespace}/{binding.name}"
            tolerations = [msgspec.to_builtins(t) for t in pod.spec.tolerations]
            try:
                devices = [
                    (await self.reserve(binding.node, group, tolerations=tolerations, sharer=sharer))[0]
                    for group in binding.gpu_groups
                ]
            except ReservationFailed as exc:
                raise await self._failed_try(binding, pod, exc) from exc
            self.tries.pop((binding.pod, binding.node), None)
            if not prefix or ref is None:
                self.counters["gpu_sharing_without_configmap"] += 1
                log.warning(
                    "%s has no %s annotation: bound without its ConfigMaps", what, gs.CONFIGMAP_ANNOTATION
                )
                return
            share = gpu_sharing_plan.share_per_device(binding.gpus, len(binding.gpu_groups))
            if share is None:
                memory = (
                    await self._device_memory(binding.node)
                    if keys.GPU_MEMORY in pod.metadata.annotations
                    else None
                )
                share = gpu_sharing_plan.share_from_annotations(pod.metadata.annotations, memory)
            if share is None:
                raise ClusterRefused("bind", binding.pod, "its GPU share cannot be read from its annotations")
            data = gpu_sharing_plan.capabilities_data(devices, share)
            if self.settings.hami_core:
                data |= await self._memory_limit(pod, binding.node, data[gs.GPU_PORTION])
            await self._ensure_configmap(pod, gs.capabilities_configmap(prefix, ref), data)
            await self._ensure_configmap(pod, gs.direct_env_configmap(prefix, ref), {})
            await self.checkpoint("configmaps")
        except (InvalidObject, ApiError) as exc:
            raise ClusterRefused("bind", binding.pod, str(exc)) from exc

    async def _failed_try(
        self, binding: Binding, pod: wire.Pod, failure: ReservationFailed
    ) -> ReservationFailed | ClusterRefused:
        """One more failed reservation try of this bind: `failure` itself (the bind is tried again later),
        or, the tries used up, a refusal after a Warning Event on the pod saying why."""
        key = (binding.pod, binding.node)
        tries = self.tries.get(key, 0) + 1
        if tries < self.settings.attempts:
            self.tries[key] = tries
            return failure
        self.tries.pop(key, None)
        self.counters["reservation_binds_given_up"] += 1
        message = gpu_sharing_plan.reservation_failed_message(binding.node, tries, str(failure))
        await self._warn(pod, gpu_sharing_plan.RESERVATION_FAILED, message)
        try:  # no longer a sharer: its groups' other reservations go with the next sync
            what = f"pod {binding.namespace}/{binding.name}"
            await self._merge_patch_pod(
                what, binding, gpu_sharing_plan.unshare_patch(pod.metadata.labels, binding.gpu_groups)
            )
        except (ApiError, TemporaryError) as exc:
            log.warning("could not take the GPU-sharing labels off %s: %s", binding.pod, exc)
        return ClusterRefused("bind", binding.pod, message)

    async def _merge_patch_pod(self, what: str, binding: Binding, patch: dict[str, Any]) -> None:
        path = object_path("v1", "Pod", binding.namespace, binding.name)
        await self._send(f"label {what}", "PATCH", path, patch, content_type=MERGE_PATCH)

    async def reserve(
        self, node: str, group: str, *, tolerations: Iterable[Mapping[str, Any]], sharer: str
    ) -> tuple[str, bool]:
        """The device of `group` on `node` and whether this call created its reservation pod (step 3).
        `ReservationFailed` (temporary) when it gets none; `ApiError` for other refusals."""
        name = gs.reservation_pod_name(node, group)
        ns = gs.RESERVATION_NAMESPACE
        what = f"reservation pod {ns}/{name}"
        async with self.locks(f"{node}/{group}"):
            created = False
            try:
                raw = await self._send(
                    f"touch {what}",
                    "PATCH",
                    object_path("v1", "Pod", ns, name),
                    gpu_sharing_plan.touch_patch(sharer, self.clock()),
                    content_type=MERGE_PATCH,
                )
            except ApiError as exc:
                if exc.status != NOT_FOUND:
                    raise
                raw, created = await self._create_reservation(node, group, tolerations, what)
            await self.checkpoint("reserved")
            pod = self._decode_reservation(raw, what)
            device = self._device_of(pod, node, group)
            if device is None:
                device = await self._wait_for_device(node, group, pod.metadata.uid)
            return device, created

    async def _create_reservation(
        self, node: str, group: str, tolerations: Iterable[Mapping[str, Any]], what: str
    ) -> tuple[bytes, bool]:
        s = self.settings
        body = gs.reservation_pod(
            node,
            group,
            image=s.image,
            command=s.command,
            service_account=s.service_account,
            runtime_class=s.runtime_class,
            tolerations=tolerations,
        )
        name = body["metadata"]["name"]
        try:
            raw = await self._send(
                f"create {what}", "POST", collection_path("v1", "Pod", gs.RESERVATION_NAMESPACE), body
            )
        except ApiError as exc:
            if exc.status == NOT_FOUND:
                # The namespace itself (the deployment creates it).
                raise ReservationFailed(
                    node, group, name, f"cannot be created: {exc}", self.backoff.cap
                ) from exc
            if exc.status != CONFLICT:
                raise
            self.counters["reservations_reused_on_create"] += 1  # another binder created it just now
            try:
                raw = await self._send(
                    f"get {what}", "GET", object_path("v1", "Pod", gs.RESERVATION_NAMESPACE, name)
                )
            except ApiError as again:
                if again.status == NOT_FOUND:
                    raise ReservationFailed(node, group, name, "vanished while created", 0.5) from again
                raise
            return raw, False
        self.counters["reservations_created"] += 1
        return raw, True

    @staticmethod
    def _decode_reservation(raw: bytes, what: str) -> _Reservation:
        try:
            return _RESERVATION.decode(raw)
        except msgspec.DecodeError as exc:
            raise InvalidObject("pod", what, "", str(exc)) from exc

    def _device_of(self, pod: _Reservation, node: str, group: str) -> str | None:
        """The device it reported; `ReservationFailed` when it failed or is being deleted."""
        device = gs.reserved_devices_of(pod.metadata.annotations)
        if device is not None:
            return device
        if pod.status.phase == "Failed" or pod.metadata.deletion_timestamp:
            why = pod.status.reason or ("being deleted" if pod.metadata.deletion_timestamp else "Failed")
            detail = f": {pod.status.message}" if pod.status.message else ""
            raise ReservationFailed(
                node, group, pod.metadata.name, f"failed ({why}{detail})", self.backoff.cap
            )
        return None

    async def _wait_for_device(self, node: str, group: str, uid: str) -> str:
        name = gs.reservation_pod_name(node, group)

        def look(raw: msgspec.Raw | None) -> str | None:
            if raw is None:
                raise ReservationFailed(node, group, name, "was deleted", 0.5)
            pod = self._decode_reservation(bytes(raw), name)
            if uid and pod.metadata.uid != uid:
                return None  # an older incarnation the watch has not seen replaced yet
            return self._device_of(pod, node, group)

        try:
            return await self.devices.until(name, uid, look, self.settings.timeout)
        except TimeoutError:
            self.counters["reservation_timeouts"] += 1
            why = await self._stuck(name)
            await self._delete_reservation(name, uid=uid)
            problem = f"reported no device within {self.settings.timeout:g} s{why}; deleted"
            raise ReservationFailed(node, group, name, problem, self.backoff.cap) from None
        except (ReservationFailed, InvalidObject):
            self.counters["reservations_failed"] += 1
            await self._delete_reservation(name, uid=uid)
            raise

    async def _stuck(self, name: str) -> str:
        """Why a reservation pod reported no device, read from its status now, as ` (why)`; empty when its
        status cannot be read."""
        what = f"reservation pod {gs.RESERVATION_NAMESPACE}/{name}"
        try:
            raw = await self._send(
                f"get {what}", "GET", object_path("v1", "Pod", gs.RESERVATION_NAMESPACE, name)
            )
            return f" ({self._decode_reservation(raw, what).stuck()})"
        except (ApiError, TemporaryError, InvalidObject) as exc:
            log.info("could not read why %s reported no device: %s", what, exc)
            return ""

    async def _delete_reservation(self, name: str, *, uid: str = "", resource_version: str = "") -> bool:
        """Delete one reservation pod (only that incarnation: uid, and resourceVersion when given); False
        when it was gone already or changed meanwhile (404, 409)."""
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
        if preconditions:
            body["preconditions"] = preconditions
        try:
            await self._call(
                f"delete reservation pod {gs.RESERVATION_NAMESPACE}/{name}",
                self.kube.core.delete_namespaced_pod,
                name,
                gs.RESERVATION_NAMESPACE,
                body=body,
            )
        except ApiError as exc:
            if exc.status in (NOT_FOUND, CONFLICT):
                return False
            raise
        self.counters["reservations_deleted"] += 1
        return True

    async def _ensure_configmap(self, pod: wire.Pod, name: str, data: Mapping[str, str]) -> bool:
        """Create the ConfigMap (True), or on 409 write `data` into the one there (False)."""
        ns = pod.metadata.namespace
        what = f"configmap {ns}/{name}"
        try:
            await self._send(
                f"create {what}",
                "POST",
                collection_path("v1", "ConfigMap", ns),
                gs.configmap_body(pod, name, data),
            )
        except ApiError as exc:
            if exc.status != CONFLICT:
                raise
            if data:
                await self._patch_configmap(ns, name, data)
            return False
        self.counters["configmaps_created"] += 1
        return True

    async def _patch_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        await self._send(
            f"patch configmap {namespace}/{name}",
            "PATCH",
            object_path("v1", "ConfigMap", namespace, name),
            {"data": dict(data)},
            content_type=MERGE_PATCH,
        )

    async def _memory_limit(self, pod: wire.Pod, node: str, portion: str) -> dict[str, str]:
        """``CUDA_DEVICE_MEMORY_LIMIT`` for `pod` on `node` (`hami.limit_data`); nothing, and a Warning Event
        on the pod naming the node's label, when the node does not say its GPU memory."""
        raw = await self._send(f"get node {node}", "GET", object_path("v1", "Node", None, node))
        try:
            data = hami.limit_data(node, wire.decode_node(raw).metadata.labels, portion)
        except InvalidObject as exc:
            self.counters["gpu_memory_limits_unknown"] += 1
            log.warning("pod %s/%s: %s", pod.metadata.namespace, pod.metadata.name, exc)
            await self._warn(pod, hami.LIMIT_UNKNOWN, hami.limit_unknown_message(exc))
            return {}
        self.counters["gpu_memory_limits_written"] += 1
        return data

    async def _device_memory(self, node: str) -> int | None:
        """MiB per device of `node` as the core reads it (label ``nvidia.com/gpu.memory``); None if unknown."""
        try:
            raw = await self._send(f"get node {node}", "GET", object_path("v1", "Node", None, node))
            return translate.node_of(wire.decode_node(raw)).gpu_memory_mib
        except (ApiError, InvalidObject) as exc:
            log.warning("cannot read the device memory of node %s: %s", node, exc)
            return None

    async def _send(
        self, what: str, method: str, path: str, body: Any = None, *, content_type: str = JSON
    ) -> bytes:
        """A per-pod call (`Kube.request`), retried like `_call`."""
        return await self.kube.request_with_retries(
            what,
            method,
            path,
            body,
            backoff=self.backoff,
            rng=self.rng,
            on_retry=note_retry,
            content_type=content_type,
        )

    async def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> bytes:
        return await self.kube.call_with_retries(
            what, counting_retries(method), *args, backoff=self.backoff, rng=self.rng, **kwargs
        )

    # --- the sync ---------------------------------------------------------------------------------------------
    async def _list_reservations(self) -> list[wire.Pod]:
        raw = await self._call(
            "list reservation pods",
            self.kube.core.list_namespaced_pod,
            gs.RESERVATION_NAMESPACE,
            label_selector=keys.KAI_GPU_GROUP_LABEL,
        )
        return _pods(raw, gs.RESERVATION_NAMESPACE)

    async def _list_sharers(self) -> list[wire.Pod]:
        raw = await self._call(
            "list GPU-sharing pods",
            self.kube.core.list_pod_for_all_namespaces,
            label_selector=f"{gs.SHARING_LABEL}=true",
        )
        return _pods(raw, "")

    async def _delete_orphans(
        self, reservations: list[wire.Pod], sharers: list[wire.Pod], now: float, only: set[str] | None = None
    ) -> list[wire.Pod]:
        orphans = gs.orphaned_reservations(
            [*sharers, *reservations], now=now, grace=self.settings.grace, busy=set(self.busy)
        )
        if only is not None:
            orphans = [p for p in orphans if p.metadata.labels.get(keys.KAI_GPU_GROUP_LABEL) in only]
        deleted = []
        for pod in orphans:
            md = pod.metadata
            if await self._delete_reservation(md.name, uid=md.uid, resource_version=md.resource_version):
                deleted.append(pod)
                log.info(
                    "deleted the GPU reservation %s/%s: no live pod shares its device", md.namespace, md.name
                )
        return deleted

    async def sync_groups(self, groups: Iterable[str], now: float) -> list[wire.Pod]:
        """Delete the orphaned reservations of these groups (label values); returns the deleted ones."""
        reservations = await self._list_reservations()
        sharers = await self._list_sharers()
        deleted = await self._delete_orphans(reservations, sharers, now, only=set(groups))
        self.counters["reservation_group_syncs"] += 1
        return deleted

    async def sync(self, now: float) -> list[wire.Pod]:
        """One full pass (see the module docstring); `now` in Unix s. Returns the reservations deleted."""
        # Reservations before sharers: a sharer labelled after our reservation list touches its reservation
        # after labelling, which fails our delete's resourceVersion precondition.
        reservations = await self._list_reservations()
        sharers = await self._list_sharers()
        deleted = await self._delete_orphans(reservations, sharers, now)
        gone = {p.metadata.uid for p in deleted}
        remaining = [p for p in reservations if p.metadata.uid not in gone]
        raw = await self._call(
            "list GPU-sharing configmaps",
            self.kube.core.list_config_map_for_all_namespaces,
            label_selector=f"{gs.SHARING_LABEL}=true",
        )
        configmaps = gpu_sharing_plan.decode_configmaps(raw)
        plan = gpu_sharing_plan.plan_repairs(sharers, remaining, configmaps.keys(), busy=set(self.busy))
        recreated = await self._repair_reservations(plan)
        memory: dict[str, int | None] = {}
        for sharer in plan.sharers:
            try:
                await self._repair_sharer(sharer, plan, recreated, configmaps, memory)
            except (ApiError, TemporaryError) as exc:
                self.counters["sync_errors"] += 1
                log.warning("GPU sharing sync of %s: %s", sharer.name, exc)
        self.counters["reservation_syncs"] += 1
        return deleted

    async def _repair_reservations(self, plan: gpu_sharing_plan.Repairs) -> dict[tuple[str, str], str]:
        """Recreate the missing reservation pods; the devices of those this pass created, by (node, group)."""
        recreated: dict[tuple[str, str], str] = {}

        async def one(node: str, group: str, members: list[gpu_sharing_plan.Sharer]) -> None:
            tolerations = [msgspec.to_builtins(t) for t in members[0].pod.spec.tolerations]
            try:
                device, created = await self.reserve(
                    node, group, tolerations=tolerations, sharer=members[0].name
                )
            except (ApiError, TemporaryError) as exc:
                self.counters["sync_errors"] += 1
                log.warning("GPU sharing sync: recreating the reservation of %s on %s: %s", group, node, exc)
                return
            plan.devices[(node, group)] = device
            if created:
                recreated[(node, group)] = device
                self.counters["reservations_recreated"] += 1

        await asyncio.gather(
            *(one(node, group, members) for (node, group), members in plan.reservations.items())
        )
        return recreated

    async def _repair_sharer(
        self,
        sharer: gpu_sharing_plan.Sharer,
        plan: gpu_sharing_plan.Repairs,
        recreated: Mapping[tuple[str, str], str],
        configmaps: Mapping[tuple[str, str], gpu_sharing_plan.ConfigMap],
        memory: dict[str, int | None],
    ) -> None:
        devices = [plan.devices.get((sharer.node, g)) for g in sharer.groups]
        current = configmaps.get((sharer.namespace, sharer.capabilities)) if sharer.capabilities else None
        old = current.data.get(gs.NVIDIA_VISIBLE_DEVICES) if current is not None else None
        olds = old.split(",") if old is not None else []
        for index, group in enumerate(sharer.groups):
            new = recreated.get((sharer.node, group))
            if new is not None:
                before = olds[index] if len(olds) == len(sharer.groups) else None
                name = gs.reservation_pod_name(sharer.node, group)
                await self._warn(
                    sharer.pod,
                    gpu_sharing_plan.RESERVATION_MISSING,
                    gpu_sharing_plan.reservation_missing_message(name, before, new),
                )
        if sharer.capabilities is None or sharer.direct_env is None or any(d is None for d in devices):
            return
        visible = ",".join(d for d in devices if d is not None)
        if current is None:
            if sharer.node not in memory and keys.GPU_MEMORY in sharer.pod.metadata.annotations:
                memory[sharer.node] = await self._device_memory(sharer.node)
            share = gpu_sharing_plan.share_from_annotations(
                sharer.pod.metadata.annotations, memory.get(sharer.node)
            )
            if share is None:
                log.warning(
                    "GPU sharing sync: %s: its share cannot be read; %s not recreated",
                    sharer.name,
                    sharer.capabilities,
                )
            else:
                data = gpu_sharing_plan.capabilities_data([d for d in devices if d is not None], share)
                if self.settings.hami_core:
                    data |= await self._memory_limit(sharer.pod, sharer.node, data[gs.GPU_PORTION])
                if await self._ensure_configmap(sharer.pod, sharer.capabilities, data):
                    await self._configmap_recreated(sharer, sharer.capabilities)
        elif old != visible:
            await self._patch_configmap(
                sharer.namespace, sharer.capabilities, {gs.NVIDIA_VISIBLE_DEVICES: visible}
            )
            self.counters["configmaps_rewritten"] += 1
            if not any((sharer.node, g) in recreated for g in sharer.groups):
                # Recreated by another binder, or by a pass that died before this rewrite.
                message = (
                    f"the GPU-sharing ConfigMap {sharer.namespace}/{sharer.capabilities} named {old}, but the "
                    f"reservation pods of its GPU groups hold {visible}: rewritten; the running container still "
                    f"uses {old} until it is restarted"
                )
                await self._warn(sharer.pod, gpu_sharing_plan.RESERVATION_MISSING, message)
        if (sharer.namespace, sharer.direct_env) not in configmaps and await self._ensure_configmap(
            sharer.pod, sharer.direct_env, {}
        ):
            await self._configmap_recreated(sharer, sharer.direct_env)

    async def _configmap_recreated(self, sharer: gpu_sharing_plan.Sharer, name: str) -> None:
        self.counters["configmaps_recreated"] += 1
        await self._warn(
            sharer.pod,
            gpu_sharing_plan.CONFIGMAP_MISSING,
            gpu_sharing_plan.configmap_missing_message(sharer.namespace, name),
        )

    async def _warn(self, pod: wire.Pod, reason: str, message: str) -> None:
        """A Warning Event on `pod`; a failure is logged and counted, never raised (the repair stands)."""
        kind: Literal["Warning"] = "Warning"
        body = translate.event(
            translate.involved_object(pod),
            reason=reason,
            message=message,
            now=self.clock(),
            type=kind,
            component=EVENT_COMPONENT,
        )
        try:
            await self._call(
                f"create event on pod {pod.metadata.namespace}/{pod.metadata.name}",
                self.kube.core.create_namespaced_event,
                pod.metadata.namespace,
                body,
            )
        except (ApiError, TemporaryError) as exc:
            self.counters["event_errors"] += 1
            log.warning(
                "could not record %s on %s/%s: %s", reason, pod.metadata.namespace, pod.metadata.name, exc
            )
            return
        self.counters["kube_events"] += 1
        log.warning("%s/%s: %s: %s", pod.metadata.namespace, pod.metadata.name, reason, message)

    # --- the background loop -------------------------------------------------------------------------------------
    async def _sharer_changed(self, kind: str, raw: msgspec.Raw) -> None:
        try:
            pod = wire.decode_pod(bytes(raw))
        except InvalidObject:
            return
        if kind == "DELETED" or pod.status.phase in wire.FINISHED_PHASES or pod.metadata.deletion_timestamp:
            due = asyncio.get_running_loop().time() + self.settings.grace
            for value in gs.groups_of_labels(pod.metadata.labels):
                self._due[value] = max(self._due.get(value, 0.0), due)
            self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Until `stopping`: a full sync at once and every `sync` seconds, and a sync of a sharer's groups
        `grace` seconds after it is deleted or finishes. A failed pass is logged; the next one runs."""
        loop = asyncio.get_running_loop()

        async def ignore(_items: list[msgspec.Raw]) -> None:
            return None

        informer = Informer(
            self.kube,
            "GPU-sharing pods",
            self.kube.core.list_pod_for_all_namespaces,
            ignore,
            self._sharer_changed,
            kwargs={"label_selector": f"{gs.SHARING_LABEL}=true"},
        )
        watching = asyncio.create_task(informer.run())
        next_full = loop.time()
        try:
            async with self.devices.held():
                await self._loop(stopping, next_full)
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching

    async def _loop(self, stopping: asyncio.Event, next_full: float) -> None:
        loop = asyncio.get_running_loop()
        while not stopping.is_set():
            self._wake.clear()
            if loop.time() >= next_full:
                await self._pass("sync", self.sync(self.clock()))
                self.first_sync.set()
                next_full = loop.time() + self.settings.sync
            due = sorted(v for v, at in self._due.items() if at <= loop.time())
            if due:
                for value in due:
                    del self._due[value]
                await self._pass("sync of finished sharers' groups", self.sync_groups(due, self.clock()))
            deadline = min([next_full, *self._due.values()])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_either(stopping, self._wake), max(0.0, deadline - loop.time()))

    async def _pass(self, what: str, work: Awaitable[object]) -> None:
        try:
            await work
        except (ApiError, TemporaryError, InvalidObject) as exc:
            # The API server refused or did not answer (RBAC, the namespace missing, a restart): one line.
            self.counters["sync_errors"] += 1
            log.warning("GPU sharing %s failed (the next pass tries again): %s", what, exc)
        except Exception:
            self.counters["sync_errors"] += 1
            log.exception("GPU sharing %s failed; the next pass tries again", what)


async def _either(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
