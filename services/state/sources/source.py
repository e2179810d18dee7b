"""What the owner of a source answers on the bus, whatever the source: the binders' podgroup stamps and
`kairos explain`'s "why is this object not in KV".

Both owners are a `Source`: the simulated cluster's (`services.state.sources.sim_owner.SimOwner`) and the
Kubernetes one's (`services.state.sources.kube_source.KubeOwner`). `SourceAnswers` subscribes one of them to
`kairos.stamps.*` and `kairos.state.why`, decodes each message (a malformed one is counted and logged,
`services.state.replies`) and hands it over, so the two sources differ only in where a stamp is kept and
what they hold back:

- `stamp`: the simulated cluster stores the stamps on its podgroups and writes them to KV; the Kubernetes
  owner patches them onto the PodGroups as annotations (where KAI keeps them) and the next watch event
  carries them into KV. Stamps expect no reply.
- `why`: the reason the source holds an object back from KV, "" when it does not. The simulated cluster
  refuses what it cannot take instead of holding it, so its answer is always "" (the same answer a client
  got when nobody answered); the Kubernetes owner answers from its mirror's problems and hold-back.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from services.state.replies import decoded
from shared.bus.service import ServiceContext
from shared.contracts import subjects as s
from shared.contracts.messages import STAMPS, WHY_REQUESTS, PodGroupStamps, WhyReply, encode


class Source(Protocol):
    """The owner of a source, as the stamps and "why" subscriptions see it."""

    async def stamp(self, stamps: PodGroupStamps) -> None:
        """Keep a binder's podgroup stamps where this source keeps them."""
        ...

    def why(self, what: str, name: str) -> str:
        """Why the source holds the object `what name` (``pod ns/name``...) back from KV; "" when it does
        not."""
        ...


class SourceAnswers:
    """A source owner's subscriptions to the binders' stamps and to "why", started and stopped together.

    `stamps` and `why` say which to take: with state partitions each partition's owner takes the stamps of
    its own podgroups, and only the cluster partition's owner answers "why"."""

    def __init__(self, ctx: ServiceContext, source: Source) -> None:
        self.ctx = ctx
        self.source = source
        self._subs: list[Subscription] = []

    async def start(self, *, stamps: bool = True, why: bool = True) -> None:
        if stamps:
            self._subs.append(await self.ctx.bus.nc.subscribe(s.STAMPS_WILDCARD, cb=self._on_stamps))
        if why:
            self._subs.append(await self.ctx.bus.nc.subscribe(s.STATE_WHY, cb=self._on_why))

    async def stop(self, *, drain: bool = False) -> None:
        """Unsubscribe; with `drain`, let the callback finish the message it holds (the simulated cluster's
        write under its lock) and drop the queued ones (`services.state.replies.stopping`)."""
        subs, self._subs = self._subs, []
        for sub in subs:
            with contextlib.suppress(Exception):
                if drain:
                    await sub.drain()  # type: ignore[no-untyped-call]
                else:
                    await sub.unsubscribe()

    async def _on_stamps(self, msg: Msg) -> None:
        stamps = decoded(self.ctx, STAMPS, msg)
        if stamps is not None:
            await self.source.stamp(stamps)

    async def _on_why(self, msg: Msg) -> None:
        request = decoded(self.ctx, WHY_REQUESTS, msg)
        if request is None:
            return
        reason = self.source.why(request.what, request.name)
        if msg.reply:
            with contextlib.suppress(Exception):
                await self.ctx.bus.nc.publish(msg.reply, encode(WhyReply(reason=reason)))
