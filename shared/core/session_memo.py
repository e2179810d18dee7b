"""What the core's checks that decide for a pod on a node remember for one session: the storage of
`shared.core.volumes` and the devices of `shared.core.dra`.

`PerSession` is a value built from a session when first asked (the session's objects, indexed) and dropped
with the session. `placed_decisions` walks what other pods got this session on the node each is placed on
now: what they hold while they stay there, so a rollback (a gang that does not fit, a scenario undone)
gives it back. Private to the core. Pure: no I/O, no clock.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Generic, TypeVar

from shared.model.status import ACTIVE_ALLOCATED

if TYPE_CHECKING:
    from shared.core.session import Session
    from shared.core.tasks import TaskState

__all__ = ["PerSession", "placed_decisions"]

S = TypeVar("S")
D = TypeVar("D")


class PerSession(Generic[S]):
    """One value per session: `build`'s, made when first asked, dropped with the session."""

    def __init__(self, build: Callable[[Session], S]) -> None:
        self._build = build
        self._values: weakref.WeakKeyDictionary[Session, S] = weakref.WeakKeyDictionary()

    def __call__(self, ssn: Session) -> S:
        value = self._values.get(ssn)
        if value is None:
            value = self._build(ssn)
            self._values[ssn] = value
        return value

    def get(self, ssn: Session) -> S | None:
        """The session's value when it was made (None: nothing asked yet this session)."""
        return self._values.get(ssn)


def placed_decisions(
    ssn: Session, task: TaskState, decided: Mapping[str, Mapping[str, tuple[D, ...]]]
) -> Iterator[tuple[TaskState, str, tuple[D, ...]]]:
    """Each other pod of the session placed on a node now, in a status that holds it (`ACTIVE_ALLOCATED`),
    the node, and what it got there; `decided` is pod key -> node -> what it got on that node."""
    for other_key, by_node in decided.items():
        if other_key == task.key:
            continue
        other = ssn.tasks.get(other_key)
        if other is None or other.node is None or other.status not in ACTIVE_ALLOCATED:
            continue
        yield other, other.node, by_node.get(other.node, ())
