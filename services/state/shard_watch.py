"""The shard watch: the SchedulingShard this Kairos shard serves, kept in KV as its `ShardRecord`.

Run by the state service's Kubernetes owner (`services.state.kube_source.KubeOwner`). One informer lists and
watches SchedulingShards (kai.scheduler/v1, cluster-scoped; a cluster without the CRD has none) and keeps the
one named after the services' ``--shard``. After each change (`services.state.shards.read_shard`):

- valid: its `ShardRecord` is put under `subjects.shard_key(shard)` in `STATE_BUCKET` (the queue leader's
  replica reads it at its next cycle) and an ``Accepted=False`` condition left by an earlier problem is set
  back to True;
- invalid: the record is left as it is (the last valid configuration stays in force); the SchedulingShard
  gets a Warning Event ``InvalidSchedulingShard`` and ``Accepted=False`` naming the field, once per distinct
  problem (a condition that already shows it, from an earlier owner, gets no second Event);
- gone: the record is deleted (the services run KAI's defaults).

The API calls and KV writes run on the watch's own task; a failure is logged, counted and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec

from services.state import problems, shards
from services.state.problem_report import write_event
from services.state.problems import Problem
from services.state.writeback import event_time
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceContext
from shared.contracts import subjects as s
from shared.contracts.messages import encode
from shared.kube import translate
from shared.kubeapi.client import Kube
from shared.kubeapi.informer import Informer

log = logging.getLogger("kairos.state.shard")

GROUP, VERSION, PLURAL = "kai.scheduler", "v1", "schedulingshards"
RETRY_AFTER_FAILURE = 1.0


class ShardWatch:
    def __init__(
        self,
        ctx: ServiceContext,
        kube: Kube,
        replica: StateReplica,
        *,
        component: str,
        resync_period: float = 600.0,
    ) -> None:
        self.ctx = ctx
        self.kube = kube
        self.shard = ctx.config.shard
        self.key = s.shard_key(self.shard)
        self.component = component
        self.raw: bytes | None = None
        """The SchedulingShard's JSON as last seen; None while there is none."""
        record = replica.shard(self.shard)
        self._stored: bytes | None = encode(record) if record is not None else None
        self._shown: tuple[str, str] | None = None
        self._listed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._informer_task: asyncio.Task[None] | None = None
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

    async def stop(self) -> None:
        for task in (self._task, self._informer_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._informer_task = None

    def _ours(self, obj: msgspec.Raw) -> bool:
        return shards.seen(bytes(obj)).metadata.name == self.shard

    async def _on_relist(self, items: list[msgspec.Raw]) -> None:
        self.raw = next((bytes(item) for item in items if self._ours(item)), None)
        self._listed = True
        self._wake.set()

    async def _on_change(self, event: str, obj: msgspec.Raw) -> None:
        if not self._ours(obj):
            return
        self.raw = None if event == "DELETED" else bytes(obj)
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._listed:
                continue
            try:
                await self.apply()
            except Exception:
                self.ctx.counters["shard_failures"] += 1
                log.exception("SchedulingShard %s: applying it failed; retrying", self.shard)
                await asyncio.sleep(RETRY_AFTER_FAILURE)
                self._wake.set()

    async def apply(self) -> None:
        """Bring KV and the SchedulingShard's status in line with what was last seen of it."""
        raw = self.raw
        if raw is None:
            self._shown = None
            if self._stored is not None:
                await self.ctx.bus.state.delete(self.key)
                self._stored = None
                log.info("SchedulingShard %s gone: KAI's defaults apply", self.shard)
            return
        verdict = shards.read_shard(self.shard, raw)
        seen = shards.seen(raw)
        if isinstance(verdict, Problem):
            await self._show(verdict, seen)
            return
        data = encode(verdict)
        if data != self._stored:
            await self.ctx.bus.state.put(self.key, data)
            self._stored = data
            self.ctx.counters["shard_configs"] += 1
            log.info(
                "SchedulingShard %s in force (generation %d)%s",
                self.shard,
                verdict.generation,
                "".join(f"; not applied: {n.field} ({n.reason})" for n in verdict.config.not_applied),
            )
        self._shown = None
        await self._condition(seen, None)

    async def _show(self, problem: Problem, seen: shards.Seen) -> None:
        shown = (problem.reason, problem.message)
        if self._shown == shown:
            return
        if not problems.shows(seen.status.conditions, problem):
            log.warning("SchedulingShard %s not applied: %s", self.shard, problem.message)
            about = translate.InvolvedObject(
                api_version=problems.API_VERSIONS["SchedulingShard"],
                kind="SchedulingShard",
                name=self.shard,
                uid=seen.metadata.uid,
            )
            await write_event(
                self.kube, self.ctx, about, problem, f"schedulingshard {self.shard}", self.component
            )
            self.ctx.counters["problems_reported"] += 1
            await self._condition(seen, problem)
        self._shown = shown

    async def _condition(self, seen: shards.Seen, problem: Problem | None) -> None:
        patch = problems.accepted_patch(seen.status.conditions, problem, event_time())
        if patch is None:
            return
        await self.kube.call(
            f"patch schedulingshard {self.shard} status",
            self.kube.custom.patch_cluster_custom_object_status,
            GROUP,
            VERSION,
            PLURAL,
            self.shard,
            patch,
            _content_type="application/merge-patch+json",
        )
        self.ctx.counters["kube_status_patches"] += 1
