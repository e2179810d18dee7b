"""A write to the simulated cluster between its two halves, and a pod a controller creates that waits for
the admission webhooks.

Used by `tools.kubesim.cluster` (``Cluster.begin_*`` make a `Write`, ``Cluster.finish`` stores it), by the
server (`tools.kubesim.server`, which passes a `Write` through the webhooks in between) and by the
workload controllers (`tools.kubesim.controllers`, which queue a `DeferredCreate` in
``Cluster.deferred``). Its own module so that the controllers need not import the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tools.kubesim.resources import ResourceType

__all__ = ["DeferredCreate", "Write"]

Obj = dict[str, Any]


@dataclass(kw_only=True)
class Write:
    """A create or update between its two halves (`Cluster.begin_*` and `Cluster.finish`): admission
    webhooks see and may replace `obj` in between (and then set `admitted`)."""

    rt: ResourceType
    operation: str
    """CREATE or UPDATE (as admission names it)."""
    obj: Obj
    """The object to store, in stored form."""
    old: Obj | None = None
    """The stored object an UPDATE replaces."""
    subresource: str = ""
    admitted: bool = False
    """A mutating webhook replaced `obj`: defaults and checks run again before it is stored."""


@dataclass(kw_only=True)
class DeferredCreate:
    """A pod a controller creates while admission webhooks are configured: it waits in `Cluster.deferred`
    until the server has passed it through them (the real controllers' creations go through the API server)."""

    owner: Obj
    storage: str
    """The owner's storage key (its controller)."""
    write: Write
