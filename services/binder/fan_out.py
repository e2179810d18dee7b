"""Many calls of one kind at once, within a bound: a proposal's claims, node entries and pool entries
(`services.binder.ledger`), and its evictions and binds (`services.binder.commit`, and the recovery scan's
binds in `services.binder.recovery`).

`concurrently` runs the calls `CONCURRENCY` at a time and hands back each result or the failure it was
expected to raise, in the items' order; `cluster_calls` is that for the cluster's calls, whose expected
failures are a refusal (`ClusterRefused`) and no answer (`TemporaryError`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar, cast

from services.binder.cluster_client import ClusterRefused
from shared.errors import TemporaryError

__all__ = ["CONCURRENCY", "cluster_calls", "concurrently"]

T = TypeVar("T")
R = TypeVar("R")

CONCURRENCY = 32
"""Calls in flight at once for one proposal: a large gang binds in parallel, within reason."""


async def concurrently(
    items: Sequence[T], call: Callable[[T], Awaitable[R]], expected: tuple[type[Exception], ...]
) -> list[R | Exception]:
    """`call` on every item, `CONCURRENCY` at a time, each result or the `expected` failure it raised, in
    the items' order. Any other failure is raised once all calls have ended (what they did stays: recovery
    takes back an incomplete ledger commit)."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(item: T) -> R:
        async with gate:
            return await call(item)

    results = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, expected):
            raise r  # cancellation and the like are not a cluster's or a ledger's answer
    return cast("list[R | Exception]", results)


async def cluster_calls(
    items: Sequence[T], call: Callable[[T], Awaitable[None]]
) -> list[BaseException | None]:
    """`call` on every item concurrently: None where it succeeded, else what the cluster refused or left
    unanswered (`ClusterRefused`, `TemporaryError`)."""
    results = await concurrently(items, call, (ClusterRefused, TemporaryError))
    return [r if isinstance(r, BaseException) else None for r in results]
