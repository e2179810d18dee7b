"""List-then-watch of one Kubernetes resource, the way client-go's reflector does it, as raw JSON objects.

Run by the state service's Kubernetes source, one `Informer` per resource (nodes, pods, queues, podgroups,
priority classes, topologies, Jobs, namespaces). It lists (in pages), hands the whole list to `on_relist`, then watches from
the list's resourceVersion and hands every ADDED/MODIFIED/DELETED object to `on_change`. It keeps the
newest resourceVersion it saw (objects and BOOKMARKs), so a watch that ends (server timeout, dropped
connection) resumes where it stopped; a 410 Gone (the server no longer has that history), a server it could
not connect to (`Unreachable`) or the resync period makes it list again, and `on_relist` then replaces
everything the consumer held for this resource, deletions missed while disconnected included.

Objects are passed as `msgspec.Raw` JSON: the consumer decodes them with `shared.kube.wire` into the types
it needs. No decoding problem of one object stops the informer; a callback that raises is logged and
counted, and the informer carries on with the next event.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from shared.backoff import Backoff
from shared.kubeapi.client import NO_ANSWER, ApiError, Kube, api_error

log = logging.getLogger("kairos.kubeapi.informer")

GONE = 410
NOT_FOUND = 404


class _Meta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815 -- the Kubernetes field name
    # The list's continue token; `continue` is a Python keyword.
    continue_: str = msgspec.field(default="", name="continue")


class _List(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    items: list[msgspec.Raw] | None = None


class _ObjectMeta(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


class _ErrorStatus(msgspec.Struct):
    code: int = 0
    reason: str = ""
    message: str = ""


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


_LIST = msgspec.json.Decoder(_List)
_EVENT = msgspec.json.Decoder(_Event)
_META = msgspec.json.Decoder(_ObjectMeta)
_ERROR = msgspec.json.Decoder(_ErrorStatus)


class Expired(Exception):  # noqa: N818 -- the server's word (410 Expired)
    """The server answered 410 Gone: the resourceVersion held is too old; `run` lists again."""


class Unreachable(ApiError):  # noqa: N818 -- says what happened, as Expired does
    """No connection to the server could be made for a watch; `run` lists again once it answers.

    A server that was not there may come back as another incarnation that counts resourceVersions from
    scratch (kubesim restarted, an API server on a wiped or restored etcd). As soon as its counter has passed
    the resourceVersion held it accepts a watch from it, and the objects it made at or below that version
    would never reach the informer. Nothing in the answers tells the two apart, so only a list is safe. A
    watch cut off mid-stream still resumes when the next one connects: proxies and load balancers cut long
    connections of a server that keeps its history."""


@dataclass
class Informer:
    """Lists and watches one resource through a generated list method (`kube.core.list_node`, ...)."""

    kube: Kube
    what: str
    """The resource, for logs and errors ("pods")."""
    method: Callable[..., Awaitable[Any]]
    on_relist: Callable[[list[msgspec.Raw]], Awaitable[None]]
    on_change: Callable[[str, msgspec.Raw], Awaitable[None]]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Fixed arguments of every list and watch call (selectors, CRD group/version/plural)."""
    resync_period: float = 600.0
    """Seconds between full relists (a safety net under missed events)."""
    watch_timeout: int = 300
    """The `timeoutSeconds` each watch asks for; the informer then resumes from its resourceVersion."""
    page_size: int = 5000
    backoff: Backoff = field(default_factory=lambda: Backoff(attempts=1_000_000, base=0.2, cap=5.0))
    rng: random.Random = field(default_factory=random.Random)
    missing_ok: bool = False
    """A 404 on the list (an optional CRD that is not installed) counts as an empty list, asked again
    every `missing_retry` seconds."""
    missing_retry: float = 30.0
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the first list has been handed over."""
    resource_version: str = ""
    relists: int = 0
    errors: int = 0

    async def run(self) -> None:
        """Forever: list, then watch until the resync is due or the server says 410; back off on errors."""
        loop = asyncio.get_running_loop()
        failures = 0
        need_list = True
        resync_due = 0.0
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                    resync_due = loop.time() + self.resync_period
                remaining = resync_due - loop.time()
                if remaining <= 0:
                    need_list = True
                    continue
                await self._watch(min(self.watch_timeout, max(1, int(remaining))))
                failures = 0
            except Expired:
                log.info("%s: resourceVersion %s expired, listing again", self.what, self.resource_version)
                need_list = True
            except ApiError as exc:
                if isinstance(exc, Unreachable) and not need_list:
                    log.info(
                        "%s: the API server could not be reached; listing again once it answers", self.what
                    )
                    need_list = True
                if need_list and exc.status == NOT_FOUND and self.missing_ok:
                    if not self.synced.is_set():
                        log.info("%s: not served by this API server; treating it as empty", self.what)
                        await self._deliver_relist([])
                        self.synced.set()
                    await asyncio.sleep(self.missing_retry)
                    continue
                self.errors += 1
                delay = self.backoff.delay(failures, self.rng)
                failures += 1
                log.warning("%s: %s; retrying in %.1f s", self.what, exc, delay)
                await asyncio.sleep(delay)

    async def _list(self) -> None:
        items: list[msgspec.Raw] = []
        token = ""
        while True:
            extra: dict[str, Any] = {"limit": self.page_size}
            if token:
                extra["_continue"] = token
            body = await self.kube.call(f"list {self.what}", self.method, *self.args, **self.kwargs, **extra)
            try:
                page = _LIST.decode(body)
            except msgspec.DecodeError as exc:
                raise ApiError(f"list {self.what}", NO_ANSWER, "BadList", str(exc)) from exc
            items.extend(page.items or ())
            token = page.metadata.continue_
            if not token:
                break
        self.resource_version = page.metadata.resourceVersion
        self.relists += 1
        await self._deliver_relist(items)
        self.synced.set()

    async def _watch(self, timeout: int) -> None:
        what = f"watch {self.what}"
        try:
            response = await self.method(
                *self.args,
                **self.kwargs,
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=aiohttp.ClientTimeout(total=timeout + 30, sock_read=timeout + 30),
            )
        except aiohttp.ClientConnectorError as exc:
            raise Unreachable(what, NO_ANSWER, type(exc).__name__, str(exc)) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(what, NO_ANSWER, type(exc).__name__, str(exc)) from exc
        async with response:
            if response.status == GONE:
                raise Expired
            if response.status >= 300:
                raise api_error(what, int(response.status), await response.read())
            buffer = b""
            try:
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            await self._event(line)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise ApiError(what, NO_ANSWER, type(exc).__name__, str(exc)) from exc
            if buffer.strip():
                await self._event(buffer)

    async def _event(self, line: bytes) -> None:
        try:
            event = _EVENT.decode(line)
        except msgspec.DecodeError as exc:
            self.errors += 1
            log.warning("%s: undecodable watch event dropped: %s", self.what, exc)
            return
        if event.type == "ERROR":
            try:
                status = _ERROR.decode(event.object)
            except msgspec.DecodeError:
                status = _ErrorStatus()
            if status.code == GONE:
                raise Expired
            raise ApiError(f"watch {self.what}", status.code, status.reason, status.message)
        try:
            version = _META.decode(event.object).metadata.resourceVersion
        except msgspec.DecodeError:
            version = ""
        if event.type != "BOOKMARK":
            await self._deliver_change(event.type, event.object)
        if version:
            self.resource_version = version

    async def _deliver_relist(self, items: list[msgspec.Raw]) -> None:
        try:
            await self.on_relist(items)
        except Exception:
            self.errors += 1
            log.exception("%s: handling a list of %d objects failed", self.what, len(items))

    async def _deliver_change(self, kind: str, obj: msgspec.Raw) -> None:
        try:
            await self.on_change(kind, obj)
        except Exception:
            self.errors += 1
            log.exception("%s: handling a %s event failed", self.what, kind)
