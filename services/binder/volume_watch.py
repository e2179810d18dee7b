"""The binder's watch on PersistentVolumeClaims and PersistentVolumes: what the volume step's wait reads
(`services.binder.volumes.VolumeSteps`), so that waiting for claims to be bound costs no API call per claim
and per second, as kube-scheduler's volume binder reads its informers' caches.

One `VolumeWatch` per binder replica, shared by every volume bind: its two informers
(`shared.kubeapi.informer.Informer`, every namespace) start with the first bind that holds it and stop when
the last one leaves, so a binder that binds no pod with volumes watches nothing. A wait asks for an object
no older than what its own step read or wrote (`floor`, a resourceVersion): the cache that has not caught
up with that answers "not known yet" rather than an older object, and an object absent from it counts as
deleted only once its informer has seen a version at least as new; resourceVersions are compared as
numbers, as kube-scheduler's assume cache compares them (one that is not a number is never "older").
`changed` wakes a wait when one of the objects it names changes (or a relist replaces them all).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import NamedTuple

import msgspec

from shared.kubeapi.client import Kube
from shared.kubeapi.informer import Informer

__all__ = ["Seen", "VolumeWatch", "claim_key", "version", "volume_key"]

log = logging.getLogger("kairos.binder.volume_watch")

_ALL = "*"


class _Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    resourceVersion: str = ""  # noqa: N815 -- the Kubernetes field name


class _Named(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_NAMED = msgspec.json.Decoder(_Named)


class Seen(NamedTuple):
    """An object as the watch holds it: `known` False while the cache has not caught up with the floor
    asked for; then `raw` is its newest JSON, or None when it does not exist."""

    known: bool
    raw: bytes | None = None


UNKNOWN = Seen(known=False)


def version(resource_version: str) -> int | None:
    """A resourceVersion as a number (None when it is not one)."""
    try:
        return int(resource_version)
    except ValueError:
        return None


def claim_key(namespace: str, name: str) -> str:
    return f"pvc:{namespace}/{name}"


def volume_key(name: str) -> str:
    return f"pv:{name}"


class _Cache:
    """One resource's objects by key, fed by its informer."""

    def __init__(self, watch: VolumeWatch, prefix: str) -> None:
        self._watch = watch
        self._prefix = prefix
        self.objects: dict[str, tuple[int | None, bytes]] = {}
        self.informer: Informer | None = None

    def _key(self, raw: msgspec.Raw) -> tuple[str, int | None] | None:
        try:
            meta = _NAMED.decode(raw).metadata
        except msgspec.DecodeError:
            return None
        name = f"{meta.namespace}/{meta.name}" if self._prefix == "pvc" else meta.name
        return f"{self._prefix}:{name}", version(meta.resourceVersion)

    async def relisted(self, items: list[msgspec.Raw]) -> None:
        fresh: dict[str, tuple[int | None, bytes]] = {}
        for raw in items:
            found = self._key(raw)
            if found is not None:
                fresh[found[0]] = (found[1], bytes(raw))
        self.objects = fresh
        self._watch.wake(_ALL)

    async def changed(self, kind: str, raw: msgspec.Raw) -> None:
        found = self._key(raw)
        if found is None:
            return
        key, at = found
        if kind == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = (at, bytes(raw))
        self._watch.wake(key)

    def seen(self, key: str, floor: int | None) -> Seen:
        if self.informer is None or not self.informer.synced.is_set():
            return UNKNOWN
        held = self.objects.get(key)
        if held is not None:
            at, raw = held
            if floor is not None and at is not None and at < floor:
                return UNKNOWN
            return Seen(True, raw)
        newest = version(self.informer.resource_version)
        if floor is not None and (newest is None or newest < floor):
            return UNKNOWN
        return Seen(True, None)


class VolumeWatch:
    """The claims and volumes every volume bind of this binder waits on, watched once."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._claims = _Cache(self, "pvc")
        self._volumes = _Cache(self, "pv")
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._users = 0

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """The watch runs while any bind holds it (started by the first, stopped after the last)."""
        self._users += 1
        if not self._tasks:
            self._claims.informer = Informer(
                self.kube,
                "persistentvolumeclaims (binder)",
                self.kube.core.list_persistent_volume_claim_for_all_namespaces,
                self._claims.relisted,
                self._claims.changed,
            )
            self._volumes.informer = Informer(
                self.kube,
                "persistentvolumes (binder)",
                self.kube.core.list_persistent_volume,
                self._volumes.relisted,
                self._volumes.changed,
            )
            self._tasks = [
                asyncio.create_task(informer.run())
                for informer in (self._claims.informer, self._volumes.informer)
            ]
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0 and self._tasks:
                tasks, self._tasks = self._tasks, []
                self._claims.informer = self._volumes.informer = None
                self._claims.objects, self._volumes.objects = {}, {}
                for task in tasks:
                    task.cancel()
                for task in tasks:
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    @property
    def synced(self) -> bool:
        """Both informers have listed: what they hold can be read instead of the API."""
        return all(
            cache.informer is not None and cache.informer.synced.is_set()
            for cache in (self._claims, self._volumes)
        )

    def claim(self, namespace: str, name: str, floor: int | None = None) -> Seen:
        """The claim, no older than resourceVersion `floor`."""
        return self._claims.seen(claim_key(namespace, name), floor)

    def volume(self, name: str, floor: int | None = None) -> Seen:
        """The volume, no older than resourceVersion `floor`."""
        return self._volumes.seen(volume_key(name), floor)

    async def changed(self, keys: Iterable[str], timeout: float) -> bool:
        """Until one of the objects `keys` names changes, or a relist (True), or `timeout` seconds
        (False)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        watched = {*keys, _ALL}
        for key in watched:
            self._waiters.setdefault(key, set()).add(future)
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                await future
        except TimeoutError:
            return False
        else:
            return True
        finally:
            for key in watched:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiters[key]

    def wake(self, key: str) -> None:
        """Wake the waits on `key` (every wait for `_ALL`)."""
        if key == _ALL:
            futures = {f for waiting in self._waiters.values() for f in waiting}
        else:
            futures = self._waiters.get(key, set())
        for future in futures:
            if not future.done():
                future.set_result(None)
