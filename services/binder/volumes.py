"""The binder's volume step (``volumebinding``, a `services.binder.steps.BindStep`, the first by default):
before a pod's binding, carry out what placement decided for its WaitForFirstConsumer claims
(`Binding.volumes`, `shared.core.volumes`), and undo it if the binding is refused.

Run by `services.binder.steps.BindSteps` for a binding with volume decisions (`VolumeSteps.applies`; an
ordinary pod's bind makes no call here). Per claim, in the decision's order, as kube-scheduler's volume
binder does it (``bindAPIUpdate``):

- a static volume: the volume is read and, unless it is already reserved for this claim, its ``claimRef``
  set to the claim (with ``pv.kubernetes.io/bound-by-controller``) in an update carrying the resourceVersion
  read, so two binders never reserve one volume; kube-controller-manager's volume controller then binds
  the claim to it (kube-scheduler, too, writes only the volume and leaves the claim to the controller, whose
  ``spec.volumeName`` cannot be taken back). A volume reserved for another claim, or a claim bound to
  another volume, refuses the pod's bind (`ClusterRefused`): the cluster moved since the decision;
- provisioning: the claim gets ``volume.kubernetes.io/selected-node`` = the pod's node (a merge patch),
  which the claim's provisioner acts on; a claim already selected for another node refuses the bind.

Then, as kube-scheduler's PreBind does (``BindPodVolumes``), it waits until every claim decided is bound
as decided (`services.binder.volume_wait`: the static volume chosen, or a provisioned volume whose node
affinity admits the node), at most `VolumeSteps.bind_timeout` seconds (the binder option
`volume_bind_timeout`, 120 s as KAI's volumebinding binder plugin; kube-scheduler's own default is 600 s).
The claims are read again at once (kubesim's controllers, and a volume controller that is quick, have
finished by then), then with backoff up to one second apart, kube-scheduler's polling interval; a claim
found bound is not read again. While it waits, the pod is read too: a pod deleted or created again under
its name meanwhile ends the wait. A provisioner that gives up (it removes ``selected-node``, as
external-provisioner does after a Warning ``ProvisioningFailed`` on the claim), a claim bound to another
volume, a reservation dropped, a volume whose node affinity excludes the node, or the timeout refuse the
pod's bind (`VolumeBindFailed`, a `ClusterRefused`): what this call set is taken back, the binder releases
the pod's claim and reservation in its ledger, so the pod is Pending again and, once its podgroup's bind
back-off ends (`shared.core.bind_backoff`: 1 s, doubled per failure in a row, at most 10 s; the refusal's
`reason` is what the back-off's record says), a cycle decides for it on the cluster as it then is; a
Warning ``FailedScheduling`` on the pod says why in kube-scheduler's
words (``running PreBind plugin "VolumeBinding": binding volumes: provisioning failed for PVC "data"``,
with the provisioner's last ProvisioningFailed message when there is one), at most once per pod and
message every `VolumeSteps.repeat_after` seconds. A ProvisioningFailed Event alone does not end the wait:
external-provisioner retries after it, and only the annotation's removal says it gave up (kube-scheduler
reads it the same way).

Both are idempotent, so a bind the recovery scan repeats finds them done. If a claim's step fails, what
this call changed is undone before the refusal is raised; if a later step fails or the pod's binding is
refused, the runner calls `undo`. Either way in reverse order: the volume's ``claimRef`` removed while it
still names the claim's uid, the annotation removed; an undo that fails is logged and counted, never raised
(the refusal stands). A binding without an answer keeps them: the recovery scan binds the pod later.
(kube-scheduler writes nothing back on a failure; undoing here lets the next decision choose another
volume or node at once instead of after the volume controller's resync.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from services.binder import volume_wait
from services.binder.cluster_client import ClusterRefused, pod_replaced
from services.binder.volume_watch import VolumeWatch, claim_key, version, volume_key
from shared.backoff import Backoff
from shared.bus.middleware import Counters
from shared.contracts.messages import Binding
from shared.core.result import VolumeBinding
from shared.errors import InvalidObject, TemporaryError
from shared.kube import keys, translate, wire
from shared.kube.volumes import BOUND_BY_CONTROLLER, SELECTED_NODE, WireClaim, WireVolume, decode
from shared.kubeapi.client import JSON, MERGE_PATCH, ApiError, Kube

__all__ = [
    "BIND_TIMEOUT_S",
    "FAILED_SCHEDULING",
    "PROVISIONING_FAILED",
    "Done",
    "VolumeBindFailed",
    "VolumeSteps",
]

log = logging.getLogger("kairos.binder.volumes")

BIND_TIMEOUT_S = 120.0
"""How long a bind waits for its claims to be bound: KAI's volumebinding binder plugin's default
(``bindTimeoutSeconds``); kube-scheduler's VolumeBindingArgs default to 600 s."""
POLL = Backoff(attempts=1_000_000, base=0.05, cap=1.0, jitter=0.5)
"""The waits between reads of the claims while the watch has not listed them: short at first, then
kube-scheduler's one second; once it has, a wait ends at the first change of a claim or volume it waits on,
and the pod is read again after `POLL.cap` seconds without one."""
NOT_FOUND = 404
FAILED_SCHEDULING = "FailedScheduling"
"""The reason of the Warning on a pod whose volumes could not be bound (kube-scheduler's, for a PreBind
failure)."""
PROVISIONING_FAILED = "ProvisioningFailed"
"""The reason of a provisioner's Warning on a claim it could not provision (external-provisioner's)."""
PREBIND_PLUGIN = 'running PreBind plugin "VolumeBinding": '
PREBIND = PREBIND_PLUGIN + "binding volumes: "
EVENT_COMPONENT = "kairos-binder"


class VolumeBindFailed(ClusterRefused):
    """The pod's claims did not become bound as decided (`services.binder.volume_wait`), or not in time:
    the pod's bind is refused, and the next cycle decides for it again."""

    def __init__(self, pod: str, problem: str, claim: str = "") -> None:
        self.problem = problem
        self.claim = claim
        super().__init__("bind", pod, f"binding volumes: {problem}")


class _Event(msgspec.Struct, frozen=True):
    reason: str = ""
    message: str = ""
    lastTimestamp: str | None = None  # noqa: N815 -- the Kubernetes field name
    involvedObject: dict[str, Any] = msgspec.field(default_factory=dict)  # noqa: N815


class _Events(msgspec.Struct, frozen=True):
    items: list[_Event] = msgspec.field(default_factory=list)


_EVENTS = msgspec.json.Decoder(_Events)
_POD = msgspec.json.Decoder(wire.Pod)
_NODE = msgspec.json.Decoder(wire.Node)


@dataclass(frozen=True)
class Done:
    """One change the step made, to be undone if the pod's binding is refused."""

    kind: str
    """"volume" (a claimRef set on `name`) or "claim" (the selected-node annotation set on it)."""
    name: str
    namespace: str = ""
    claim_uid: str = ""


def _volume_path(name: str) -> str:
    return f"/api/v1/persistentvolumes/{name}"


def _claim_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}"


@dataclass
class VolumeSteps:
    """The ``volumebinding`` bind step (`services.binder.steps.BindStep`)."""

    name: ClassVar[str] = "volumebinding"
    kube: Kube
    counters: Counters = field(default_factory=Counters)
    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)
    bind_timeout: float = BIND_TIMEOUT_S
    """Seconds a bind waits for its claims to be bound before it is refused (`volume_bind_timeout`)."""
    poll: Backoff = POLL
    clock: Callable[[], float] = time.time
    """Wall clock (Unix s): Event times and their repeats."""
    repeat_after: float = 300.0
    """Seconds before the same failure of the same pod is reported again."""
    watch: VolumeWatch | None = None
    """The claims and volumes watched for every bind of this replica (`services.binder.volume_watch`),
    made with the step; None: each wait reads them from the API."""
    watching: bool = True
    """Whether the step makes `watch` (False: the wait reads claims with GETs only)."""
    _reported: dict[str, tuple[str, float]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.watch is None and self.watching:
            self.watch = VolumeWatch(self.kube)

    def applies(self, binding: Binding) -> bool:
        """A binding with volume decisions (WaitForFirstConsumer claims placement decided)."""
        return bool(binding.volumes)

    async def prepare(self, binding: Binding) -> list[Done]:
        """Carry out the pod's volume decisions and wait until its claims are bound as decided; on a
        refusal, undo what was done and raise it."""
        async with contextlib.AsyncExitStack() as stack:
            if self.watch is not None:
                # Started first, so it lists while the steps below write.
                await stack.enter_async_context(self.watch.held())
            return await self._prepare(binding)

    async def _prepare(self, binding: Binding) -> list[Done]:
        done: list[Done] = []
        floor: dict[str, int] = {}
        try:
            for decision in binding.volumes:
                change = await self._one(binding, decision, floor)
                if change is not None:
                    done.append(change)
            try:
                await self._wait_bound(binding, floor)
            except InvalidObject as exc:  # a claim, volume or node it cannot read: named, never bound
                raise VolumeBindFailed(binding.pod, str(exc)) from exc
        except VolumeBindFailed as exc:
            await self.undo(done)
            await self._report(binding, exc)
            raise
        except ApiError as exc:
            await self.undo(done)
            raise ClusterRefused("bind", binding.pod, f"volumes: {exc}") from exc
        except Exception:
            await self.undo(done)
            raise
        return done

    async def undo(self, done: list[Done]) -> None:
        """Take back what `prepare` changed, newest first; failures are logged and counted."""
        for change in reversed(done):
            try:
                if change.kind == "volume":
                    await self._release_volume(change)
                else:
                    await self._unselect(change)
                self.counters["volume_steps_undone"] += 1
            except Exception as exc:  # noqa: BLE001 -- an undo that fails must not hide the refusal
                self.counters["volume_undo_errors"] += 1
                log.warning("could not undo %s %s: %s", change.kind, change.name, exc)

    # --- the steps ----------------------------------------------------------------------------------------
    async def _one(self, binding: Binding, decision: VolumeBinding, floor: dict[str, int]) -> Done | None:
        """`floor` gets the resourceVersion of each claim and volume read or written: the wait reads them
        no older than that."""
        namespace = binding.namespace
        claim = await self._get(
            f"get claim {namespace}/{decision.claim}", _claim_path(namespace, decision.claim)
        )
        meta = claim.get("metadata", {})
        _raise_floor(floor, claim_key(namespace, decision.claim), meta)
        uid = str(meta.get("uid", ""))
        spec = claim.get("spec", {})
        bound_to = spec.get("volumeName") or ""
        if decision.volume:
            if bound_to and bound_to != decision.volume:
                raise ClusterRefused(
                    "bind",
                    binding.pod,
                    f"claim {decision.claim} is bound to {bound_to}, not {decision.volume}",
                )
            return await self._reserve_volume(binding, decision, uid, floor)
        if bound_to:
            return None  # provisioned and bound since the decision: nothing left to ask for
        selected = (meta.get("annotations") or {}).get(SELECTED_NODE)
        if selected == binding.node:
            return None
        if selected:
            raise ClusterRefused(
                "bind", binding.pod, f"claim {decision.claim} is being provisioned for node {selected}"
            )
        patch = {"metadata": {"annotations": {SELECTED_NODE: binding.node}}}
        written = await self._send(
            f"select node for claim {namespace}/{decision.claim}",
            "PATCH",
            _claim_path(namespace, decision.claim),
            patch,
            MERGE_PATCH,
        )
        _raise_floor(floor, claim_key(namespace, decision.claim), _metadata(written))
        self.counters["volume_claims_selected"] += 1
        return Done("claim", decision.claim, namespace)

    async def _reserve_volume(
        self, binding: Binding, decision: VolumeBinding, uid: str, floor: dict[str, int]
    ) -> Done | None:
        name = decision.volume
        pv = await self._get(f"get volume {name}", _volume_path(name))
        _raise_floor(floor, volume_key(name), pv.get("metadata", {}))
        spec = pv.setdefault("spec", {})
        ref = spec.get("claimRef") or {}
        if ref.get("name"):
            ours = ref.get("name") == decision.claim and ref.get("namespace") == binding.namespace
            if ours and (not ref.get("uid") or ref.get("uid") == uid):
                return None
            held = f"{ref.get('namespace', '')}/{ref.get('name', '')}"
            raise ClusterRefused("bind", binding.pod, f"volume {name} is reserved for claim {held}")
        spec["claimRef"] = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": binding.namespace,
            "name": decision.claim,
            "uid": uid,
        }
        annotations = pv.setdefault("metadata", {}).setdefault("annotations", {})
        annotations[BOUND_BY_CONTROLLER] = "yes"
        written = await self._send(f"reserve volume {name}", "PUT", _volume_path(name), pv)
        _raise_floor(floor, volume_key(name), _metadata(written))
        self.counters["volume_claims_reserved"] += 1
        return Done("volume", name, binding.namespace, uid)

    async def _release_volume(self, change: Done) -> None:
        pv = await self._get(f"get volume {change.name}", _volume_path(change.name))
        spec = pv.get("spec", {})
        ref = spec.get("claimRef") or {}
        if not ref or (change.claim_uid and ref.get("uid") != change.claim_uid):
            return
        spec.pop("claimRef", None)
        (pv.get("metadata", {}).get("annotations") or {}).pop(BOUND_BY_CONTROLLER, None)
        await self._send(f"release volume {change.name}", "PUT", _volume_path(change.name), pv)

    async def _unselect(self, change: Done) -> None:
        patch = {"metadata": {"annotations": {SELECTED_NODE: None}}}
        path = _claim_path(change.namespace, change.name)
        await self._send(
            f"unselect claim {change.namespace}/{change.name}", "PATCH", path, patch, MERGE_PATCH
        )

    # --- the wait -----------------------------------------------------------------------------------------
    async def _wait_bound(self, binding: Binding, floor: dict[str, int]) -> None:
        """Until every decision's claim is bound as decided (`volume_wait.check`); `VolumeBindFailed` when
        one never will be, or after `bind_timeout` seconds. The claims and volumes are read from the watch
        once it has listed them (no older than `floor`), from the API before."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.bind_timeout
        waiting = list(binding.volumes)
        labels: dict[str, str] | None = None
        attempt = 0
        quiet = False
        while True:
            still: list[VolumeBinding] = []
            keys: list[str] = []
            for decision in waiting:
                keys.append(claim_key(binding.namespace, decision.claim))
                claim = await self._claim(binding, decision.claim, floor)
                if claim is None:  # the watch has not caught up with what the step read or wrote
                    still.append(decision)
                    continue
                volume: WireVolume | None = None
                if named := volume_wait.volume_to_read(decision, claim):
                    keys.append(volume_key(named))
                    known, volume = await self._volume(named, floor)
                    if not known:
                        still.append(decision)
                        continue
                if labels is None and volume_wait.needs_labels(volume):
                    labels = await self._node_labels(binding)
                verdict = volume_wait.check(decision, binding.node, claim, volume, labels or {})
                if verdict.problem:
                    self.counters["volume_binds_failed"] += 1
                    raise VolumeBindFailed(binding.pod, verdict.problem, decision.claim)
                if not verdict.bound:
                    still.append(decision)
            waiting = still
            if not waiting:
                if attempt:
                    self.counters["volume_binds_waited"] += 1
                return
            left = deadline - loop.time()
            if left <= 0:
                self.counters["volume_bind_timeouts"] += 1
                names = ", ".join(d.claim for d in waiting)
                raise VolumeBindFailed(
                    binding.pod,
                    f"timed out waiting for the condition: PVC(s) not bound within {self.bind_timeout:g} s: "
                    f"{names}",
                    waiting[0].claim,
                )
            watched = self.watch is not None and self.watch.synced
            if attempt and (quiet or not watched):
                await self._pod_still_there(binding)
            delay = self.poll.cap if watched else self.poll.delay(attempt, self.rng)
            if self.watch is not None:
                quiet = not await self.watch.changed(keys, min(delay, left))
            else:
                await asyncio.sleep(min(delay, left))
            attempt += 1

    async def _claim(self, binding: Binding, name: str, floor: Mapping[str, int]) -> WireClaim | None:
        """The claim from the watch (None: not caught up yet), or from the API while it has not listed."""
        namespace = binding.namespace
        if self.watch is not None and self.watch.synced:
            seen = self.watch.claim(namespace, name, floor.get(claim_key(namespace, name)))
            if not seen.known:
                return None
            body = seen.raw
            self.counters["volume_wait_watched_reads"] += 1
        else:
            try:
                body = await self._get_raw(f"get claim {namespace}/{name}", _claim_path(namespace, name))
            except ApiError as exc:
                if exc.status != NOT_FOUND:
                    raise
                body = None
        if body is None:
            raise VolumeBindFailed(binding.pod, f'persistentvolumeclaim "{name}" not found', name)
        found = decode("persistentvolumeclaims", body)
        assert isinstance(found, WireClaim)
        return found

    async def _volume(self, name: str, floor: Mapping[str, int]) -> tuple[bool, WireVolume | None]:
        """(known, the volume or None when it does not exist): from the watch (not known while it has not
        caught up), or from the API while it has not listed."""
        if self.watch is not None and self.watch.synced:
            seen = self.watch.volume(name, floor.get(volume_key(name)))
            if not seen.known:
                return False, None
            body = seen.raw
        else:
            try:
                body = await self._get_raw(f"get volume {name}", _volume_path(name))
            except ApiError as exc:
                if exc.status != NOT_FOUND:
                    raise
                body = None
        if body is None:
            return True, None
        found = decode("persistentvolumes", body)
        assert isinstance(found, WireVolume)
        return True, found

    async def _node_labels(self, binding: Binding) -> dict[str, str]:
        """The node's labels, as translation gives them (its name under `keys.NODE_NAME_LABEL`)."""
        try:
            body = await self._get_raw(f"get node {binding.node}", f"/api/v1/nodes/{binding.node}")
        except ApiError as exc:
            if exc.status == NOT_FOUND:
                raise VolumeBindFailed(binding.pod, f'node "{binding.node}" not found') from exc
            raise
        try:
            node = _NODE.decode(body)
        except msgspec.DecodeError as exc:
            raise InvalidObject("Node", binding.node, "", str(exc)) from exc
        return {**node.metadata.labels, keys.NODE_NAME_LABEL: binding.node}

    async def _pod_still_there(self, binding: Binding) -> None:
        """While waiting: the pod deleted, or created again under its name, ends the wait
        (kube-scheduler's check too)."""
        path = f"/api/v1/namespaces/{binding.namespace}/pods/{binding.name}"
        try:
            body = await self._get_raw(f"get pod {binding.pod}", path)
        except ApiError as exc:
            if exc.status == NOT_FOUND:
                raise VolumeBindFailed(binding.pod, "pod does not exist any more") from exc
            raise
        try:
            uid = _POD.decode(body).metadata.uid
        except msgspec.DecodeError:
            return  # the binding's own call will say what is wrong with it
        if binding.uid and uid != binding.uid:
            raise pod_replaced("bind", binding.pod, binding.uid, uid)

    # --- the report ---------------------------------------------------------------------------------------
    async def _report(self, binding: Binding, failure: VolumeBindFailed) -> None:
        """A Warning FailedScheduling on the pod saying why its volumes were not bound (with the
        provisioner's own message for a provisioning failure); the same message on the same pod again
        within `repeat_after` is not reported again. A failure to write it is logged and counted."""
        now = self.clock()
        for key, (_, when) in list(self._reported.items()):
            if now - when >= self.repeat_after:
                del self._reported[key]
        message = PREBIND + failure.problem
        if failure.claim and failure.problem.startswith("provisioning failed"):
            said = await self._provisioner_said(binding.namespace, failure.claim)
            if said:
                message += f": {said}"
        # The refusal carries the provisioner's words too: the bind back-off's record says them again.
        failure.reason = message.removeprefix(PREBIND_PLUGIN)
        if self._reported.get(binding.pod, ("", 0.0))[0] == message:
            return
        self._reported[binding.pod] = (message, now)
        about = translate.InvolvedObject(
            api_version="v1", kind="Pod", name=binding.name, namespace=binding.namespace, uid=binding.uid
        )
        body = translate.event(
            about,
            reason=FAILED_SCHEDULING,
            message=message,
            now=now,
            type="Warning",
            component=EVENT_COMPONENT,
        )
        try:
            await self._send(
                f"create event on pod {binding.pod}",
                "POST",
                f"/api/v1/namespaces/{binding.namespace}/events",
                body,
            )
        except (ApiError, TemporaryError) as exc:
            self.counters["event_errors"] += 1
            log.warning("could not record %s on %s: %s", FAILED_SCHEDULING, binding.pod, exc)
            return
        self.counters["kube_events"] += 1

    async def _provisioner_said(self, namespace: str, claim: str) -> str:
        """The newest ProvisioningFailed message on the claim ("" when none, or when it cannot be read)."""
        path = f"/api/v1/namespaces/{namespace}/events?fieldSelector=involvedObject.name%3D{claim}"
        try:
            listed = _EVENTS.decode(await self._get_raw(f"list events of claim {namespace}/{claim}", path))
        except (ApiError, TemporaryError, msgspec.DecodeError) as exc:
            log.info("could not read why claim %s/%s was not provisioned: %s", namespace, claim, exc)
            return ""
        failed = [
            e
            for e in listed.items
            if e.reason == PROVISIONING_FAILED and e.involvedObject.get("kind") == "PersistentVolumeClaim"
        ]
        if not failed:
            return ""
        return max(failed, key=lambda e: e.lastTimestamp or "").message

    # --- calls --------------------------------------------------------------------------------------------
    async def _get_raw(self, what: str, path: str) -> bytes:
        return await self.kube.request_with_retries(what, "GET", path, backoff=self.backoff, rng=self.rng)

    async def _get(self, what: str, path: str) -> dict[str, Any]:
        obj: dict[str, Any] = msgspec.json.decode(await self._get_raw(what, path))
        return obj

    async def _send(self, what: str, method: str, path: str, body: Any, content_type: str = JSON) -> bytes:
        return await self.kube.request_with_retries(
            what, method, path, body, backoff=self.backoff, rng=self.rng, content_type=content_type
        )


def _metadata(body: bytes) -> dict[str, Any]:
    """The metadata of an object the API answered a write with ({} when the answer is not one)."""
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return {}
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return meta if isinstance(meta, dict) else {}


def _raise_floor(floor: dict[str, int], key: str, meta: Mapping[str, Any]) -> None:
    """The wait reads `key` no older than the resourceVersion in `meta` (one that is not a number: no floor)."""
    at = version(str(meta.get("resourceVersion", "")))
    if at is not None:
        floor[key] = max(at, floor.get(key, 0))
