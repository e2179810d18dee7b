"""A proposal's public events sent all at once, their acknowledgements awaited together.

Called by `services.binder.report.Reporter` (step 4: the events of a proposal, and those of a recovery
scan's binds) before it publishes the outcome: whoever acts on the outcome must find its events already in
the `KAIROS_EVENTS` stream, so `publish_stored` returns only once every event is stored or given up.

Each event goes out with nats-py's `publish_async` (a publish with an inbox reply, no waiting), then all the
acknowledgement futures are awaited at once: one round trip to JetStream for the whole proposal instead of
one per event, and no task or semaphore per event. nats-py's futures never time out on their own (a stream
that never answers, a connection lost meanwhile), so the whole batch has a deadline: what is not
acknowledged by then is cancelled (which also frees nats-py's pending slot) and counted as a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.js import JetStreamContext
from nats.js.api import PubAck

__all__ = ["ACK_TIMEOUT_S", "Message", "publish_stored"]

ACK_TIMEOUT_S = 5.0
"""Seconds a batch of events waits for its acknowledgements, all together (nats-py's own default for one
JetStream publish)."""

Message = tuple[str, bytes, dict[str, str] | None]
"""(subject, payload, headers) of one event."""


async def publish_stored(
    js: JetStreamContext, messages: Sequence[Message], *, stream: str, timeout: float = ACK_TIMEOUT_S
) -> list[BaseException]:
    """Publish every message on `stream` at once and wait until each is acknowledged, refused or past
    `timeout`; return the failures (empty: every message was stored), one per message not stored."""
    failures: list[BaseException] = []
    pending: list[asyncio.Future[PubAck]] = []
    try:
        async with asyncio.timeout(timeout):
            for subject, payload, headers in messages:
                try:
                    pending.append(await js.publish_async(subject, payload, stream=stream, headers=headers))
                except Exception as exc:  # noqa: BLE001 -- not sent (closed, too many pending): this one failed
                    failures.append(exc)
            if pending:
                await asyncio.wait(pending)
    except TimeoutError:
        pass  # judged below, future by future
    finally:
        for future in pending:
            if not future.done():
                future.cancel()
    unsent = len(messages) - len(pending) - len(failures)  # the deadline passed while sending
    failures.extend(TimeoutError(f"not sent to stream {stream} within {timeout:g} s") for _ in range(unsent))
    for future in pending:
        if future.cancelled():
            failures.append(TimeoutError(f"no acknowledgement from stream {stream} within {timeout:g} s"))
        elif (refused := future.exception()) is not None:
            failures.append(refused)
    return failures
