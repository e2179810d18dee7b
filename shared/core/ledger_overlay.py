"""The pods a ledger of node reservations shows bound, worked out again only for what changed.

`overlay(pods, ledger)` is the heart of `shared.ledger_view.scheduling_view`: a pod that a node's ledger
entry reserves (`entry.pods`: pod key -> reservation) while its record still shows it pending is shown
bound on that node, with the reservation's GPU groups; it also gives every device hold of the
reservations. Every reader of a state replica asks it once per cycle (the queue's plan, each placement
session), and between two cycles only a few pods and ledger entries change: the last call's answer is
kept (`_OverlayMemo`) and brought up to date by the identity of the records, the ones that are not the
same objects as the last call's (a replica keeps an unchanged record as the same object). The answer is
always exactly what `fresh` gives; the memo falls back to `fresh` wherever the shortcut could differ from
it: a pod reserved in two entries (the last entry wins there, an order the memo does not keep), a
reservation holding devices, two pods of one key, or another thread holding the memo.

Private to `shared.ledger_view`. Pure: no I/O, no clock; it remembers the last call's records alone.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Protocol

import msgspec

from shared.model import Pod, PodStatus
from shared.model.dra import ClaimHold

__all__ = ["LedgerEntry", "fresh", "overlay"]


class Held(Protocol):
    """One pod's reservation on a node (`shared.contracts.messages.Reservation`)."""

    @property
    def gpu_groups(self) -> tuple[str, ...]: ...

    @property
    def devices(self) -> tuple[ClaimHold, ...]: ...


class LedgerEntry(Protocol):
    """A node's ledger entry (`shared.contracts.messages.NodeLedger`)."""

    @property
    def node(self) -> str: ...

    @property
    def pods(self) -> Mapping[str, Held]: ...


Shown = tuple[tuple[Pod, ...], list[ClaimHold]]
"""The pods as the ledger shows them (the input tuple itself when the ledger reserves nothing), and the
device holds of every reservation."""


def fresh(pods: tuple[Pod, ...], ledger: Iterable[LedgerEntry]) -> Shown:
    """`overlay` worked out from nothing: the definition the memo keeps to."""
    reserved = {pod: (entry.node, hold) for entry in ledger for pod, hold in entry.pods.items()}
    holds = [h for _, reservation in reserved.values() for h in reservation.devices]
    if not reserved:
        return pods, holds
    shown = []
    for pod in pods:
        hit = reserved.get(pod.key)
        shown.append(_shown(pod, hit) if hit is not None and pod.status == PodStatus.PENDING else pod)
    return tuple(shown), holds


def _shown(pod: Pod, hit: tuple[str, Held]) -> Pod:
    node, reservation = hit
    return msgspec.structs.replace(pod, status=PodStatus.BOUND, node=node, gpu_groups=reservation.gpu_groups)


class _CannotFollowError(Exception):
    """Something the memo cannot follow by identity alone (see the module docstring): start afresh."""


class _OverlayMemo:
    """The last call's records and answer, by the records' identity (each held, so an id is never another
    object's while kept)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.valid = False
        self.entries: dict[int, LedgerEntry] = {}
        self.reserved: dict[str, tuple[str, Held]] = {}
        """Pod key -> (node, reservation): each pod in one entry only."""
        self.pods: dict[int, Pod] = {}
        """The last call's pods by identity."""
        self.by_key: dict[str, Pod] = {}
        """The same pods by key (one pod per key)."""
        self.hits: dict[int, Pod] = {}
        """Pod identity -> the pod as shown, for the pods shown otherwise than their record."""

    def rebuild(self, pods: tuple[Pod, ...], entries: dict[int, LedgerEntry]) -> Shown:
        self.valid = False
        shown = fresh(pods, entries.values())
        by_key = {pod.key: pod for pod in pods}
        reserved = {pod: (entry.node, hold) for entry in entries.values() for pod, hold in entry.pods.items()}
        total = sum(len(entry.pods) for entry in entries.values())
        if shown[1] or len(by_key) != len(pods) or len(reserved) != total:
            return shown
        self.entries = entries
        self.reserved = reserved
        self.pods = dict(zip(map(id, pods), pods, strict=True))
        self.by_key = by_key
        self.hits = {id(pod): out for pod, out in zip(pods, shown[0], strict=True) if out is not pod}
        self.valid = True
        return shown

    def update(self, pods: tuple[Pod, ...], entries: dict[int, LedgerEntry]) -> Shown:
        """The last answer brought up to date; raises `_CannotFollowError` (the memo then half-updated: rebuilt)."""
        reserved, by_key, hits = self.reserved, self.by_key, self.hits
        touched: set[str] = set()
        last = self.entries
        for gone in last.keys() - entries.keys():
            for name in last[gone].pods:
                del reserved[name]
                touched.add(name)
        for new in entries.keys() - last.keys():
            entry = entries[new]
            for name, hold in entry.pods.items():
                if name in reserved or hold.devices:
                    raise _CannotFollowError
                reserved[name] = (entry.node, hold)
                touched.add(name)
        self.entries = entries
        ids = dict(zip(map(id, pods), pods, strict=True))
        before = self.pods
        for gone in before.keys() - ids.keys():
            pod = before[gone]
            del by_key[pod.key]
            hits.pop(gone, None)
        for new in ids.keys() - before.keys():
            pod = ids[new]
            key = pod.key
            if key in by_key:
                raise _CannotFollowError
            by_key[key] = pod
            touched.add(key)
        if len(by_key) != len(ids):
            raise _CannotFollowError
        self.pods = ids
        for key in touched:
            its = by_key.get(key)
            if its is None:
                continue
            hit = reserved.get(key)
            if hit is not None and its.status == PodStatus.PENDING:
                hits[id(its)] = _shown(its, hit)
            else:
                hits.pop(id(its), None)
        if not reserved or not hits:
            return pods, []
        return tuple(map(hits.get, map(id, pods), pods)), []


_MEMO = _OverlayMemo()


def overlay(pods: tuple[Pod, ...], ledger: Iterable[LedgerEntry]) -> Shown:
    """`fresh(pods, ledger)`, from the last call's answer where only some records changed."""
    listed = tuple(ledger)
    if not _MEMO.lock.acquire(blocking=False):
        return fresh(pods, listed)
    try:
        entries = dict(zip(map(id, listed), listed, strict=True))
        if len(entries) != len(listed):  # one entry listed twice
            _MEMO.valid = False
            return fresh(pods, listed)
        if _MEMO.valid:
            _MEMO.valid = False  # until the update is whole
            try:
                shown = _MEMO.update(pods, entries)
            except _CannotFollowError:
                return _MEMO.rebuild(pods, entries)
            _MEMO.valid = True
            return shown
        return _MEMO.rebuild(pods, entries)
    finally:
        _MEMO.lock.release()
