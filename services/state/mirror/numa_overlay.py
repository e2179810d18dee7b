"""The nodes' NodeResourceTopology objects, held by the mirror and laid over its nodes as `Node.numa`.

Fed by the NUMA watch (`services.state.sources.numa_watch`: `relist`, `change`) with the objects' JSON, by name
(an object is named after its node); asked by the mirror (`services.state.mirror.cache.Mirror._node`) for each
node it writes (`attach`). An object is translated against the node it describes (`shared.kube.numa`,
cached until either changes): a valid one gives the node its zones; one that does not add up gives the
node none (it schedules as without the object: the ``numa`` plugin lets every pod pass there), and its
problem is kept under the object's name (`problems`), for the watch to show as a Warning Event on it.
Nothing else is affected. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from shared.errors import InvalidObject
from shared.kube.numa import decode_topology, node_numa_of
from shared.model import Node
from shared.model.numa import NodeNuma


class _Named(msgspec.Struct):
    metadata: dict[str, object] | None = None


_NAMED = msgspec.json.Decoder(_Named)


def _name_of(data: bytes) -> str:
    try:
        meta = _NAMED.decode(data).metadata
    except msgspec.MsgspecError:
        return ""
    name = meta.get("name") if meta is not None else None
    return name if isinstance(name, str) else ""


@dataclass
class NumaOverlay:
    """NodeResourceTopology JSON by name, and what each came to for its node."""

    raw: dict[str, bytes] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    """Object name -> why it was not taken (its Warning's message)."""
    uids: dict[str, str] = field(default_factory=dict)
    """Object name -> its uid, for the Event's involved object."""
    _cache: dict[str, tuple[bytes, Node, NodeNuma | None]] = field(default_factory=dict)

    def relist(self, items: Iterable[bytes]) -> set[str]:
        """Replace every object by a fresh list; the names whose object came, went or may have changed."""
        fresh: dict[str, bytes] = {}
        for data in items:
            name = _name_of(data)
            if name:
                fresh[name] = data
        touched = set(self.raw) | set(fresh)
        for gone in set(self.raw) - set(fresh):
            self._forget(gone)
        self.raw = fresh
        return touched

    def change(self, event: str, data: bytes) -> set[str]:
        """One watch event; the names it touches (none for an object without a name)."""
        name = _name_of(data)
        if not name:
            return set()
        if event == "DELETED":
            self._forget(name)
            self.raw.pop(name, None)
        else:
            self.raw[name] = data
        return {name}

    def attach(self, node: Node) -> Node:
        """`node` with the zones of its NodeResourceTopology, when it has a valid one."""
        data = self.raw.get(node.name)
        if data is None:
            self.problems.pop(node.name, None)
            return node
        cached = self._cache.get(node.name)
        if cached is not None and cached[0] is data and cached[1] == node:
            numa = cached[2]
        else:
            try:
                topology = decode_topology(data)
                self.uids[node.name] = topology.metadata.uid
                numa = node_numa_of(topology, node)
            except InvalidObject as exc:
                self.problems[node.name] = str(exc)
                self._cache.pop(node.name, None)
                return node
            self.problems.pop(node.name, None)
            self._cache[node.name] = (data, node, numa)
        return node if numa is None else msgspec.structs.replace(node, numa=numa)

    def _forget(self, name: str) -> None:
        self._cache.pop(name, None)
        self.problems.pop(name, None)
        self.uids.pop(name, None)
