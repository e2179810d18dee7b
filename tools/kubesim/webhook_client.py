"""The HTTP/1.1 client kubesim POSTs AdmissionReviews with: keep-alive connections per endpoint, nothing more.

`Webhooks` (`tools.kubesim.webhooks`) calls `ReviewClient.post` once per review, one review per pod
created. A general client (aiohttp's `ClientSession`: cookies, redirects, tracing hooks, proxies) cost
about three times the CPU of the request itself, and the simulated API server shares its cores with the
services it serves. This one writes the request line, four headers and the body in one write on an idle
pooled connection (or a new one, TLS verified by the given context), feeds what the socket gives to
`httptools.HttpResponseParser` (llhttp, the parser uvicorn and Node.js use: status line, headers, and a
`Content-Length`, chunked or ended-by-the-connection body), and keeps the connection for the next review
when the parser says the reply allows it (`Connection: close` and HTTP/1.0 do not). `_Reply` gathers what
the parser reads and holds the limits (head 64 KiB, body 16 MiB); `_reply` is the loop that feeds it.

Failures are told apart as the caller needs them: `UnreachableError` when the endpoint refused the connection
or closed it without answering (another endpoint may take the review; a pooled connection the server
closed while idle is first replaced by a new one, once), `TimeoutError` from the caller's deadline, and
`OSError`, `ssl.SSLError` or `ValueError` (a reply that is not HTTP) otherwise. The connection of a failed
or interrupted call is closed, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from urllib.parse import urlsplit

import httptools

__all__ = ["ReviewClient", "UnreachableError"]

_MAX_HEAD = 64 * 1024
"""A reply's status line and headers larger than this are refused (a webhook answers with a few hundred)."""
_MAX_BODY = 16 * 2**20
"""A reply's body larger than this is refused (a review's answer is a patch and some warnings)."""
_READ = 64 * 1024
"""The most read from the socket at once once the head is in (a review's answer is a few hundred bytes)."""
_IDLE_KEPT = 100
"""Idle connections kept per endpoint: as many as reviews may run at once (one per pod being created, and
clients create dozens at once), or each busy moment would open and close connections (aiohttp's pool
keeps 100 too)."""

_Key = tuple[str, str, int, str | None, int]
"""(scheme, host, port, TLS server name, id of the TLS context): one pool of connections."""


class UnreachableError(ConnectionError):
    """The endpoint refused the connection or closed it without an answer: the review was not handled."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class ReviewClient:
    """POSTs JSON bodies over kept-alive HTTP/1.1 connections, pooled per endpoint."""

    def __init__(self) -> None:
        self._idle: dict[_Key, list[_Connection]] = {}

    async def post(
        self,
        url: str,
        body: bytes,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> tuple[bytes, int]:
        """(the reply's body, its status code) of a POST of the JSON `body` to `url` (http or https; for
        https, `ssl_context` verifies the server as `server_hostname` or the URL's host)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        secure = parts.scheme == "https"
        host = parts.hostname
        port = parts.port or (443 if secure else 80)
        context = (ssl_context or ssl.create_default_context()) if secure else None
        key: _Key = (parts.scheme, host, port, server_hostname, id(context))
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        shown_host = f"[{host}]" if ":" in host else host
        request = (
            f"POST {target} HTTP/1.1\r\nHost: {shown_host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        pooled = self._idle.get(key)
        while pooled:
            connection = pooled.pop()
            if not connection.usable():
                connection.close()
                continue
            try:
                return await self._exchange(key, connection, request)
            except UnreachableError:
                break  # closed by the server while idle: once more on a new connection
        connection = await self._connect(host, port, context, server_hostname)
        return await self._exchange(key, connection, request)

    async def close(self) -> None:
        """Close every idle connection."""
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()
        for connections in idle.values():
            for connection in connections:
                with contextlib.suppress(OSError, ssl.SSLError):
                    await connection.writer.wait_closed()

    @staticmethod
    async def _connect(
        host: str, port: int, context: ssl.SSLContext | None, server_hostname: str | None
    ) -> _Connection:
        try:
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=context,
                server_hostname=(server_hostname or host) if context is not None else None,
                limit=_MAX_HEAD,
            )
        except ssl.SSLError:
            raise
        except OSError as exc:  # refused, unreachable, no such host
            raise UnreachableError(f"dial tcp {host}:{port}: {exc.strerror or exc}") from exc
        return _Connection(reader, writer)

    async def _exchange(self, key: _Key, connection: _Connection, request: bytes) -> tuple[bytes, int]:
        """Send `request` on `connection` and read the reply; the connection goes back to the pool after a
        complete reply that leaves it open, and is closed otherwise."""
        kept = False
        try:
            connection.writer.write(request)
            status, kept, content = await _reply(connection.reader)
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as exc:
            raise UnreachableError("the server closed the connection without an answer") from exc
        finally:
            if kept:
                pool = self._idle.setdefault(key, [])
                if len(pool) < _IDLE_KEPT:
                    pool.append(connection)
                else:
                    connection.close()
            else:
                connection.close()
        return content, status


class _Reply:
    """One reply as `httptools.HttpResponseParser` reads it (sans I/O): `feed` it what the socket gives
    until it says the reply is complete, or until the connection ends (`ended`); then `result`.

    The parser calls back the `on_*` methods. A problem llhttp does not see (a `Content-Length` above
    `_MAX_BODY`, a body past it) is kept in `refusal` and raised by `feed`: an exception raised inside a
    callback would reach the caller only as httptools' "User callback error"."""

    __slots__ = (
        "body",
        "complete",
        "fed",
        "framed",
        "head_done",
        "keep_alive",
        "messages",
        "parser",
        "refusal",
        "size",
        "status",
    )

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        """Dropped by `result` (the parser holds this reply for its callbacks)."""
        self.body: list[bytes] = []
        self.size = 0
        self.fed = 0
        self.status = 0
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.framed = False
        """The reply said where its body ends (`Content-Length` or chunked): an end of the connection
        before that is a cut reply, not the end of the body."""
        self.messages = 0
        self.refusal: str | None = None

    def read_size(self) -> int:
        """How much to read next: while the head is coming, never past `_MAX_HEAD` (a head not done by
        then is refused)."""
        return _READ if self.head_done else _MAX_HEAD - self.fed

    def feed(self, data: bytes) -> bool:
        """Parse `data`, the next bytes of the reply; whether the reply is now complete. ValueError naming
        the problem for bytes that are not an HTTP/1.x reply or pass a limit."""
        assert self.parser is not None
        if self.fed == 0 and not b"HTTP/".startswith(data[:5]):  # llhttp also takes RTSP/ and ICE/
            raise ValueError(f"not an HTTP/1.1 reply: it starts {data[:40]!r}")
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self.complete:
                raise ValueError(f"not an HTTP/1.1 reply: {exc} (after {self.fed} bytes)") from exc
            self.messages += 1  # bytes after the reply: it is read whole, but the connection is not kept
        except httptools.HttpParserUpgrade as exc:
            raise ValueError("not an HTTP/1.1 reply: the server switched protocols") from exc
        if self.refusal is not None:
            raise ValueError(self.refusal)
        self.fed += len(data)
        if not self.head_done and self.fed >= _MAX_HEAD:
            raise ValueError(f"a reply's status line and headers are longer than {_MAX_HEAD} bytes")
        return self.complete

    def ended(self) -> bool:
        """The connection ended: whether that completes the reply (a body without a length or chunks)."""
        self.complete = self.head_done and not self.framed
        return self.complete

    def result(self) -> tuple[int, bool, bytes]:
        """(status code, whether the connection may carry the next request, body) of a complete reply."""
        self.parser = None
        return self.status, self.keep_alive and self.messages == 1, b"".join(self.body)

    def on_message_begin(self) -> None:
        self.messages += 1

    # The parser goes on past the end of the reply into whatever follows it (the connection is then not
    # kept); the callbacks below leave a complete reply as it is.

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            return
        name = name.lower()
        if name == b"content-length":
            self.framed = True
            # llhttp has checked the digits; the size is ours to bound (it takes up to 2**64 - 1).
            if not value.isdigit() or int(value) > _MAX_BODY:
                self.refusal = f"a reply's Content-Length is not a size up to {_MAX_BODY}: {value[:40]!r}"
        elif name == b"transfer-encoding":
            self.framed = value.lower().rstrip().endswith(b"chunked")

    def on_headers_complete(self) -> None:
        if not self.complete and self.parser is not None:
            self.head_done = True
            self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self.body.append(body)
        self.size += len(body)
        if self.size > _MAX_BODY:
            self.refusal = f"a reply's body is larger than {_MAX_BODY} bytes"

    def on_message_complete(self) -> None:
        if self.complete:
            return
        self.complete = True
        # Read now: llhttp forgets the reply's keep-alive once the message is done.
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()


async def _reply(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """(status code, whether the connection stays open, body) of one HTTP/1.x reply; ValueError naming the
    problem for one that is not, asyncio.IncompleteReadError for a connection that ends before it does."""
    reply = _Reply()
    while True:
        data = await reader.read(reply.read_size())
        if data:
            if reply.feed(data):
                return reply.result()
        elif reply.ended():
            return reply.result()
        else:
            raise asyncio.IncompleteReadError(b"", None)
