"""The HTTP/1.1 client kubesim POSTs AdmissionReviews with: keep-alive connections per endpoint, nothing more.

`Webhooks` (`tools.kubesim.webhooks`) calls `ReviewClient.post` once per review, one review per pod
created. A general client (aiohttp's `ClientSession`: cookies, redirects, tracing hooks, proxies) cost
about three times the CPU of the request itself, and the simulated API server shares its cores with the
services it serves. This one writes the request line, four headers and the body in one write on an idle
pooled connection (or a new one, TLS verified by the given context), reads the status line, the headers
and a `Content-Length` or chunked body, and keeps the connection for the next review unless the server
said `Connection: close`.

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

__all__ = ["ReviewClient", "UnreachableError"]

_MAX_HEAD = 64 * 1024
"""A reply's status line and headers larger than this are refused (a webhook answers with a few hundred)."""
_MAX_BODY = 16 * 2**20
"""A reply's body larger than this is refused (a review's answer is a patch and some warnings)."""
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
        except asyncio.LimitOverrunError as exc:
            raise ValueError(f"a reply's status line or header is longer than {_MAX_HEAD} bytes") from exc
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


async def _reply(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """(status code, whether the connection stays open, body) of one HTTP/1.1 reply."""
    line = await reader.readuntil(b"\r\n")
    if not line:
        raise asyncio.IncompleteReadError(b"", None)
    version, _, rest = line.decode("latin-1").partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not (code.isascii() and code.isdigit()):
        raise ValueError(f"not an HTTP/1.1 reply: {line[:80]!r}")
    length: int | None = None
    chunked = False
    keep_alive = version == "HTTP/1.1"
    while True:
        header = await reader.readuntil(b"\r\n")
        if header == b"\r\n":
            break
        name, _, value = header.decode("latin-1").partition(":")
        name = name.strip().lower()
        value = value.strip()
        if name == "content-length":
            if not (value.isascii() and value.isdigit()) or int(value) > _MAX_BODY:
                raise ValueError(f"a reply's Content-Length is not a size up to {_MAX_BODY}: {value[:40]!r}")
            length = int(value)
        elif name == "transfer-encoding":
            chunked = value.lower() == "chunked"
        elif name == "connection":
            keep_alive = value.lower() == "keep-alive" or (keep_alive and value.lower() != "close")
    if chunked:
        return int(code), keep_alive, await _chunked(reader)
    if length is None:
        # Delimited by the end of the connection: read it all, and the connection is done.
        return int(code), False, await reader.read(_MAX_BODY)
    return int(code), keep_alive, await reader.readexactly(length)


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = (await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError as exc:
            raise ValueError(f"a reply's chunk size is not hexadecimal: {size_line[:40]!r}") from exc
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return bytes(body)
        if len(body) + size > _MAX_BODY:
            raise ValueError(f"a reply's body is larger than {_MAX_BODY} bytes")
        body += await reader.readexactly(size)
        await reader.readexactly(2)
