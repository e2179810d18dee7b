"""The shard watch: every SchedulingShard, each kept in KV as the `ShardRecord` of the Kairos shard named
after it.

Run by the state service's Kubernetes owner (`services.state.sources.kube_source.KubeOwner`): one state service
serves every shard of the cluster. One informer lists and watches SchedulingShards (kai.scheduler/v1,
cluster-scoped; a cluster without the CRD has none). After each change, all of them are read together
(`services.state.controllers.shards.read_shards`, which also gives each node pool to one shard). For each:

- valid: its `ShardRecord` (with the state service's ``node_pool_label_key``) is put under
  `subjects.shard_key(shard)` in `STATE_BUCKET` (the shard's queue leader and placement workers read it at
  their next cycle) and an ``Accepted=False`` condition left by an earlier problem is set back to True;
- invalid: the record is left as it is (the last valid configuration stays in force); the SchedulingShard
  gets a Warning Event ``InvalidSchedulingShard`` and ``Accepted=False`` naming the field, once per distinct
  problem (a condition that already shows it, from an earlier owner, gets no second Event);
- gone: the record is deleted (the default shard then runs KAI's defaults on every node; another shard,
  whose node pool is then unknown, schedules nothing: `StateReplica.pool`), and once it has stayed gone
  for `RELEASE_AFTER_S` its durable consumers are deleted (`shared.bus.shard_consumers`), here, once,
  rather than by every replica racing; at its first apply an owner also lists the durables there are and
  deletes in the same way those of shards that have no SchedulingShard (gone before it ran).

Every `SURVEY_S` it also looks at what the shards in force make of the cluster (`services.state.controllers.
shard_coverage`, worked out again only when the replica changed: `services.state.controllers.shard_survey`):
each SchedulingShard in force gets the condition ``Served`` from its queue lease (True naming the queue
replica that leads it, False when none does); one whose node pool has no node gets a Warning Event
``EmptyNodePool`` naming ``spec.partitionLabelValue`` (once per distinct message); and every pending podgroup
no shard will place (its node-pool label names no SchedulingShard in force, or its queue is outside its
shard's pool) gets a `pod-unschedulable` event saying so (once per distinct message, again after it was
served meanwhile), which the write-back turns into PodScheduled=False and a Warning and `kairos explain`
shows.

The API calls and KV writes run on the watch's own task; a failure is logged, counted and retried. The KV
writes go through `state` when given (the owner's `WriteFence`: none lands once the lease is lost).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from services.state.controllers import shard_coverage, shard_notes, shard_survey, shards
from services.state.controllers.problem_report import write_event
from services.state.controllers.writeback import event_time
from services.state.mirror import problems
from services.state.mirror.problems import Problem
from shared.bus import shard_consumers
from shared.bus.fence import KvWrites, WriteFence
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodUnschedulable
from shared.contracts.messages import LEASES, Lease, encode
from shared.errors import FencedError, MalformedMessage
from shared.kube import translate
from shared.kube.kai_plugins import ExtraPlugin
from shared.kube.keys import NODE_POOL_LABEL
from shared.kubeapi.client import Kube
from shared.kubeapi.informer import Informer

log = logging.getLogger("kairos.state.shard")

GROUP, VERSION, PLURAL = "kai.scheduler", "v1", "schedulingshards"
RETRY_AFTER_FAILURE = 1.0
SURVEY_S = 2.0
"""How often the shards' leases, node pools and the podgroups no shard serves are looked at."""
RELEASE_AFTER_S = 30.0
"""How long a deleted SchedulingShard's durable consumers are kept before they are deleted: every replica
has stopped pulling from them within `shard_consumers.RECONCILE_S` + `STOP_GRACE_S` (5.5 s) of seeing its
record deleted; the rest is room for a replica behind. A shard made again before then keeps them."""
RELEASE_TRIES = 3
"""How often a durable's deletion is tried before it is left to the server's inactivity threshold."""


class ShardWatch:
    def __init__(
        self,
        ctx: ServiceContext,
        kube: Kube,
        replica: StateReplica,
        *,
        component: str,
        resync_period: float = 600.0,
        node_pool_label_key: str = NODE_POOL_LABEL,
        extra_plugins: Mapping[str, ExtraPlugin] | None = None,
        state: KvWrites | None = None,
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.state: KvWrites = ctx.bus.state if state is None else state
        """Where the records are written (the owner's fence, or the bucket itself)."""
        self.component = component
        self.node_pool_label_key = node_pool_label_key
        self.extra_plugins = dict(extra_plugins or {})
        """The installed plugins beyond KAI's a SchedulingShard may enable (`shared.plugin_loader`)."""
        self.raw: dict[str, bytes] = {}
        """Each SchedulingShard's JSON as last seen, by name."""
        self._stored: dict[str, bytes] = {record.shard: encode(record) for record in replica.shards.values()}
        """Each shard's record as this watch last wrote it (or found it in KV at start)."""
        self._shown: dict[str, tuple[str, str]] = {}
        self._noted: dict[str, str] = {}
        """Each shard's not-applied message as last told ("" when none)."""
        self._listed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._informer_task: asyncio.Task[None] | None = None
        self._survey_task: asyncio.Task[None] | None = None
        self.replica = replica
        self._empty: dict[str, str] = {}
        """Each shard's empty-pool message as last told."""
        self._unserved: dict[str, str] = {}
        """Podgroup key -> the no-shard message last published for it."""
        self._releases: dict[tuple[str, str], tuple[float, int]] = {}
        """(stream, durable) of a shard gone -> the loop time it is deleted at, and the tries that failed."""
        self._sweep_at: float | None = 0.0
        """When this owner looks for the durables of shards deleted before it ran (`_sweep`; None: done)."""
        self.memo = shard_survey.SurveyMemo(node_pool_label_key)
        """The survey's findings, worked out again only when the replica changed."""
        self.informer = Informer(
            kube,
            PLURAL,
            kube.custom.list_cluster_custom_object,
            self._on_relist,
            self._on_change,
            args=(GROUP, VERSION, PLURAL),
            resync_period=resync_period,
            missing_ok=True,
        )

    def start(self) -> None:
        self._informer_task = asyncio.create_task(self.informer.run())
        self._task = asyncio.create_task(self._run())
        self._survey_task = asyncio.create_task(self._survey_forever())

    async def stop(self) -> None:
        for task in (self._task, self._informer_task, self._survey_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._informer_task = self._survey_task = None

    async def _on_relist(self, items: list[msgspec.Raw]) -> None:
        raws = {shards.seen(bytes(item)).metadata.name: bytes(item) for item in items}
        self.raw = {name: data for name, data in raws.items() if name}
        self._listed = True
        self._wake.set()

    async def _on_change(self, event: str, obj: msgspec.Raw) -> None:
        name = shards.seen(bytes(obj)).metadata.name
        if not name:
            return
        if event == "DELETED":
            self.raw.pop(name, None)
        else:
            self.raw[name] = bytes(obj)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._next_release())
            if self._wake.is_set():
                self._wake.clear()
                if self._listed:
                    try:
                        await self.apply()
                    except Exception:
                        self.ctx.counters["shard_failures"] += 1
                        log.exception("SchedulingShards: applying them failed; retrying")
                        await asyncio.sleep(RETRY_AFTER_FAILURE)
                        self._wake.set()
            try:
                if self._listed and self._sweep_at is not None and self._sweep_at <= self._now():
                    await self._sweep()
                await self._release_due()
            except Exception:
                # A fault in the clean-up of deleted shards' durables must not end the watch: the shards
                # in force would no longer be applied.
                self.ctx.counters["shard_failures"] += 1
                log.exception("SchedulingShards: releasing deleted shards' durables failed")
                await asyncio.sleep(RETRY_AFTER_FAILURE)

    # --- a deleted shard's durable consumers, deleted once it has stayed gone ---------------------------------
    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _release(self, durables: Iterable[tuple[str, str]]) -> None:
        """Delete these durables (stream, name) `RELEASE_AFTER_S` from now, unless a shard in force has them
        then."""
        due = self._now() + RELEASE_AFTER_S
        for durable in durables:
            self._releases[durable] = (due, 0)

    def _next_release(self) -> float | None:
        """Seconds until the next durables are due for deletion, or the sweep (None: nothing is)."""
        times = [due for due, _ in self._releases.values()]
        if self._listed and self._sweep_at is not None:
            times.append(self._sweep_at)
        return max(0.0, min(times) - self._now()) if times else None

    async def _sweep(self) -> None:
        """Once per owner, after its first apply: the durables of shards without a SchedulingShard (deleted
        while another owner, or none, ran) released as if their shard had just gone. A failure is logged
        and the sweep tried again `RELEASE_AFTER_S` later."""
        try:
            found = await shard_consumers.listed_durables(self.ctx.bus.js)
        except Exception as exc:  # noqa: BLE001 -- NATS away or the grant missing: the inactivity threshold stays
            self.ctx.counters["shard_release_failures"] += 1
            log.warning("the shards' durable consumers not listed: %s; again in %.0f s", exc, RELEASE_AFTER_S)
            self._sweep_at = self._now() + RELEASE_AFTER_S
            return
        kept = self._kept()
        self._release(durable for durable in found if durable not in kept)
        self._sweep_at = None

    def _kept(self) -> set[tuple[str, str]]:
        return _durables_of(self._stored)

    def _held(self) -> set[tuple[str, str]]:
        """The durables of the shards this owner holds in force: a SchedulingShard its informer holds (valid
        or not) or a record it wrote."""
        return _durables_of(set(self.raw) | set(self._stored))

    def _seen(self) -> set[tuple[str, str]]:
        """The durables of every shard this replica sees now: those it holds (`_held`) and those of a shard
        record in its copy of the state bucket (another owner's, made again meanwhile)."""
        return self._held() | _durables_of(record.shard for record in self.replica.shards.values())

    async def _release_due(self) -> None:
        """Delete every durable due (on this task, after the records were written: one whose shard is in
        force again, made again in time, is kept). A deletion that fails is tried again `RELEASE_AFTER_S`
        later, `RELEASE_TRIES` times in all, then left to the server's inactivity threshold.

        Fenced: under the owner's `WriteFence`, its lease key is read once before the due durables are
        deleted and its keeper and clock checked right before each deletion, and a durable is deleted only
        while its shard is still absent from what this replica sees (`_seen`); one whose shard only the
        replica's copy of the state bucket still shows is looked at again `RELEASE_AFTER_S` later, within
        the `RELEASE_TRIES`. A former owner paused past
        its lease deletes nothing (its due durables are dropped: its successor's sweep finds those still
        unused), so none of a shard made again under the same name is deleted by an owner of before."""
        now = self._now()
        due = sorted(durable for durable, (at, _) in self._releases.items() if at <= now)
        if not due:
            return
        fence = self.state if isinstance(self.state, WriteFence) else None
        try:
            if fence is not None:
                await fence.confirm()
        except FencedError as exc:
            self._releases.clear()
            self.ctx.counters["shard_releases_fenced"] += len(due)
            log.warning("the durables of deleted shards not deleted: %s; left to the next owner", exc)
            return
        for stream, name in due:
            _, failed = self._releases.pop((stream, name))
            if (stream, name) in self._seen():
                if (stream, name) not in self._held() and failed + 1 < RELEASE_TRIES:
                    # Only the replica's copy of the state bucket shows the shard: a record made again by
                    # another owner, or the deleted one in a copy that has not caught up. Looked at again
                    # later, so a copy behind does not keep the durables for good.
                    self._releases[stream, name] = (now + RELEASE_AFTER_S, failed + 1)
                continue
            try:
                if fence is not None:
                    fence.check()
            except FencedError as exc:
                self._releases.clear()
                self.ctx.counters["shard_releases_fenced"] += 1
                log.warning("durable consumer %s (stream %s) not deleted: %s", name, stream, exc)
                return
            try:
                there = await shard_consumers.delete_durable(self.ctx.bus.js, stream, name)
            except Exception as exc:  # noqa: BLE001 -- NATS away or the grant missing: tried again later
                self.ctx.counters["shard_release_failures"] += 1
                last = failed + 1 >= RELEASE_TRIES
                log.warning(
                    "durable consumer %s (stream %s) not deleted: %s; %s",
                    name,
                    stream,
                    exc,
                    "left to the server's inactivity threshold"
                    if last
                    else f"again in {RELEASE_AFTER_S:.0f} s",
                )
                if not last:
                    self._releases[stream, name] = (now + RELEASE_AFTER_S, failed + 1)
                continue
            if there:
                self.ctx.counters["shard_durables_deleted"] += 1
                log.info("durable consumer %s (stream %s) deleted: its SchedulingShard is gone", name, stream)

    async def apply(self) -> None:
        """Bring KV and every SchedulingShard's status in line with what was last seen of them."""
        raws = dict(self.raw)
        for shard in sorted(set(self._stored) - set(raws)):
            await self.state.delete(s.shard_key(shard))
            del self._stored[shard]
            self._shown.pop(shard, None)
            self._noted.pop(shard, None)
            self._release(shard_consumers.shard_durables(shard))
            log.info("SchedulingShard %s gone: its shard's record is deleted", shard)
        for shard, verdict in shards.read_shards(raws, self.node_pool_label_key, self.extra_plugins).items():
            seen = shards.seen(raws[shard])
            if isinstance(verdict, Problem):
                await self._show(shard, verdict, seen)
                continue
            data = encode(verdict)
            if data != self._stored.get(shard):
                await self.state.put(s.shard_key(shard), data)
                self._stored[shard] = data
                self.ctx.counters["shard_configs"] += 1
                log.info(
                    "SchedulingShard %s in force (generation %d)%s",
                    shard,
                    verdict.generation,
                    "".join(f"; not applied: {n.field} ({n.reason})" for n in verdict.config.not_applied),
                )
            self._shown.pop(shard, None)
            await self._in_force(shard, seen, shard_notes.notes_problem(shard, verdict.config.not_applied))

    async def _show(self, shard: str, problem: Problem, seen: shards.Seen) -> None:
        shown = (problem.reason, problem.message)
        if self._shown.get(shard) == shown:
            return
        if not problems.shows(seen.status.conditions, problem):
            log.warning("SchedulingShard %s not applied: %s", shard, problem.message)
            await write_event(
                self.kube,
                self.ctx,
                _involved(shard, seen),
                problem,
                f"schedulingshard {shard}",
                self.component,
            )
            self.ctx.counters["problems_reported"] += 1
            await self._condition(shard, seen, problem)
        self._shown[shard] = shown

    async def _in_force(self, shard: str, seen: shards.Seen, notes: Problem | None) -> None:
        """A shard in force: ``Accepted`` back to True, and what it asks that Kairos does not apply told
        once, as a Warning Event and ``FullyApplied=False`` (`services.state.controllers.shard_notes`)."""
        told = notes.message if notes is not None else ""
        if (
            notes is not None
            and self._noted.get(shard) != told
            and not shard_notes.shows(seen.status.conditions, notes)
        ):
            await write_event(
                self.kube, self.ctx, _involved(shard, seen), notes, f"schedulingshard {shard}", self.component
            )
            self.ctx.counters["shard_notes_reported"] += 1
        self._noted[shard] = told
        patch = shard_notes.conditions_patch(seen.status.conditions, notes, event_time())
        if patch is not None:
            await self._patch_status(shard, patch)

    async def _condition(self, shard: str, seen: shards.Seen, problem: Problem | None) -> None:
        patch = problems.accepted_patch(seen.status.conditions, problem, event_time())
        if patch is not None:
            await self._patch_status(shard, patch)

    # --- the survey: served, empty pools, podgroups no shard serves -------------------------------------------
    async def _survey_forever(self) -> None:
        while True:
            await asyncio.sleep(SURVEY_S)
            if not self._listed:
                continue
            try:
                await self.survey()
            except Exception:
                self.ctx.counters["shard_survey_failures"] += 1
                log.exception("SchedulingShards: the survey failed; again in %.0f s", SURVEY_S)

    async def survey(self) -> None:
        """One look at the shards in force: ``Served``, empty node pools, podgroups no shard serves."""
        found = self.memo.look(self.replica)
        for shard in sorted(found.records):
            data = self.raw.get(shard)
            if data is None:
                continue
            seen = shards.seen(data)
            wanted = shard_coverage.served_condition(await self._lease(shard))
            patch = shard_coverage.served_patch(seen.status.conditions, wanted, event_time())
            if patch is not None:
                await self._patch_status(shard, patch)
            await self._tell_empty(shard, seen, found.empty.get(shard))
        for shard in set(self._empty) - set(found.records):
            del self._empty[shard]
        await self._explain_unserved(found.unserved)

    async def _lease(self, shard: str) -> Lease | None:
        entry = await self.ctx.bus.leases.get(s.lease_key(shard))
        if entry is None:
            return None
        try:
            return LEASES.decode(entry.key, entry.value or b"")
        except MalformedMessage:
            return None

    async def _tell_empty(self, shard: str, seen: shards.Seen, message: str | None) -> None:
        if message is None:
            self._empty.pop(shard, None)
            return
        if self._empty.get(shard) == message:
            return
        problem = Problem(
            kind="SchedulingShard",
            namespace="",
            name=shard,
            reason=shard_coverage.EMPTY_NODE_POOL,
            message=message,
        )
        about = translate.InvolvedObject(
            api_version=problems.API_VERSIONS["SchedulingShard"],
            kind="SchedulingShard",
            name=shard,
            uid=seen.metadata.uid,
        )
        log.warning("%s", message)
        await write_event(self.kube, self.ctx, about, problem, f"schedulingshard {shard}", self.component)
        self.ctx.counters["problems_reported"] += 1
        self._empty[shard] = message

    async def _explain_unserved(self, found: Sequence[shard_coverage.Unserved]) -> None:
        current = {u.podgroup for u in found}
        for key in [key for key in self._unserved if key not in current]:
            del self._unserved[key]
        for u in found:
            if self._unserved.get(u.podgroup) == u.message:
                continue
            event = PodUnschedulable(
                time=time.time(),
                namespace=u.namespace,
                podgroup=u.name,
                queue=u.queue,
                message=u.message,
                reasons=[u.reason],
            )
            await self.ctx.bus.js.publish(
                s.event("pod-unschedulable", u.podgroup), EVENT_ENCODER.encode(event)
            )
            self._unserved[u.podgroup] = u.message
            self.ctx.counters["unserved_explained"] += 1
            log.info("%s", u.message)

    async def _patch_status(self, shard: str, patch: dict[str, object]) -> None:
        await self.kube.call(
            f"patch schedulingshard {shard} status",
            self.kube.custom.patch_cluster_custom_object_status,
            GROUP,
            VERSION,
            PLURAL,
            shard,
            patch,
            _content_type="application/merge-patch+json",
        )
        self.ctx.counters["kube_status_patches"] += 1
        self._remember_status(shard, patch)

    def _remember_status(self, shard: str, patch: dict[str, object]) -> None:
        """Keep the conditions just written in the object as last seen: a merge patch replaces the whole
        list, so the next patch (of another condition) must start from this one, not from the informer's
        older copy."""
        data = self.raw.get(shard)
        status = patch.get("status")
        if data is None or not isinstance(status, dict):
            return
        try:
            obj = json.loads(data)
        except ValueError:
            return
        obj.setdefault("status", {}).update(status)
        self.raw[shard] = json.dumps(obj).encode()


def _involved(shard: str, seen: shards.Seen) -> translate.InvolvedObject:
    """The SchedulingShard as an Event names it."""
    return translate.InvolvedObject(
        api_version=problems.API_VERSIONS["SchedulingShard"],
        kind="SchedulingShard",
        name=shard,
        uid=seen.metadata.uid,
    )


def _durables_of(shards: Iterable[str]) -> set[tuple[str, str]]:
    """The durable consumers (stream, name) of these shards."""
    return {durable for shard in shards for durable in shard_consumers.shard_durables(shard)}
