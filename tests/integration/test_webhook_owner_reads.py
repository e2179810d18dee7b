"""The admission webhook's owner reads: one per owner while it is remembered, a bounded memory.

A real HTTP server (aiohttp) stands in for the API server and counts the reads; the webhook decides on
admission requests as the API server sends them (`AdmissionServer.decide`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from services.state.webhook import webhook
from services.state.webhook.admission_review import AdmissionRequest, request_of
from services.state.webhook.webhook import AdmissionServer, WebhookOptions
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext
from shared.kube import keys
from shared.kube.scheduling_gates import GATE
from shared.kubeapi.client import Kube, connect
from tests.integration.test_kube_request import kubeconfig

pytestmark = pytest.mark.integration

JOB = "/apis/batch/v1/namespaces/default/jobs/train"


class Api:
    """Answers owner reads: the Job `train` declares `kairos.io/after`; every PodGroup is absent."""

    def __init__(self) -> None:
        self.reads: Counter[str] = Counter()

    async def handle(self, request: web.Request) -> web.Response:
        self.reads[request.path] += 1
        if request.path == JOB:
            meta = {"name": "train", "uid": "u-train", "annotations": {"kairos.io/after": "prep"}}
            return web.json_response({"kind": "Job", "metadata": meta})
        return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound"}, status=404)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[Api, Kube]]:
    answers = Api()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answers.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    kube = await connect(str(kubeconfig(tmp_path, f"http://127.0.0.1:{runner.addresses[0][1]}")))
    try:
        yield answers, kube
    finally:
        await kube.close()
        await runner.cleanup()


def creation(
    name: str, *, job: bool = False, podgroup: str = "", annotations: dict[str, str] | None = None
) -> AdmissionRequest:
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "uid": f"u-{name}"}
    if job:
        metadata["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-train", "controller": True}
        ]
    metadata["annotations"] = dict(annotations or {})
    if podgroup:
        metadata["annotations"][keys.PODGROUP_ANNOTATION] = podgroup
    pod = {
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"schedulerName": keys.SCHEDULER_NAME, "containers": [{"name": "main", "image": "x"}]},
    }
    return request_of(f"r-{name}", "CREATE", "default", obj=pod)


async def test_the_pods_of_one_job_cost_one_read_of_it_and_are_all_gated(
    api: tuple[Api, Kube], bus: Bus
) -> None:
    answers, kube = api
    server = AdmissionServer(ServiceContext("state", ServiceConfig(), bus), kube, WebhookOptions(port=0))
    try:
        for i in range(5):
            patch, warning = await server.decide(creation(f"train-{i}", job=True))
            assert warning == ""
            assert patch is not None
            assert any(GATE in str(op.get("value")) for op in patch)
    finally:
        await server.stop()
    assert answers.reads[JOB] == 1


async def test_the_webhook_remembers_a_bounded_number_of_owners_least_recently_used_out_first(
    api: tuple[Api, Kube], bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers, kube = api
    monkeypatch.setattr(webhook, "OWNER_CACHE_SIZE", 2)
    server = AdmissionServer(ServiceContext("state", ServiceConfig(), bus), kube, WebhookOptions(port=0))
    try:
        for name in ("a", "b", "b", "c", "a"):
            patch, warning = await server.decide(creation(f"pod-{name}", podgroup=f"pg-{name}"))
            assert (patch, warning) == (None, "")
            assert len(server._owners) <= 2
    finally:
        await server.stop()
    path = "/apis/scheduling.run.ai/v2alpha2/namespaces/default/podgroups/pg-{}"
    # b was remembered for its second pod; a had been pushed out by c by the time its second pod came.
    assert (answers.reads[path.format("a")], answers.reads[path.format("b")]) == (2, 1)
    assert answers.reads[path.format("c")] == 1
