"""The GPU-sharing step's waiting room: one watch on the reservation pods for every bind that waits for a
device (`DeviceWatch`), and one lock per (node, GPU group), KAI's group mutex (`GroupLocks`).

Called by `services.binder.gpu_sharing_step.GpuSharing`: a fractional pod's bind waits here for its
reservation pod's ``run.ai/reserve_for_gpu_index``, and the sync loop holds the watch for the binder's
lifetime.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import msgspec

from shared.kube import gpu_sharing as gs
from shared.kube import keys, wire
from shared.kubeapi.client import Kube
from shared.kubeapi.informer import Informer

__all__ = ["DeviceWatch", "GroupLocks"]


class GroupLocks:
    """One asyncio lock per key, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def __call__(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


class _Named(msgspec.Struct):
    metadata: wire.ObjectMeta = msgspec.field(default_factory=wire.ObjectMeta)


_NAMED = msgspec.json.Decoder(_Named)


class DeviceWatch:
    """One watch on the reservation pods for every bind of this binder waiting for a device.

    A watch per waiting bind (a field selector on its reservation's name) made the API server match every
    pod change in the namespace against every waiting bind: a third of the simulated API server's CPU in
    the FractionalGPU benchmark. This one runs while the binder's sync loop runs, or, without it, from the
    first waiter until the last leaves."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._seen: dict[str, tuple[str, msgspec.Raw | None]] = {}
        """Reservation pod name -> (uid, its newest object or None once deleted), while the watch runs; the
        uid of a pod missing from a relist is unknown ("")."""
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._listed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._users = 0

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """The watch runs while anyone holds it: each waiting bind, and the binder's sync loop for the
        binder's lifetime (so a busy binder does not list the namespace again for every burst of binds)."""
        self._users += 1
        if self._task is None:
            self._seen.clear()
            self._listed.clear()
            self._task = asyncio.create_task(self._informer().run())
        try:
            yield
        finally:
            self._users -= 1
            if self._users == 0 and self._task is not None:
                task, self._task = self._task, None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def until(
        self, name: str, uid: str, look: Callable[[msgspec.Raw | None], str | None], timeout: float
    ) -> str:
        """`look` at reservation pod `name` (None once this incarnation, `uid`, is deleted) each time it
        changes, until it returns a device; what `look` raises propagates; `TimeoutError` after `timeout`
        seconds. The deletion of an older incarnation is not this one's."""
        async with self.held(), asyncio.timeout(timeout):
            await self._listed.wait()
            while True:
                if name in self._seen:
                    seen_uid, raw = self._seen[name]
                    if raw is not None:
                        device = look(raw)
                        if device is not None:
                            return device
                    elif not seen_uid or not uid or seen_uid == uid:
                        look(None)
                changed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._waiters.setdefault(name, set()).add(changed)
                try:
                    await changed
                finally:
                    waiting = self._waiters.get(name)
                    if waiting is not None:
                        waiting.discard(changed)
                        if not waiting:
                            del self._waiters[name]

    def _informer(self) -> Informer:
        return Informer(
            self.kube,
            f"pods {gs.RESERVATION_NAMESPACE}",
            self.kube.core.list_namespaced_pod,
            self._relisted,
            self._changed,
            args=(gs.RESERVATION_NAMESPACE,),
            kwargs={"label_selector": keys.KAI_GPU_GROUP_LABEL},
        )

    async def _relisted(self, items: list[msgspec.Raw]) -> None:
        fresh: dict[str, tuple[str, msgspec.Raw | None]] = {}
        for raw in items:
            name, uid = self._identity(raw)
            fresh[name] = (uid, raw)
        # A pod missing from a relist is gone: waiters on it must see that.
        gone = (self._seen.keys() | self._waiters.keys()) - fresh.keys()
        self._seen = dict.fromkeys(gone, ("", None)) | fresh
        self._listed.set()
        for name in list(self._waiters):
            self._wake(name)

    async def _changed(self, kind: str, raw: msgspec.Raw) -> None:
        name, uid = self._identity(raw)
        self._seen[name] = (uid, None if kind == "DELETED" else raw)
        self._wake(name)

    def _wake(self, name: str) -> None:
        for future in self._waiters.pop(name, ()):
            if not future.done():
                future.set_result(None)

    @staticmethod
    def _identity(raw: msgspec.Raw) -> tuple[str, str]:
        try:
            meta = _NAMED.decode(raw).metadata
        except msgspec.DecodeError:
            return "", ""
        return meta.name, meta.uid
