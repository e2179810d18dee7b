"""A lease holder's writes to KV, fenced by its lease term: what a holder that lost its lease can still write.

Used by the state service's Kubernetes source: `services.state.sources.kube_source.KubeOwner` makes a `WriteFence`
from the `state.kube-source` lease (`shared.bus.lease.LeaseKeeper`) it was elected under, raises it before
its first write, and every KV write of the source goes through it: the `StateWriter`'s state puts and
deletes and its ledger compare-and-sets, and the shard watch's shard records. A refused write raises
`LeaseLost`, a `FencedError`, and the owner stands down.

The queue's shard leases keep their terms by the fence key's rule (`LeaseTerms`, `reserving_terms`, made by
`services.queue.service.shard_lease`), in a record of their own in the queue's usage bucket (the queue may
not write the state bucket): the keeper reserves each term there before it writes the lease key under
it, and leads only if the record still names it under that term once the key is written. The binder
fences proposals by the lease key's term, so that term must never be handed out twice; the record, unlike
the lease key, does not expire.

NATS KV has no transaction across keys, let alone across buckets, and the lease is in another bucket than
the writes it fences. What holds, and what does not:

- **Nothing is sent after the deadline.** `check()`, run right before each request, refuses it when this
  replica's keeper no longer leads under the fence's term, or when its monotonic clock is past the lease's
  deadline (`LeaseKeeper.deadline`: the start of the last successful renewal + TTL - `SAFETY_MARGIN_S`).
  That clock runs on while the process is stopped, so a process resumed after a pause past its lease has
  its first write refused unsent. A request that passed the check is sent. A successor can lead no sooner
  than `SAFETY_MARGIN_S` (2 s) after the deadline, so such a request lands while no one else leads unless
  it takes longer than that to reach the server (a process stopped between the check and the socket
  write counts as such a delay): that is the window the rest of this list closes where NATS allows.
- **State bucket: refused by the server once a successor has raised its fence.** `raise_fence()` (at
  takeover, before the first write) compare-and-sets the key `fence.<lease key>` in `STATE_BUCKET` to this
  holder and term and keeps the revision it got. Every put and delete made through the fence carries
  `Nats-Expected-Last-Subject-Sequence: <that revision>` with `Nats-Expected-Last-Subject-Sequence-Subject:
  <the fence key's subject>`: the server stores the write only if the fence key has not moved since, in
  the same step as the write (nats-server 2.11 and later; `raise_fence` refuses an older server, which
  would refuse nearly every write). Once a successor's fence is up, no write of a predecessor lands in the
  state bucket, however late it arrives. Between the successor's lease and its fence, a predecessor's
  request already on its way can still land; the successor reads the bucket through a replica caught up
  to its own fence, so it starts from whatever such a request wrote.
- **State bucket on a JetStream cluster: refused within `REASSERT_S`.** A replicated stream's leader
  refuses every conditioned write but one while others are in flight (error 10164, "wrong last sequence",
  measured on nats-server 2.15.1 with three servers: 1 of 50 concurrent writes stored), so conditioned
  writes there would go one at a time (about 1,500/s against 22,000/s side by side, measured the same
  way). On a state bucket of more than one replica (`raise_fence` reads it) the writes go unconditioned,
  and before any write the holder compare-and-sets the fence key to itself again once `REASSERT_S` (0.1 s)
  has passed since it last did (one such write for every write made meanwhile): a successor's raise moves
  the key, so a predecessor's next re-assertion is refused. What a predecessor can still land after a
  successor's fence is what it sent within `REASSERT_S` of its last re-assertion. A 10164 on a single
  server (a stream raised to more replicas since) switches the fence to this mode and the write is made
  again.
- **Terms only grow.** The fence key does not expire: it keeps the highest term raised, and a raise under
  a term not above it (a contender that never saw the expired lease key starts again from term 1) is
  refused, the keeper learning the term to go above (`LeaseKeeper.learn_term`); `prime` teaches it before
  a first acquisition. `LeaseTerms.reserve` goes above by itself, before the lease key is written: each
  term is one compare-and-set on the record, so no term is reserved twice. Nothing else keeps them: once
  the record is deleted (or unreadable), they start again above the highest one a contender saw in the
  lease key.
- **Ledger: checked, not enforced.** The ledger's writes are compare-and-sets on their own keys (binders
  write the same keys) and a message carries one such condition, so the fence cannot ride along: the
  server cannot refuse a predecessor's ledger write. `confirm()` reads the lease key before each batch
  (this holder, this term) and `check()` runs before each compare-and-set, so a ledger write lands after
  the lease was lost only as a request already on its way (the first point's window). Such a write can
  release a reservation or delete a claim a successor's binder relies on; the successor's start-up
  reconcile puts back the reservation of every pod holding a node, not the claim of a pod still binding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Protocol

import msgspec
from nats.aio.msg import Msg
from nats.js.errors import APIError, BadRequestError

from shared.bus.connection import Bus
from shared.bus.kv import KvStore
from shared.bus.lease import LeaseKeeper
from shared.contracts import subjects as s
from shared.contracts.messages import LEASES, Lease, encode
from shared.errors import ConfigError, ConflictError, FencedError, MalformedMessage, TemporaryError

log = logging.getLogger("kairos.fence")

EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
"""With it, the server compares `EXPECTED_LAST_SUBJECT_SEQUENCE` with the last sequence of this subject
instead of the message's own (nats-server 2.11)."""
KV_OPERATION, KV_DELETE = "KV-Operation", "DEL"
"""How a KV delete is written: an empty message with this header (as nats-py's `KeyValue.delete`)."""
WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a failed expected-sequence check."""
IN_FLIGHT_WRONG_LAST_SEQUENCE = 10164
"""A replicated stream's leader refusing a conditioned write while other writes are in flight."""
REASSERT_S = 0.1
"""On a replicated state bucket: how long a re-assertion of the fence covers the writes after it."""
FENCING_SERVER = (2, 11)
"""The first nats-server that reads `EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT`. An older one would compare the
fence's revision with each written key's own last sequence and refuse nearly every write, for ever."""
PUT_MANY_TIMEOUT_S = 5.0
"""Seconds a batch of `put_many` waits for its acknowledgements, all together (nats-py's own default for one
JetStream publish)."""
RAISE_ATTEMPTS = 8
"""Lost compare-and-sets on the fence key before raising it gives up (only contenders move it)."""


class _ApiError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    """JetStream's answer to a publish: the stored message's sequence, or why it was not stored."""

    seq: int = 0
    error: _ApiError | None = None


_PUB_ACK = msgspec.json.Decoder(_PubAck)


class KvWrites(Protocol):
    """The writes a fenced writer makes to a bucket: `shared.bus.kv.KvStore` (unfenced) or a `WriteFence`."""

    async def put(self, key: str, value: bytes) -> int: ...

    async def delete(self, key: str) -> None: ...


class LeaseLost(FencedError):  # noqa: N818 -- a FencedError, named for why the write was refused
    """A write refused because its lease is not held under the fence's term any more: by this replica's
    keeper, by its clock, by the lease key, or by the server's check of the fence key."""

    def __init__(self, key: str, term: int, current: int, why: str) -> None:
        super().__init__(key, term, current)
        self.why = why

    def __str__(self) -> str:
        return f"lease {self.shard}: term {self.term}: {self.why}; not written"


class WriteFence:
    """The right of one lease holder, under one term, to write; `put` and `delete` write the state bucket."""

    def __init__(self, bus: Bus, keeper: LeaseKeeper) -> None:
        self.bus = bus
        self.keeper = keeper
        self.key = s.fence_key(keeper.key)
        """The fence's key in `STATE_BUCKET`."""
        self.subject = f"$KV.{s.STATE_BUCKET}.{self.key}"
        self.term = 0
        """The term the fence was raised under (0: not raised, every write refused)."""
        self.revision = 0
        """The fence key's revision after this holder raised (or re-asserted) it: every state write is
        conditional on it."""
        self.per_write = True
        """Each write carries the fence's condition (a single server); False on a replicated state bucket,
        where the fence is re-asserted every `REASSERT_S` instead."""
        self._asserted = -float("inf")
        """The keeper's clock when this holder last wrote the fence key."""
        self._asserting = asyncio.Lock()

    # --- taking over -------------------------------------------------------------------------------------
    async def prime(self) -> None:
        """Teach the keeper the fence's term before it competes for the lease (a replica that starts after
        the lease key expired would otherwise acquire under a term already raised)."""
        entry = await self.bus.state.get(self.key)
        held = _decode(self.key, entry.value if entry is not None else None)
        if held is not None:
            self.keeper.learn_term(held.term)

    async def raise_fence(self) -> int:
        """Write this holder's term into the fence key (compare-and-set), before any other write; returns
        the key's revision. `LeaseLost` when the keeper does not lead, or the fence holds this term or a
        later one raised by another holder (the keeper learns it: its next term is above)."""
        self._require_fencing_server()
        keeper = self.keeper
        term = keeper.term
        for _ in range(RAISE_ATTEMPTS):
            self._check(term)
            entry = await self.bus.state.get(self.key)
            held = _decode(self.key, entry.value if entry is not None else None)
            ours = held is not None and held.holder == keeper.holder and held.term == term
            if held is not None and held.term >= term and not ours:
                keeper.learn_term(held.term)
                raise LeaseLost(
                    keeper.key, term, held.term, f"{held.holder} raised the fence under term {held.term}"
                )
            value = encode(Lease(shard=keeper.shard, holder=keeper.holder, term=term))
            self._check(term)
            try:
                revision = await self.bus.state.update(
                    self.key, value, last=entry.revision if entry is not None else 0
                )
            except ConflictError:
                continue  # another holder's fence moved meanwhile: look again
            self.term, self.revision = term, revision
            self._asserted = keeper.clock()
            self.per_write = await self._replicas() <= 1
            log.info(
                "fence %s raised under term %d (revision %d)%s",
                self.key,
                term,
                revision,
                "" if self.per_write else f"; re-asserted every {REASSERT_S} s (a replicated state bucket)",
            )
            return revision
        raise TemporaryError(f"fence {self.key}: still moving after {RAISE_ATTEMPTS} attempts")

    async def _replicas(self) -> int:
        """The state bucket's replicas (1 when they cannot be read: the conditioned writes then tell)."""
        with contextlib.suppress(Exception):
            info = await self.bus.js.stream_info(f"KV_{s.STATE_BUCKET}")
            return int(info.config.num_replicas or 1)
        return 1

    def _require_fencing_server(self) -> None:
        version = self.bus.nc.connected_server_version
        try:
            found = (version.major, version.minor)
        except ValueError:  # not a semantic version: an unknown server
            found = (0, 0)
        if found < FENCING_SERVER:
            need = ".".join(map(str, FENCING_SERVER))
            raise ConfigError(
                f"nats-server {found[0]}.{found[1]} cannot check a write against a lease's fence "
                f"(Nats-Expected-Last-Subject-Sequence-Subject): {need} or later is needed"
            )

    # --- before each write -------------------------------------------------------------------------------
    def check(self) -> None:
        """Refuse (`LeaseLost`) unless the fence is raised, the keeper leads under its term and the lease's
        deadline has not passed by this replica's clock. Synchronous: run it right before the request."""
        if self.revision == 0:
            raise LeaseLost(self.keeper.key, self.term, -1, "the fence was never raised")
        self._check(self.term)

    async def confirm(self) -> None:
        """`check()`, then read the lease key: it must name this holder under this term. The server's word
        before a batch of ledger writes, which the server cannot fence."""
        self.check()
        keeper = self.keeper
        entry = await keeper.store.get(keeper.key)
        lease = _decode(keeper.key, entry.value if entry is not None else None)
        if lease is None or lease.holder != keeper.holder or lease.term != self.term:
            current = lease.term if lease is not None else 0
            who = f"{lease.holder} under term {lease.term}" if lease is not None else "no one"
            raise LeaseLost(keeper.key, self.term, current, f"the lease key names {who}")
        self.check()  # the read may have taken long

    def _check(self, term: int) -> None:
        keeper = self.keeper
        if not keeper.leading or keeper.term != term:
            current = keeper.term if keeper.leading else -1
            raise LeaseLost(keeper.key, term, current, "this replica no longer leads under it")
        late = keeper.clock() - keeper.deadline()
        if late >= 0:
            raise LeaseLost(
                keeper.key,
                term,
                -1,
                f"its deadline passed {late:.1f} s ago by this replica's clock (no renewal since: renewals "
                "stopped, or the process was paused)",
            )

    # --- the state bucket's writes -----------------------------------------------------------------------
    async def put(self, key: str, value: bytes) -> int:
        """Put `key` in `STATE_BUCKET` if the fence has not moved; returns its revision."""
        return await self._publish(key, value, {})

    async def delete(self, key: str) -> None:
        """Delete `key` from `STATE_BUCKET` if the fence has not moved."""
        await self._publish(key, b"", {KV_OPERATION: KV_DELETE})

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[int]:
        """`put` of every (key, value) at once: each, checked as `put` is, goes out as a plain publish whose
        reply comes to one inbox of the batch (`_acknowledged`: no task, no timer, no waiting per write),
        and the acknowledgements are awaited together, within `PUT_MANY_TIMEOUT_S` for the batch. Returns
        their revisions in order. Refused as `put` is: `LeaseLost` when the server refused any of them for
        the fence (the others may have landed, as with puts side by side); a write not acknowledged in time
        raises `TimeoutError`."""
        if not items:
            return []
        self.check()
        headers: dict[str, str] | None = None
        if self.per_write:
            headers = {
                EXPECTED_LAST_SUBJECT_SEQUENCE: str(self.revision),
                EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: self.subject,
            }
        else:
            await self._reassert()
            self.check()
        acks = await self._acknowledged(
            [(f"$KV.{s.STATE_BUCKET}.{key}", value) for key, value in items], headers
        )
        revisions: list[int] = []
        again: list[int] = []
        for index, ack in enumerate(acks):
            refused = ack.error
            if refused is None:
                revisions.append(ack.seq)
                continue
            if refused.err_code == IN_FLIGHT_WRONG_LAST_SEQUENCE:
                again.append(index)
                revisions.append(0)
                continue
            error = APIError(code=refused.code, err_code=refused.err_code, description=refused.description)
            if refused.err_code != WRONG_LAST_SEQUENCE:
                raise error
            current = await self._fence_term()
            raise LeaseLost(
                self.keeper.key,
                self.term,
                current,
                f"the server refused it: the fence moved (term {current})",
            ) from error
        if again:
            log.warning("fence %s: the state bucket is replicated: re-asserting it instead", self.key)
            self.per_write = False
            for index, revision in zip(again, await self.put_many([items[i] for i in again]), strict=True):
                revisions[index] = revision
        return revisions

    async def _acknowledged(
        self, messages: Sequence[tuple[str, bytes]], headers: dict[str, str] | None
    ) -> list[_PubAck]:
        """Publish every (subject, payload) to JetStream, `check()` right before each, with replies to an
        inbox of this batch (one subscription, message i answered on `<inbox>.i`), and wait for every
        acknowledgement. nats-py's own `publish_async` is not used: its handler raises a refusal instead of
        handing it to the waiting future (nats-py 2.16), so a refused batch would only ever time out."""
        nc = self.bus.nc
        inbox = nc.new_inbox()
        acks: list[_PubAck | None] = [None] * len(messages)
        all_in: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        left = len(messages)

        async def on_ack(msg: Msg) -> None:
            nonlocal left
            index = int(msg.subject.rpartition(".")[2])
            if acks[index] is not None:
                return
            try:
                acks[index] = _PUB_ACK.decode(msg.data)
            except msgspec.DecodeError:
                status = msg.headers.get("Status", "") if msg.headers else ""
                acks[index] = _PubAck(
                    error=_ApiError(
                        code=int(status) if status.isdigit() else 0, description="no JetStream answer"
                    )
                )
            left -= 1
            if left == 0 and not all_in.done():
                all_in.set_result(None)

        subscription = await nc.subscribe(f"{inbox}.*", cb=on_ack)
        try:
            async with asyncio.timeout(PUT_MANY_TIMEOUT_S):
                for index, (subject, payload) in enumerate(messages):
                    self.check()
                    await nc.publish(subject, payload, reply=f"{inbox}.{index}", headers=headers)
                await all_in
        except TimeoutError:
            raise TimeoutError(
                f"state bucket: {sum(ack is None for ack in acks)} of {len(messages)} writes not acknowledged "
                f"within {PUT_MANY_TIMEOUT_S:g} s"
            ) from None
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
        return [ack for ack in acks if ack is not None]

    async def _publish(self, key: str, payload: bytes, headers: dict[str, str]) -> int:
        self.check()
        subject = f"$KV.{s.STATE_BUCKET}.{key}"
        if not self.per_write:
            await self._reassert()
            self.check()
            ack = await self.bus.js.publish(subject, payload, headers=headers or None)
            return int(ack.seq)
        fenced = {
            **headers,
            EXPECTED_LAST_SUBJECT_SEQUENCE: str(self.revision),
            EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: self.subject,
        }
        try:
            ack = await self.bus.js.publish(subject, payload, headers=fenced)
        except BadRequestError as exc:
            if exc.err_code == IN_FLIGHT_WRONG_LAST_SEQUENCE:
                log.warning("fence %s: the state bucket is replicated: re-asserting it instead", self.key)
                self.per_write = False
                return await self._publish(key, payload, headers)
            if exc.err_code != WRONG_LAST_SEQUENCE:
                raise
            current = await self._fence_term()
            raise LeaseLost(
                self.keeper.key,
                self.term,
                current,
                f"the server refused it: the fence moved (term {current})",
            ) from exc
        return int(ack.seq)

    async def _reassert(self) -> None:
        """Compare-and-set the fence key to this holder again, unless that was done within `REASSERT_S`;
        `LeaseLost` when it moved (a successor raised it)."""
        async with self._asserting:
            if self.keeper.clock() - self._asserted < REASSERT_S:
                return
            self.check()
            value = encode(Lease(shard=self.keeper.shard, holder=self.keeper.holder, term=self.term))
            try:
                self.revision = await self.bus.state.update(self.key, value, last=self.revision)
            except ConflictError as exc:
                current = await self._fence_term()
                raise LeaseLost(
                    self.keeper.key, self.term, current, f"the fence moved (term {current}); not re-asserted"
                ) from exc
            self._asserted = self.keeper.clock()

    async def _fence_term(self) -> int:
        """The term the fence key holds now (-1: unreadable), to name in a refusal."""
        with contextlib.suppress(Exception):
            entry = await self.bus.state.get(self.key)
            held = _decode(self.key, entry.value if entry is not None else None)
            return held.term if held is not None else 0
        return -1


class LeaseTerms:
    """A lease's terms recorded where they do not expire, by the fence key's rule without the writes it
    fences: a `Lease` record (holder, term) moved only by compare-and-set, never to a term not above the one
    it holds. A `LeaseKeeper` given one (`terms`) reserves each term here before it writes the lease key
    under it, and leads only if the record still names it under that term once the key is written."""

    def __init__(self, store: KvStore, keeper: LeaseKeeper, key: str) -> None:
        self.store = store
        self.keeper = keeper
        self.key = key
        self._unseen_at = 0
        """The record's revision when it last named a contender's term the keeper had not seen in the lease
        key (`reserve` gives way to it once)."""

    async def reserve(self, term: int) -> int | None:
        """Record this holder under `term`, or under the next term above the one recorded; returns that
        term. Each term is one compare-and-set, so no two holders ever reserve the same term.

        None, to give way for this step: the compare-and-set was lost (another contender reserved at the
        same moment), or the record names another holder under a term the keeper never saw in the lease
        key, not seen here the step before either (a contender between its reservation and its lease
        write: reserving above would overtake it, and neither would lead). At the next step the same record
        is stale (that contender died, or was slow) and is gone above."""
        keeper = self.keeper
        entry = await self.store.get(self.key)
        held = _decode(self.key, entry.value if entry is not None else None)
        revision = entry.revision if entry is not None else 0
        if held is not None:
            if held.holder != keeper.holder and held.term > keeper.last_term and revision != self._unseen_at:
                self._unseen_at = revision
                log.info("terms %s: %s reserved term %d: giving way", self.key, held.holder, held.term)
                return None
            keeper.learn_term(held.term)
            term = max(term, held.term + 1)
        value = encode(Lease(shard=keeper.shard, holder=keeper.holder, term=term))
        try:
            await self.store.update(self.key, value, last=revision)
        except ConflictError:
            return None
        log.info("terms %s: term %d reserved", self.key, term)
        return term

    async def holds(self, term: int) -> bool:
        """Whether the record still names this holder under `term`; the keeper learns the term it holds."""
        entry = await self.store.get(self.key)
        held = _decode(self.key, entry.value if entry is not None else None)
        if held is None:
            return False
        self.keeper.learn_term(held.term)
        return held.holder == self.keeper.holder and held.term == term


def reserving_terms(bus: Bus, keeper: LeaseKeeper) -> LeaseKeeper:
    """`keeper`, a queue shard's lease, reserving each term in `USAGE_BUCKET` (`lease_terms_key`) before it
    writes the lease key under it: the binder fences proposals by the lease key's term, which must never be
    handed out twice. The usage bucket does not expire, and the queue alone writes it."""
    keeper.terms = LeaseTerms(bus.usage, keeper, s.lease_terms_key(keeper.key))
    return keeper


def _decode(key: str, value: bytes | None) -> Lease | None:
    """The lease (or fence) under `key`; None when absent or unreadable (which proves no one's right)."""
    if not value:
        return None
    try:
        return LEASES.decode(key, value)
    except MalformedMessage as exc:
        log.warning("unreadable %s: %s", key, exc.problem)
        return None
