"""Which queues form a valid tree: the state mirror's check of each queue's chain of parents.

Called by the mirror (`services.state.mirror.cache.Mirror`) at every full flush, with the queues that
translated. A queue goes to KV only when every queue up its chain exists and is valid; otherwise it is held
back with the reason (a cycle of parents, a parent that does not exist, one that is not valid or is itself
held back), and so are the podgroups in it. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shared.model import Queue

__all__ = ["valid_queues"]


def valid_queues(
    translated: Mapping[str, Queue], invalid: Callable[[str], bool]
) -> tuple[dict[str, Queue], dict[str, str]]:
    """(the queues whose chain of parents is whole and acyclic, by name; the others' "queue q" -> why they
    are held back). `invalid(name)`: whether a queue missing from `translated` is there but did not
    translate (it is then "not valid" rather than missing)."""
    valid: dict[str, Queue] = {}
    held: dict[str, str] = {}
    for name, queue in translated.items():
        chain = [name]
        current: Queue | None = queue
        problem = ""
        while current is not None and current.parent is not None:
            if current.parent in chain:
                problem = "cycle of parent queues " + " -> ".join(
                    [*chain[chain.index(current.parent) :], current.parent]
                )
                break
            parent = translated.get(current.parent)
            if parent is None:
                problem = f"parent queue {current.parent!r} does not exist"
                if invalid(current.parent):
                    problem = f"parent queue {current.parent!r} is not valid"
                break
            chain.append(current.parent)
            current = parent
        if problem and len(chain) > 1 and not problem.startswith("cycle"):
            # The fault is further up: say which parent is held back, and why.
            problem = f"parent queue {queue.parent!r} is held back ({problem})"
        if problem:
            held[f"queue {name}"] = f"Queue {name!r}: spec.parentQueue: {problem}"
        else:
            valid[name] = queue
    return valid, held
