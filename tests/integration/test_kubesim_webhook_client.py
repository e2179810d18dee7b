"""The HTTP/1.1 client kubesim sends AdmissionReviews with (tools.kubesim.webhook_client), against raw asyncio
servers on free loopback ports: replies with a length, chunked or ended by the connection, connections kept
for the next review, a kept connection the server closed replaced once, and bad replies refused by name."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tools.kubesim.webhook_client import ReviewClient, UnreachableError

pytestmark = pytest.mark.integration

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b'{"response":{"allowed":true}}'


async def _request(reader: asyncio.StreamReader) -> bytes:
    """One request's body (the client always sends a Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


class Server:
    """A raw HTTP server: `reply(body)` gives the bytes answered to each request; connections are counted."""

    def __init__(self, reply: Callable[[bytes], bytes], *, close_after: bool = False) -> None:
        self.reply = reply
        self.close_after = close_after
        self.connections = 0
        self.requests = 0
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                body = await _request(reader)
                self.requests += 1
                writer.write(self.reply(body))
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def client() -> AsyncIterator[ReviewClient]:
    out = ReviewClient()
    try:
        yield out
    finally:
        await out.close()


async def _serve(server: Server) -> asyncio.Server:
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/mutate?timeout=5s"
    return listening


def _with_length(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(extra)
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def _chunked(body: bytes) -> bytes:
    half = len(body) // 2
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (body[:half], body[half:]))
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


@pytest.mark.parametrize(
    ("reply", "close_after", "connections"),
    [
        pytest.param(lambda _: _with_length(OK), False, 1, id="Content-Length, kept alive"),
        pytest.param(lambda _: _chunked(OK), False, 1, id="chunked, kept alive"),
        pytest.param(lambda _: _with_length(OK, b"Connection: close\r\n"), True, 3, id="Connection: close"),
        pytest.param(lambda _: b"HTTP/1.0 200 OK\r\n\r\n" + OK, True, 3, id="ended by the connection"),
        pytest.param(lambda _: _with_length(OK) + b"HTTP/1.1 200", False, 3, id="bytes after the reply"),
    ],
)
async def test_replies_are_read_whole_and_connections_kept_unless_the_server_ends_them(
    client: ReviewClient, reply: Callable[[bytes], bytes], close_after: bool, connections: int
) -> None:
    server = Server(reply, close_after=close_after)
    async with await _serve(server):
        for _ in range(3):
            assert await client.post(server.url, b"{}") == (OK, 200)
    assert server.requests == 3
    assert server.connections == connections


async def test_the_status_code_and_body_of_a_refusal_are_returned_as_sent(client: ReviewClient) -> None:
    server = Server(lambda _: b"HTTP/1.1 503 Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
    async with await _serve(server):
        assert await client.post(server.url, b"{}") == (b"busy", 503)


async def test_a_kept_connection_the_server_closed_while_idle_is_replaced_once(client: ReviewClient) -> None:
    # The server answers with keep-alive, then closes every connection after its first answer.
    server = Server(_with_length, close_after=True)
    async with await _serve(server):
        assert await client.post(server.url, b'{"n":1}') == (b'{"n":1}', 200)
        await asyncio.sleep(0.05)  # the close reaches the client's idle connection
        assert await client.post(server.url, b'{"n":2}') == (b'{"n":2}', 200)
    assert server.connections == 2


async def test_a_refused_connection_is_unreachable(client: ReviewClient) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UnreachableError, match=f"127.0.0.1:{port}"):
        await client.post(f"http://127.0.0.1:{port}/mutate", b"{}")


async def test_a_server_that_closes_without_answering_is_unreachable(client: ReviewClient) -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.close()

    listening = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    async with listening:
        with pytest.raises(UnreachableError, match="without an answer"):
            await client.post(f"http://127.0.0.1:{port}/mutate", b"{}")


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        pytest.param(b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.1 reply", id="not HTTP"),
        pytest.param(b"HTTP/1.1 2x0 OK\r\n\r\n", "not an HTTP/1.1 reply", id="status not a number"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n", "Content-Length", id="huge length"
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length", id="negative"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: \xd9\xa3\r\n\r\n", "Content-Length", id="unicode digit"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size", id="bad chunk"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", "longer than", id="huge header"
        ),
    ],
)
async def test_a_reply_that_is_not_http_is_refused_naming_what_is_wrong(
    client: ReviewClient, reply: bytes, why: str
) -> None:
    server = Server(lambda _: reply)
    async with await _serve(server):
        with pytest.raises(ValueError, match=why):
            await client.post(server.url, b"{}")
        # The connection of a failed call is never reused.
        server.reply = lambda _: _with_length(OK)
        assert await client.post(server.url, b"{}") == (OK, 200)
    assert server.connections == 2


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/x", "http:///x", "not a url"])
async def test_a_url_that_is_not_http_is_refused(client: ReviewClient, url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        await client.post(url, b"{}")


async def test_reviews_sent_at_once_keep_their_connections_for_the_next_ones(client: ReviewClient) -> None:
    server = Server(lambda _: _with_length(OK))
    async with await _serve(server):
        for _ in range(3):
            replies = await asyncio.gather(*(client.post(server.url, b"{}") for _ in range(40)))
            assert replies == [(OK, 200)] * 40
    assert server.requests == 120
    assert server.connections == 40
