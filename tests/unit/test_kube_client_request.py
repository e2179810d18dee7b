"""`Kube.request` sends each path as the API server must read it: the plain paths of the calls made for every
pod as they are (not parsed, quoted and normalised again on every call), any other path quoted by aiohttp as
before, the bearer token on every call, and a timeout, a refusal or no answer translated as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from shared.kubeapi.client import ApiError, Kube, connect

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: secret-token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""


@pytest.fixture
async def seen(tmp_path: Path) -> AsyncIterator[tuple[Kube, list[tuple[str, str, str, bytes]]]]:
    """A client of a server that records each request (method, raw path, authorization, body)."""
    log: list[tuple[str, str, str, bytes]] = []

    async def record(request: web.Request) -> web.Response:
        log.append(
            (request.method, request.raw_path, request.headers.get("Authorization", ""), await request.read())
        )
        if request.raw_path.endswith("/missing"):
            return web.json_response(
                {"kind": "Status", "reason": "NotFound", "message": 'pods "missing" not found'}, status=404
            )
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG.format(port=port))
    kube = await connect(str(config))
    try:
        yield kube, log
    finally:
        await kube.close()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        (
            "/apis/scheduling.run.ai/v2alpha2/namespaces/default/podgroups/pg-0/status",
            "/apis/scheduling.run.ai/v2alpha2/namespaces/default/podgroups/pg-0/status",
        ),
        ("/api/v1/namespaces/default/events", "/api/v1/namespaces/default/events"),
        (
            "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb,tier=db",
            "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb,tier=db",
        ),
        ("/api/v1/namespaces/a b/pods", "/api/v1/namespaces/a%20b/pods"),
        ("/api/v1/namespaces/x/../y/pods", "/api/v1/namespaces/y/pods"),
    ],
)
async def test_a_request_reaches_the_server_at_the_path_it_names(
    seen: tuple[Kube, list[tuple[str, str, str, bytes]]], path: str, sent: str
) -> None:
    kube, log = seen
    assert await kube.request("x", "PATCH", path, {"status": {"phase": "Running"}}) == b'{"ok": true}'
    assert log == [("PATCH", sent, "Bearer secret-token", b'{"status":{"phase":"Running"}}')]


async def test_every_request_carries_the_token_and_a_refusal_names_the_object(
    seen: tuple[Kube, list[tuple[str, str, str, bytes]]],
) -> None:
    kube, log = seen
    for _ in range(3):
        await kube.request("get pod default/p", "GET", "/api/v1/namespaces/default/pods/p")
    with pytest.raises(ApiError) as refused:
        await kube.request("get pod default/missing", "GET", "/api/v1/namespaces/default/pods/missing")
    assert [entry[2] for entry in log] == ["Bearer secret-token"] * 4
    assert refused.value.status == 404
    assert str(refused.value) == 'get pod default/missing: 404 NotFound: pods "missing" not found'


async def test_a_server_that_does_not_answer_in_time_is_no_answer(
    seen: tuple[Kube, list[tuple[str, str, str, bytes]]],
) -> None:
    kube, _ = seen
    with pytest.raises(ApiError) as late:
        await kube.request("get pod default/p", "GET", "/api/v1/namespaces/default/pods/p", timeout=1e-9)
    assert late.value.status == 0
    assert late.value.temporary
