"""Stages with dependencies: which podgroups may start, which wait for others, which are blocked.

A PodGroup, or the top owner the pod-grouper reads (a Job, JobSet, Deployment, ...), may carry the
annotation `kairos.io/after` listing what must have succeeded before its pods may be scheduled:

    kairos.io/after: "preprocess, team-b/tokenize"

Each comma-separated entry is `[namespace/]name`; without a namespace it is the dependant's own. A name
refers to a PodGroup of that name or to the workload (top owner) a PodGroup was made for, so users write
the names they chose (`preprocess`, the Job) rather than the pod-grouper's generated PodGroup names.

`evaluate` is a pure function of what the state service knows about every podgroup: for each one with
dependencies it says `ready` (every dependency succeeded), `waiting` (naming what has not succeeded yet,
or does not exist yet), `blocked` (a dependency failed, or is itself blocked: the first failure is named)
or `cycle` (the podgroup is on a dependency cycle, which is refused and named in full). Called by the
state service, which holds the pods of a podgroup that is not `ready` (a scheduling gate) and writes the
reason where users read it (an Event, `kairos explain`). No I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum

import msgspec

from shared.errors import InvalidObject
from shared.kube.values import shown

AFTER_ANNOTATION = "kairos.io/after"


class Phase(StrEnum):
    """How far a podgroup got, as far as its dependants care."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Ref(msgspec.Struct, frozen=True, order=True):
    """One entry of `kairos.io/after`: a PodGroup or workload name in a namespace."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


class Stage(msgspec.Struct, frozen=True, kw_only=True):
    """What `evaluate` needs of one podgroup."""

    namespace: str
    name: str
    """The PodGroup's name."""
    owner: str = ""
    """The top owner's name (the workload the PodGroup was made for), "" when none."""
    phase: Phase = Phase.PENDING
    after: tuple[Ref, ...] = ()


class Verdict(StrEnum):
    READY = "ready"
    WAITING = "waiting"
    BLOCKED = "blocked"
    CYCLE = "cycle"


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    verdict: Verdict
    reason: str = ""
    """In plain words, naming the dependencies concerned ("" when ready)."""


MAX_DEPENDENCIES = 256
"""More stages than any pipeline waits for; the bound keeps one annotation from costing every flush."""


def parse_after(value: str, namespace: str, *, kind: str = "podgroup", name: str = "") -> tuple[Ref, ...]:
    """The references of a `kairos.io/after` value; `InvalidObject` naming the annotation when an entry
    is empty or not `[namespace/]name`, or when it names more than `MAX_DEPENDENCIES`. Duplicates are
    dropped; order is kept."""
    field = f"metadata.annotations[{AFTER_ANNOTATION}]"
    entries = value.split(",")
    if len(entries) > MAX_DEPENDENCIES:
        raise InvalidObject(kind, name, field, f"{len(entries):,} entries, at most {MAX_DEPENDENCIES}")
    refs: dict[Ref, None] = {}
    for raw in entries:
        entry = raw.strip()
        if not entry:
            raise InvalidObject(kind, name, field, f"an empty entry in {shown(value)}")
        parts = entry.split("/")
        if len(parts) > 2 or not all(p.strip() for p in parts):
            raise InvalidObject(kind, name, field, f"{shown(entry)} is not [namespace/]name")
        ref = Ref(parts[0].strip(), parts[1].strip()) if len(parts) == 2 else Ref(namespace, entry)
        refs[ref] = None
    return tuple(refs)


def _key(stage: Stage) -> Ref:
    return Ref(stage.namespace, stage.name)


def evaluate(stages: Mapping[Ref, Stage]) -> dict[Ref, Decision]:
    """A decision for every stage that has dependencies (keyed like `stages`: namespace and PodGroup
    name). See the module docstring for the rules."""
    by_owner: dict[Ref, Ref] = {}
    for key, stage in stages.items():
        if stage.owner:
            by_owner.setdefault(Ref(stage.namespace, stage.owner), key)

    def resolve(ref: Ref) -> Ref | None:
        if ref in stages:
            return ref
        return by_owner.get(ref)

    cycles = _cycles(stages, resolve)
    out: dict[Ref, Decision] = {}

    def decide(key: Ref, trail: tuple[Ref, ...]) -> Decision:
        if key in out:
            return out[key]
        if key in cycles:
            decision = Decision(verdict=Verdict.CYCLE, reason=f"dependency cycle: {cycles[key]}")
            out[key] = decision
            return decision
        waiting: list[str] = []
        for ref in stages[key].after:
            target = resolve(ref)
            if target is None:
                waiting.append(f"{ref} (does not exist yet)")
                continue
            dep = stages[target]
            if dep.phase == Phase.FAILED:
                decision = Decision(verdict=Verdict.BLOCKED, reason=f"{ref} failed")
                out[key] = decision
                return decision
            if dep.after and target not in trail:
                upstream = decide(target, (*trail, target))
                if upstream.verdict in (Verdict.BLOCKED, Verdict.CYCLE):
                    decision = Decision(
                        verdict=Verdict.BLOCKED, reason=f"{ref} is blocked: {upstream.reason}"
                    )
                    out[key] = decision
                    return decision
            if dep.phase != Phase.SUCCEEDED:
                waiting.append(f"{ref} ({dep.phase.value.lower()})")
        if waiting:
            decision = Decision(
                verdict=Verdict.WAITING, reason="waiting for " + ", ".join(waiting) + " to succeed"
            )
        else:
            decision = Decision(verdict=Verdict.READY)
        out[key] = decision
        return decision

    for key in sorted(k for k, stage in stages.items() if stage.after):
        decide(key, (key,))
    return out


def _cycles(stages: Mapping[Ref, Stage], resolve: Callable[[Ref], Ref | None]) -> dict[Ref, str]:
    """Every stage on a dependency cycle -> a cycle through it in words ("a -> b -> a"), found by Tarjan's
    strongly connected components over the resolved edges (a self-reference is a cycle of one)."""
    edges = {
        key: [t for t in (resolve(ref) for ref in stage.after) if t is not None]
        for key, stage in stages.items()
    }
    index: dict[Ref, int] = {}
    low: dict[Ref, int] = {}
    on_stack: set[Ref] = set()
    stack: list[Ref] = []
    found: dict[Ref, str] = {}
    counter = 0

    for root in sorted(edges):
        if root in index:
            continue
        # Iterative depth-first search: dependency chains may be long.
        work: list[tuple[Ref, int]] = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            targets = edges.get(node, [])
            if i < len(targets):
                work.append((node, i + 1))
                target = targets[i]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if work and (parent := work[-1][0]) != node:
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[Ref] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, []):
                    for member in component:
                        found[member] = _cycle_words(member, set(component), edges, stages)
    return found


def _cycle_words(
    start: Ref, members: set[Ref], edges: Mapping[Ref, list[Ref]], stages: Mapping[Ref, Stage]
) -> str:
    """The shortest cycle from `start` through its strongly connected component, as "a -> b -> a", each
    member named as users wrote it: by its workload (top owner) when it has one, else its PodGroup."""

    def named(ref: Ref) -> str:
        stage = stages[ref]
        return str(Ref(stage.namespace, stage.owner)) if stage.owner else str(ref)

    parents: dict[Ref, Ref] = {}
    frontier = [start]
    while frontier:
        following: list[Ref] = []
        for node in frontier:
            for target in sorted(edges[node]):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return " -> ".join(named(r) for r in [start, *reversed(path[:-1]), start])
                if target in members and target not in parents and target != start:
                    parents[target] = node
                    following.append(target)
        frontier = following
    return f"{named(start)} -> {named(start)}"  # unreachable for a strongly connected component
