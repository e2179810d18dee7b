"""How the state service answers core NATS messages: decode or count, reply, and drop after SIGTERM.

Used by the shell (`services.state.service`: snapshot requests) and by the sources' owners
(`services.state.sources`: the simulated cluster's requests, the binders' stamps, `kairos explain`'s "why").
Core NATS has nothing to nak: a malformed message is logged with its subject and counted (``malformed``,
and by subject family), and the service keeps answering.
"""

from __future__ import annotations

from typing import TypeVar

from nats.aio.msg import Msg

from shared.bus.middleware import Decoder
from shared.bus.service import ServiceContext
from shared.contracts.messages import encode
from shared.errors import MalformedMessage

T = TypeVar("T")


async def reply(ctx: ServiceContext, msg: Msg, answer: object) -> None:
    """Publish `answer` on the message's reply subject, if it has one (a failure is counted and logged)."""
    if not msg.reply:
        return
    try:
        await ctx.bus.nc.publish(msg.reply, encode(answer))
    except Exception:
        ctx.counters["reply_errors"] += 1
        ctx.log.exception("could not reply on %s", msg.subject)


def stopping(ctx: ServiceContext) -> bool:
    """After SIGTERM, messages still queued on a subscription are dropped unanswered (counted), so that its
    drain ends at once: a busy stack can have hundreds queued, each a write under the lock (a binder asking
    times out and retries, as when the service is gone; stamps are fire-and-forget anyway)."""
    if not ctx.stopping.is_set():
        return False
    ctx.counters["dropped_stopping"] += 1
    return True


def malformed(ctx: ServiceContext, subject: str, problem: str) -> None:
    """Count and log a message dropped as malformed."""
    ctx.counters.message("malformed", subject)
    ctx.log.warning("dropped malformed message on %s: %s", subject, problem)


def decoded(ctx: ServiceContext, codec: Decoder[T], msg: Msg) -> T | None:
    """The message, or None after counting and logging a malformed one."""
    try:
        return codec.decode(msg.subject, msg.data)
    except MalformedMessage as exc:
        malformed(ctx, msg.subject, exc.problem)
        return None
