"""The state service's validating admission endpoint for Queues: KAI's queue webhook (v0.14).

Served on the admission webhook's port (`services.state.webhook.webhook`, which routes `PATH` here) by every state
replica with `webhook_port`; the API server POSTs an AdmissionReview for each Queue created or updated
(deploy/base's ValidatingWebhookConfiguration, or kubesim's in `kairos up`). The decision is pure
(`shared.kube.queue_admission.review`); the other queues it reads are the state replica's (the mirror's
queues as KV holds them, on standbys too): no API read per request. With the state option
``queue_quota_validation`` (KAI's ``enableQuotaValidation``), a child whose parent is not (yet) in the
replica is given up to `PARENT_WAIT` seconds to appear, so a parent and its child applied together
(``kubectl apply -f`` of both) are not refused for the moment the parent takes to reach KV. A queue the
mirror holds back (its own parent unknown) is not in KV and so does not count as existing.

The answer: refused (``allowed: false``, 403 Forbidden as controller-runtime's, the message naming the
queue and the field: kubectl shows "admission webhook ... denied the request: ..."), or admitted with
KAI's warnings (kubectl prints them). A body that is not an AdmissionReview gets 400; an unforeseen
failure on one request admits it with a warning, logged, and the endpoint answers the next as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
from aiohttp import web

from services.state.webhook import admission_review
from shared.bus.service import ServiceContext
from shared.contracts.messages import QueueRecord, StateRecord
from shared.errors import InvalidObject
from shared.kube import queue_admission
from shared.kube.queue_admission import QueueVerdict
from shared.model import Queue

__all__ = ["PARENT_WAIT", "PATH", "QueueValidation", "queues_of", "verdict_response"]

log = logging.getLogger("kairos.state.queue-admission")

PATH = queue_admission.PATH
PARENT_WAIT = 2.0
"""Seconds a child waits for its parent to reach the replica before "parent not found" stands (the API
server's call to us times out at 5 s)."""
POLL = 0.1


def queues_of(records: Iterable[StateRecord]) -> list[Queue]:
    """The queues among a state replica's records."""
    return [record.queue for record in records if isinstance(record, QueueRecord)]


def verdict_response(uid: str, verdict: QueueVerdict) -> dict[str, Any]:
    """The AdmissionReview answering `uid` with `verdict`."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": verdict.message}
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {
        "apiVersion": admission_review.ADMISSION_API_VERSION,
        "kind": "AdmissionReview",
        "response": response,
    }


class QueueValidation:
    """The endpoint; `queues` gives the replica's queues at the moment it is called."""

    def __init__(
        self,
        ctx: ServiceContext,
        queues: Callable[[], Iterable[Queue]],
        *,
        quota_validation: bool = False,
        parent_wait: float = PARENT_WAIT,
    ) -> None:
        self.ctx = ctx
        self.queues = queues
        self.quota_validation = quota_validation
        self.parent_wait = parent_wait

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.ctx.counters["queue_reviews"] += 1
        try:
            review = admission_review.decode_review(body)
        except InvalidObject as exc:
            self.ctx.counters["admission_malformed"] += 1
            log.warning("refused a queue admission call: %s", exc)
            return web.Response(status=400, text=str(exc))
        verdict = await self.decide(review)
        if not verdict.allowed:
            self.ctx.counters["queues_refused"] += 1
            log.info("queue %s refused: %s", review.name, verdict.message)
        elif verdict.warnings:
            self.ctx.counters["queues_warned"] += 1
        return web.Response(
            body=msgspec.json.encode(verdict_response(review.uid, verdict)), content_type="application/json"
        )

    async def decide(self, review: admission_review.AdmissionRequest) -> QueueVerdict:
        """The verdict; a failure nobody foresaw admits the queue with a warning (the mirror still checks
        every Queue it reads) rather than failing the API server's call."""
        try:
            return await self._decide(review)
        except Exception as exc:  # one queue's content must never fail the endpoint for the others
            self.ctx.counters["admission_unforeseen"] += 1
            log.exception("queue admission review %s: examining the queue failed unforeseen", review.uid)
            return QueueVerdict(
                allowed=True,
                warnings=(f"kairos: queue not examined ({type(exc).__name__}); admitted as it is",),
            )

    async def _decide(self, review: admission_review.AdmissionRequest) -> QueueVerdict:
        queue = admission_review.object_of(review)
        verdict = self._review(review, queue)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.parent_wait
        while verdict.parent_missing and loop.time() < deadline:
            await asyncio.sleep(POLL)
            verdict = self._review(review, queue)
        return verdict

    def _review(self, review: admission_review.AdmissionRequest, queue: object) -> QueueVerdict:
        return queue_admission.review(
            review.operation,
            queue,
            queue_admission.quotas_by_name(self.queues()),
            quota_validation=self.quota_validation,
            name=review.name,
        )
