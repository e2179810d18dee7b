"""One bus middleware: decode with the subject's codec, run the handler, map the result to a message fate.

`fate_of(exc)` is the single place where an exception becomes ack, nak (with a delay) or term. Malformed
payloads are logged with their subject, counted and terminated (never redelivered), and the service keeps
running. Used by every service for JetStream messages and core subscriptions alike. A message's W3C trace
context (`shared.bus.trace_context`: NATS headers) is current while its handler runs.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from shared.bus.trace_context import receiving
from shared.errors import ConflictError, FencedError, InvalidObject, MalformedMessage, TemporaryError
from shared.telemetry.metrics import subject_family

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
log = logging.getLogger("kairos.bus")


class Decoder(Protocol[T_co]):
    """A subject family's decoder (`shared.contracts.messages.Codec`, `shared.contracts.events.EVENTS`):
    raises `MalformedMessage` naming the subject for a payload it cannot read."""

    def decode(self, subject: str, data: bytes) -> T_co: ...


class Fate(enum.Enum):
    ACK = "ack"
    NAK = "nak"
    TERM = "term"


def fate_of(exc: BaseException | None) -> tuple[Fate, float]:
    """What to do with a message whose handler ended with `exc` (None: success)."""
    match exc:
        case None | ConflictError() | FencedError():
            # A conflict or a fenced proposal is a decision the handler already reported.
            return Fate.ACK, 0.0
        case MalformedMessage() | InvalidObject():
            return Fate.TERM, 0.0
        case TemporaryError(delay=delay):
            return Fate.NAK, delay
        case _:
            return Fate.NAK, 2.0


class Counters(Counter[str]):
    """Per-service counters (messages handled, malformed dropped, conflicts...), shown in heartbeats.
    `by_subject` splits the middleware's outcomes by subject family, for `/metrics`."""

    def __init__(self, *args: Any, **kwargs: int) -> None:
        super().__init__(*args, **kwargs)
        self.by_subject: Counter[tuple[str, str]] = Counter()
        self._delivered: dict[int, tuple[Msg, float]] = {}
        """Per subscription: the last JetStream message it was delivered, and when."""

    def message(self, outcome: str, subject: str) -> None:
        """One message of `subject` ended as `outcome` (handled, malformed, errors)."""
        self[outcome] += 1
        self.by_subject[(outcome, subject_family(subject))] += 1

    def consumed(self, msg: Msg) -> None:
        """A JetStream message arrived: kept as its subscription's last, for `consumer_lag`. Its reply
        subject is read only when the lag is asked for (a scrape), not for every message: parsed for each,
        it was 2 % of the state service's CPU."""
        self._delivered[getattr(msg, "sid", 0)] = (msg, time.time())

    @property
    def consumer_lag(self) -> dict[tuple[str, str], tuple[int, float]]:
        """(stream, consumer) -> (messages pending behind the last one delivered, how long it had waited in
        its stream, in seconds), as the last message each subscription was delivered tells it (read from
        its reply subject, with no call to NATS)."""
        lags: dict[tuple[str, str], tuple[int, float]] = {}
        latest: dict[tuple[str, str], int] = {}
        for sid, (msg, arrived) in list(self._delivered.items()):
            try:
                meta = msg.metadata
            except (NotJSMessageError, AttributeError):  # not a JetStream delivery (a test's stand-in)
                continue
            key = (meta.stream, meta.consumer)
            if key in latest:
                # A subscription made again for the same consumer (a partition gained anew): the newer one
                # tells (subscriptions are numbered in order), and the older is forgotten.
                del self._delivered[min(sid, latest[key])]
                if sid < latest[key]:
                    continue
            latest[key] = sid
            lags[key] = (meta.num_pending or 0, max(0.0, arrived - meta.timestamp.timestamp()))
        return lags


async def handle(
    msg: Msg,
    codec: Decoder[T],
    handler: Callable[[T, Msg], Awaitable[Any]],
    counters: Counters,
    *,
    jetstream: bool,
) -> None:
    """Decode `msg`, run `handler`, then ack/nak/term it (JetStream) according to `fate_of`."""
    error: BaseException | None = None
    if jetstream:
        counters.consumed(msg)
    try:
        message = codec.decode(msg.subject, msg.data)
    except MalformedMessage as exc:
        counters.message("malformed", msg.subject)
        log.warning("dropped malformed message on %s: %s", msg.subject, exc.problem)
        error = exc
    else:
        try:
            # The message's trace context is current while its handler runs (spans it starts continue it).
            with receiving(msg.headers):
                await handler(message, msg)
            counters.message("handled", msg.subject)
        except (ConflictError, FencedError) as exc:
            error = exc
        except Exception as exc:
            counters.message("errors", msg.subject)
            log.exception("handler failed for message on %s", msg.subject)
            error = exc
    if not jetstream:
        return
    fate, delay = fate_of(error)
    if fate is Fate.ACK:
        await msg.ack()
    elif fate is Fate.TERM:
        await msg.term()
    else:
        await msg.nak(delay=delay)
