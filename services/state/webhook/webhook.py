"""The state service's mutating admission webhook: GPU-sharing environment, the stages' and the quota gate.

Served by every state replica that has `webhook_port` set (a Kubernetes Service spreads the API server's calls
over them; standbys answer too: the answer needs no mirror). The API server POSTs an AdmissionReview
(`services.state.webhook.admission_review`) for each pod created (`deploy/`'s MutatingWebhookConfiguration, or
kubesim's in `kairos up`); for a pod of ours that is not bound yet, the handler reads what could declare
`kairos.io/after` — the pod's own annotations, its explicit PodGroup's (`pod-group-name`), and those of each
owner up its chain (a Job, a ReplicaSet and its Deployment, ...) — and, when one does, answers with the JSON
patch that adds the `kairos.io/after` scheduling gate (`services.state.webhook.gate_patches`). The gate keeper
(`services.state.controllers.gate_keepers`) lifts it once the dependencies have succeeded. With `quota_gate` (the state
option), every pod of ours that is not bound yet also gets the `kairos.io/admission` scheduling gate (both
gates in one patch when both apply); the owner's quota gate keeper
(`services.state.controllers.gate_keepers.QuotaGateKeeper`) lifts it once the queue leader says the podgroup's queues have
room for its gang. A fractional pod of ours (``gpu-fraction``, ``gpu-memory``) also gets KAI's GPU-sharing
environment (`shared.kube.gpu_sharing.admission_patch`: ``NVIDIA_VISIBLE_DEVICES`` and ``GPU_PORTION`` from a
ConfigMap the binder fills at bind time); a replica that sees the pod already mutated by another leaves it
alone. It also gets ``spec.runtimeClassName`` (`runtime_class_patch`): the state option
`gpu_fraction_runtime_class_name`, KAI's ``--gpu-fraction-runtime-class-name`` (default ``nvidia``, the
NVIDIA container runtime that gives a container without a device request the GPU its environment names;
empty: none), only for fractional pods since KAI v0.16 (whole-GPU pods get their device from the device
plugin and run as the cluster runs them), never replacing a runtime class the pod names.

Two opt-in switches of KAI v0.17, off by default as KAI's: with `block_nvidia_visible_devices` (the state
option, KAI's ``--block-nvidia-visible-devices``) a pod of ours whose GPU container sets
``NVIDIA_VISIBLE_DEVICES`` to anything but ``void``/``none`` is refused (``allowed: false``, the message
naming the pod, the container and its ``env`` entry: `services.state.webhook.device_access.refusal`), and every
container that asks for no GPU gets ``NVIDIA_VISIBLE_DEVICES=void`` (`device_access.void_patch`). With
`hami_core_enabled` (KAI's ``--hami-core-enabled``) a fractional pod's container also gets
``CUDA_DEVICE_MEMORY_LIMIT`` from its capabilities ConfigMap (`gpu_sharing.memory_limit_patch`), which the
binder fills at bind time with its own `hami_core_enabled` (`services.binder.hami`).

The pod's PodGroup is looked up in the Kubernetes source's mirror first (`services.state.webhook.podgroup_lookup`):
on the replica leading the source that answers without a call, whether the PodGroup is there or not yet (a
pod is usually created before its PodGroup, so the read was a 404 for nearly every pod); elsewhere the API is
read. Owners are read through the API with a short timeout and cached for `OWNER_TTL` seconds, so a Job's
hundred pods cost one read. Anything that goes wrong (an owner that cannot be read, a pod that does not
decode) admits the pod unchanged with a warning: the state service holds a waiting podgroup back from
scheduling by itself, and the core keeps a queue within its limit and quota by itself, so a missing gate
costs only the autoscaler signal, never a wrong start. A body that is not an AdmissionReview gets 400 naming what is wrong. TLS when a
certificate and key are given (the Kubernetes API server calls webhooks only over HTTPS; kubesim also accepts
plain HTTP); the files are looked at again every `CERT_CHECK` seconds and a renewed pair (cert-manager
rewrites the Secret, the kubelet the mounted files) is loaded without a restart; a pair that does not load
keeps the old one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web
from cachetools import TTLCache

from services.state.controllers.grouping import owner_refs_to_follow
from services.state.webhook import admission_review, device_access, gate_patches
from services.state.webhook.podgroup_lookup import UNKNOWN, PodGroupLookup
from shared.bus.service import ServiceContext
from shared.errors import InvalidObject
from shared.kube import gpu_sharing, keys, wire
from shared.kube.scheduling_gates import ADMISSION_GATE, GATE
from shared.kubeapi.client import ApiError, Kube
from shared.kubeapi.paths import get_object

log = logging.getLogger("kairos.state.admission")

PATH = "/mutate-pods"
OWNER_TTL = 10.0
"""Seconds an owner's annotations are reused for the next pods it creates."""
OWNER_CACHE_SIZE = 4096
"""Owners remembered at most; past it the least recently used goes first (a burst of pods of as many
podgroups, each read once)."""
LOOKUP_TIMEOUT = 2.0
"""Seconds one owner read may take: the API server's own call to us times out at 5 s (deploy/)."""
MAX_OWNER_DEPTH = 8
CERT_CHECK = 60.0
"""Seconds between looks at the certificate files for a renewal."""
DEFAULT_RUNTIME_CLASS = "nvidia"
"""KAI's ``DefaultRuntimeClassName``: the RuntimeClass the NVIDIA GPU Operator installs."""
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""Characters of the random part of a GPU-sharing ConfigMap name (no vowels: no words by chance)."""


def _random_chars() -> str:
    return "".join(secrets.choice(_NAME_ALPHABET) for _ in range(7))


def runtime_class_patch(
    pod: wire.Pod, request: admission_review.AdmissionRequest, runtime_class: str
) -> list[dict[str, Any]]:
    """JSON patch setting ``spec.runtimeClassName`` of a fractional pod being created (`pod`, decoded from
    `request`) to `runtime_class`; empty when the switch is off (`runtime_class` empty), the pod asks for no
    share of a GPU, or it names a runtime class itself (read from the pod as the API server sent it,
    `admission_review.runtime_class_of`: the decoded `pod` does not keep the field; KAI counts an empty name
    as none). KAI also leaves its GPU reservation pods alone; Kairos's binder creates them bound, and the
    webhook never looks at a bound pod."""
    if not runtime_class or not gpu_sharing.is_fractional(pod):
        return []
    if admission_review.runtime_class_of(request):
        return []
    return [{"op": "add", "path": "/spec/runtimeClassName", "value": runtime_class}]


@dataclass(frozen=True)
class WebhookOptions:
    port: int
    host: str = "0.0.0.0"
    """Every interface by default: the API server reaches the webhook through a Service."""
    cert: str | None = None
    key: str | None = None
    scheduler_name: str = keys.SCHEDULER_NAME
    quota_gate: bool = False
    """Give every pod of ours the `kairos.io/admission` gate (the state option `quota_gate`)."""
    fraction_runtime_class: str = DEFAULT_RUNTIME_CLASS
    """The runtime class a fractional pod of ours gets (`runtime_class_patch`); empty: none."""
    routes: tuple[tuple[str, Callable[[web.Request], Awaitable[web.StreamResponse]]], ...] = ()
    """Further endpoints on the same server, (path, handler): the Queue validation (`queue_validation`)."""
    block_nvidia_visible_devices: bool = False
    """Refuse a pod of ours whose GPU container sets ``NVIDIA_VISIBLE_DEVICES``, void its containers that
    ask for no GPU (`services.state.webhook.device_access`; the state option of the same name)."""
    hami_core: bool = False
    """Give a fractional pod's container ``CUDA_DEVICE_MEMORY_LIMIT`` from its ConfigMap (the state option
    `hami_core_enabled`)."""
    podgroups: PodGroupLookup | None = None
    """What the Kubernetes source's mirror knows of a PodGroup (`services.state.webhook.podgroup_lookup`): asked
    before the API, which is read only when it cannot tell. None: always the API."""


class AdmissionServer:
    def __init__(self, ctx: ServiceContext, kube: Kube, options: WebhookOptions) -> None:
        self.ctx = ctx
        self.kube = kube
        self.options = options
        self._runner: web.AppRunner | None = None
        self._owners: TTLCache[tuple[str, str, str, str], asyncio.Task[dict[str, Any] | None]] = TTLCache(
            maxsize=OWNER_CACHE_SIZE, ttl=OWNER_TTL, timer=lambda: asyncio.get_running_loop().time()
        )
        """Owner reads, done or under way, by (namespace, apiVersion, kind, name)."""
        self.port = options.port
        self._context: ssl.SSLContext | None = None
        self._cert_stamp: tuple[int, int] | None = None
        self._cert_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post(PATH, self.handle)
        for path, handler in self.options.routes:
            app.router.add_post(path, handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        context = None
        if self.options.cert and self.options.key:
            context = self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.reload_certificate()
            self._cert_task = asyncio.create_task(self._watch_certificate())
        site = web.TCPSite(self._runner, self.options.host, self.options.port, ssl_context=context)
        await site.start()
        if self._runner.addresses:
            self.port = int(self._runner.addresses[0][1])
        log.info(
            "admission webhook on %s://%s:%d%s",
            "https" if context else "http",
            self.options.host,
            self.port,
            PATH,
        )

    def reload_certificate(self) -> bool:
        """Load the certificate and key into the serving context when the files changed since the last
        load (new connections get it); True when loaded. Errors propagate (the first load must work)."""
        cert, key = self.options.cert, self.options.key
        if self._context is None or cert is None or key is None:
            return False
        stamp = (os.stat(cert).st_mtime_ns, os.stat(key).st_mtime_ns)
        if stamp == self._cert_stamp:
            return False
        self._context.load_cert_chain(cert, key)
        if self._cert_stamp is not None:
            log.info("admission webhook: renewed certificate loaded from %s", cert)
            self.ctx.counters["webhook_certificate_reloads"] += 1
        self._cert_stamp = stamp
        return True

    async def _watch_certificate(self) -> None:
        while True:
            await asyncio.sleep(CERT_CHECK)
            try:
                self.reload_certificate()
            except (OSError, ssl.SSLError) as exc:
                # A rotation caught halfway: keep serving the old pair and look again next time.
                log.warning("admission webhook: certificate not reloaded, keeping the old one: %s", exc)

    async def stop(self) -> None:
        if self._cert_task is not None:
            self._cert_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cert_task
            self._cert_task = None
        self._owners.expire()
        for task in self._owners.values():
            task.cancel()
        self._owners.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.ctx.counters["admission_reviews"] += 1
        try:
            review = admission_review.decode_review(body)
        except InvalidObject as exc:
            self.ctx.counters["admission_malformed"] += 1
            log.warning("refused an admission call: %s", exc)
            return web.Response(status=400, text=str(exc))
        try:
            patch, warning = await self.decide(review)
        except device_access.DeviceAccessRefused as exc:
            self.ctx.counters["admission_refused_device_access"] += 1
            log.info("refused admission review %s: %s", review.uid, exc)
            answer = admission_review.refusal_response(review.uid, str(exc))
        else:
            answer = admission_review.review_response(review.uid, patch, warning)
        return web.Response(body=msgspec.json.encode(answer), content_type="application/json")

    async def decide(
        self, review: admission_review.AdmissionRequest
    ) -> tuple[list[dict[str, Any]] | None, str]:
        """The patch for the pod (None: admitted as it is) and a warning for the user ("" when none);
        `device_access.DeviceAccessRefused` when the pod is refused (`block_nvidia_visible_devices`). A pod
        whose examination fails unforeseen (a bug its content reaches) is admitted as it is, with a warning,
        and logged: the webhook answers for every other pod as before."""
        try:
            return await self._decide(review)
        except device_access.DeviceAccessRefused:
            raise
        except Exception as exc:  # one pod's content must never fail the webhook for the others
            self.ctx.counters["admission_unforeseen"] += 1
            log.exception(
                "admission review %s: examining the pod failed unforeseen; admitted as it is", review.uid
            )
            return None, f"kairos: pod not examined ({type(exc).__name__}); admitted as it is"

    async def _decide(
        self, review: admission_review.AdmissionRequest
    ) -> tuple[list[dict[str, Any]] | None, str]:
        try:
            pod = admission_review.pod_of_request(review)
        except InvalidObject as exc:
            return None, f"kairos: pod not examined for kairos.io/after or GPU sharing: {exc}"
        if pod is None or pod.spec.scheduler_name != self.options.scheduler_name or pod.spec.node_name:
            return None, ""
        if self.options.block_nvidia_visible_devices:
            refused = device_access.refusal(pod)
            if refused is not None:
                raise refused
        patch, warning = self._sharing_patch(pod)
        if self.options.block_nvidia_visible_devices:
            voided = device_access.void_patch(pod)
            if voided:
                patch += voided
                self.ctx.counters["pods_given_void_devices"] += 1
        runtime_class = runtime_class_patch(pod, review, self.options.fraction_runtime_class)
        if runtime_class:
            patch += runtime_class
            self.ctx.counters["pods_given_runtime_class"] += 1
        gates: list[str] = []
        if gate_patches.may_gate(pod, self.options.scheduler_name):
            after, gate_warning = await self._declares_after(pod)
            if after:
                gates.append(GATE)
                self.ctx.counters["pods_gated"] += 1
            warning = warning or gate_warning
        if self.options.quota_gate and gate_patches.may_gate(
            pod, self.options.scheduler_name, ADMISSION_GATE
        ):
            gates.append(ADMISSION_GATE)
            self.ctx.counters["pods_quota_gated"] += 1
        patch += gate_patches.gate_patch(pod, gates)
        return patch or None, warning

    def _sharing_patch(self, pod: wire.Pod) -> tuple[list[dict[str, Any]], str]:
        """A fractional pod's GPU-sharing environment (`shared.kube.gpu_sharing`). A pod whose
        `gpu-fraction-container-name` names no container is admitted as it is, with the reason as a
        warning: the state service holds it with the same reason until it is fixed."""
        if not gpu_sharing.is_fractional(pod):
            # Nothing to share: no ConfigMap name drawn (seven draws from the system's randomness cost more
            # than decoding the review).
            return [], ""
        chars = _random_chars()
        try:
            patch = gpu_sharing.admission_patch(pod, chars)
        except InvalidObject as exc:
            self.ctx.counters["admission_sharing_refused"] += 1
            return [], f"kairos: {exc}; the pod will not be scheduled"
        if patch:
            self.ctx.counters["pods_given_sharing_env"] += 1
            if self.options.hami_core:
                patch += gpu_sharing.memory_limit_patch(pod, gpu_sharing.configmap_prefix(pod, chars))
        return patch, ""

    async def _declares_after(self, pod: wire.Pod) -> tuple[bool, str]:
        """Whether the pod's workload declares `kairos.io/after`, and a warning when that could not be read."""
        try:
            annotation_sets = await self._annotation_sets(pod)
        except (ApiError, InvalidObject) as exc:
            self.ctx.counters["admission_lookup_errors"] += 1
            log.warning(
                "pod %s/%s admitted without the %s gate: %s",
                pod.metadata.namespace,
                pod.metadata.name,
                GATE,
                exc,
            )
            return False, (
                f"kairos: could not read what pod {pod.metadata.name} belongs to ({exc}); it is not gated, "
                "Kairos still holds it until its dependencies succeed"
            )
        return gate_patches.declares_after(annotation_sets), ""

    async def _annotation_sets(self, pod: wire.Pod) -> list[dict[str, str]]:
        namespace = pod.metadata.namespace
        sets = [pod.metadata.annotations]
        group = pod.metadata.annotations.get(keys.PODGROUP_ANNOTATION)
        if group:
            known = self.options.podgroups(namespace, group) if self.options.podgroups else UNKNOWN
            if known == UNKNOWN:
                podgroup = await self._owner(namespace, "scheduling.run.ai/v2alpha2", "PodGroup", group, "")
                if podgroup is not None:
                    sets.append(podgroup.metadata.annotations)
            else:
                self.ctx.counters["admission_podgroups_mirrored"] += 1
                if not isinstance(known, str):
                    sets.append(dict(known))
        obj: wire.Pod | wire.Owner = pod
        for _ in range(MAX_OWNER_DEPTH):
            refs = owner_refs_to_follow(obj)
            if not refs:
                break
            ref = refs[0]
            owner = await self._owner(namespace, ref.api_version, ref.kind, ref.name, ref.uid)
            if owner is None:
                break
            sets.append(owner.metadata.annotations)
            obj = owner
        return sets

    async def _owner(
        self, namespace: str, api_version: str, kind: str, name: str, uid: str
    ) -> wire.Owner | None:
        key = (namespace, api_version, kind, name)
        task = self._owners.get(key)
        if task is None or (task.done() and task.exception() is not None):
            task = asyncio.create_task(self._read(namespace, api_version, kind, name))
            self._owners[key] = task
        raw = await asyncio.shield(task)
        if raw is None:
            return None
        owner = wire.convert(wire.Owner, raw)
        if uid and owner.metadata.uid and owner.metadata.uid != uid:
            return None  # a namesake: the pod's owner is gone
        return owner

    async def _read(self, namespace: str, api_version: str, kind: str, name: str) -> dict[str, Any] | None:
        try:
            data = await asyncio.wait_for(
                get_object(self.kube, api_version, kind, namespace, name), LOOKUP_TIMEOUT
            )
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        except TimeoutError as exc:
            raise ApiError(
                f"get {kind} {namespace}/{name}", 0, "Timeout", f"no answer within {LOOKUP_TIMEOUT:.0f} s"
            ) from exc
        decoded: dict[str, Any] = msgspec.json.decode(data)
        return decoded
