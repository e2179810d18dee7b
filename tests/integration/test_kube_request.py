"""`Kube.request`, the per-pod call path: what reaches the API server and how its answers come back.

A real HTTP server (aiohttp) stands in for the API server, so the test sees the exact request: the
kubeconfig's bearer token, the content type asked for, the body as JSON. Errors come back as the same
`ApiError`s `Kube.call` raises.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from shared.kubeapi.client import MERGE_PATCH, NO_ANSWER, ApiError, Kube, connect

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"


def kubeconfig(path: Path, server: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": TOKEN}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    file = path / "kubeconfig"
    file.write_text(json.dumps(config))
    return file


class Recorder:
    """An API server that answers from `answers` by path and records every request."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.answers: dict[str, tuple[int, dict[str, Any]]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "authorization": request.headers.get("Authorization"),
                "content_type": request.headers.get("Content-Type"),
                "body": json.loads(body) if body else None,
            }
        )
        status, answer = self.answers.get(request.path, (200, {"kind": "Status", "status": "Success"}))
        return web.json_response(answer, status=status)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[Recorder, Kube]]:
    recorder = Recorder()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    kube = await connect(str(kubeconfig(tmp_path, f"http://127.0.0.1:{port}")))
    try:
        yield recorder, kube
    finally:
        await kube.close()
        await runner.cleanup()


async def test_a_request_carries_the_token_the_content_type_and_the_body_as_json(
    api: tuple[Recorder, Kube],
) -> None:
    recorder, kube = api
    patch = {"status": {"phase": "Running", "running": 2}}
    path = "/apis/scheduling.run.ai/v2alpha2/namespaces/team/podgroups/train/status"
    answer = await kube.request(
        "patch podgroup team/train status", "PATCH", path, patch, content_type=MERGE_PATCH
    )
    assert json.loads(answer) == {"kind": "Status", "status": "Success"}
    assert recorder.seen == [
        {
            "method": "PATCH",
            "path": path,
            "authorization": f"Bearer {TOKEN}",
            "content_type": MERGE_PATCH,
            "body": patch,
        }
    ]


async def test_a_refusal_is_an_api_error_naming_the_object_with_the_status_reason(
    api: tuple[Recorder, Kube],
) -> None:
    recorder, kube = api
    path = "/api/v1/namespaces/team/pods/gone"
    recorder.answers[path] = (
        404,
        {"kind": "Status", "status": "Failure", "reason": "NotFound", "message": 'pods "gone" not found'},
    )
    with pytest.raises(ApiError) as raised:
        await kube.request("get pod team/gone", "GET", path)
    error = raised.value
    assert (error.status, error.reason, error.temporary) == (404, "NotFound", False)
    assert str(error) == 'get pod team/gone: 404 NotFound: pods "gone" not found'
    assert recorder.seen[0]["body"] is None


async def test_too_many_requests_is_temporary(api: tuple[Recorder, Kube]) -> None:
    recorder, kube = api
    path = "/api/v1/namespaces/team/events"
    recorder.answers[path] = (429, {"kind": "Status", "reason": "TooManyRequests", "message": "slow down"})
    with pytest.raises(ApiError) as raised:
        await kube.request("create event on train-0", "POST", path, {"reason": "Scheduled"})
    assert raised.value.temporary


async def test_no_server_is_no_answer_and_temporary(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kube = await connect(str(kubeconfig(tmp_path, f"http://127.0.0.1:{port}")))
    try:
        with pytest.raises(ApiError) as raised:
            await kube.request(
                "create event on train-0", "POST", "/api/v1/namespaces/team/events", {}, timeout=5
            )
    finally:
        await kube.close()
    assert raised.value.status == NO_ANSWER
    assert raised.value.temporary
