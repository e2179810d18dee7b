"""The stage verdicts: which podgroups with `kairos.io/after` may run, kept current as objects change.

Owned by the mirror (`services.state.mirror.cache.Mirror`), which tells it of every podgroup, pod and Job it
sees (`relisted`, `group_changed`, `pod_changed`, `job_changed`) and asks it at each flush to `decide`
again. The verdicts are recomputed only when something they read changed: a podgroup's annotation or top
owner, or a podgroup, pod or Job among those the last verdicts read (the dependants and what they name).
Only those are built into the `Stage`s that `services.state.mirror.dependencies.evaluate` judges: a podgroup's
phase is its Job's Complete or Failed condition when its top owner is a Job, else its pods'; a Job named
that has no podgroup still says how it ended. The mirror holds back a podgroup for which `hold` gives a
reason, and lists for the gate keeper the gated pods of the podgroups `may_lift` lets go. Pure: no I/O,
no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from services.state.mirror.dependencies import (
    AFTER_ANNOTATION,
    Decision,
    Phase,
    Ref,
    Stage,
    Verdict,
    evaluate,
    parse_after,
)
from services.state.mirror.problems import INVALID_PODGROUP, STAGE_REASONS
from shared.errors import InvalidObject
from shared.kube import wire

Members = Callable[[str, str], Sequence[wire.Pod]]
"""(namespace, podgroup) -> the pods that name that podgroup (the mirror's `members`)."""


class StageVerdicts:
    """The verdict of every podgroup that declares `kairos.io/after`, by "ns/name"."""

    def __init__(self) -> None:
        self.decisions: dict[str, Decision] = {}
        """PodGroup "ns/name" with `kairos.io/after` -> its verdict as of the last `decide`."""
        self._afters: dict[str, tuple[Ref, ...]] = {}
        """PodGroup "ns/name" -> its parsed `kairos.io/after` (podgroups that have one)."""
        self._after_errors: dict[str, str] = {}
        """PodGroup "ns/name" -> why its `kairos.io/after` does not parse (it is held back as invalid)."""
        self._errors_shown: dict[str, str] = {}
        """`_after_errors` as of the last verdicts (a change re-examines the podgroup)."""
        self._owner_index: dict[Ref, str] = {}
        """(namespace, top owner name) -> the PodGroup made for it, so `after` may name the workload."""
        self._relevant: set[str] = set()
        """PodGroups the last verdicts read (dependants and what they name): a change to one or its pods
        recomputes the verdicts; changes elsewhere do not."""
        self._relevant_jobs: set[str] = set()
        """Jobs ("ns/name") the last verdicts read or named."""
        self._stale = True

    # --- what changed -------------------------------------------------------------------------------------
    def relisted(self, groups: Mapping[str, wire.PodGroup] | None = None) -> None:
        """Podgroups, pods or Jobs were listed afresh: the verdicts are recomputed at the next `decide`.
        With `groups` (a fresh list of podgroups), everything remembered of podgroups is rebuilt from it."""
        if groups is not None:
            self._afters.clear()
            self._after_errors.clear()
            self._owner_index.clear()
            for name, group in groups.items():
                self.group_changed(name, None, group)
        self._stale = True

    def group_changed(self, name: str, before: wire.PodGroup | None, after: wire.PodGroup | None) -> None:
        """Keep the parsed `kairos.io/after` of every podgroup that has one and the top-owner index up to
        date, and note when the verdicts may have changed."""
        old_value = before.metadata.annotations.get(AFTER_ANNOTATION, "") if before is not None else None
        new_value = after.metadata.annotations.get(AFTER_ANNOTATION, "") if after is not None else None
        old_owner = _owner_key(before)
        new_owner = _owner_key(after)
        if old_owner is not None and old_owner != new_owner and self._owner_index.get(old_owner) == name:
            del self._owner_index[old_owner]
        if new_owner is not None:
            self._owner_index[new_owner] = name
        if before is None or after is None or old_value != new_value or old_owner != new_owner:
            self._afters.pop(name, None)
            self._after_errors.pop(name, None)
            if after is not None and new_value and new_value.strip():
                meta = after.metadata
                try:
                    self._afters[name] = parse_after(new_value, meta.namespace, kind="PodGroup", name=name)
                except InvalidObject as exc:
                    self._after_errors[name] = str(exc)
            self._stale = True
        elif name in self._relevant:
            self._stale = True

    def pod_changed(self, before: str | None, after: str | None) -> None:
        """A pod changed that belonged to podgroup `before` and now to `after` ("ns/name", None: none)."""
        if self._relevant and (before in self._relevant or after in self._relevant):
            self._stale = True

    def job_changed(self, name: str) -> None:
        if name in self._relevant_jobs:
            self._stale = True

    # --- verdicts -----------------------------------------------------------------------------------------
    def decide(
        self, groups: Mapping[str, wire.PodGroup], jobs: Mapping[str, wire.Job], members: Members
    ) -> set[str]:
        """Recompute the verdicts when something they read changed; the podgroups (of `groups`) whose
        verdict or annotation error changed, to be looked at again. Only the dependants and what they name
        are built."""
        if not self._stale:
            return set()
        self._stale = False
        stages: dict[Ref, Stage] = {}
        relevant: set[str] = set()
        named_jobs: set[str] = set()

        def add(name: str, after: tuple[Ref, ...] = ()) -> None:
            group = groups[name]
            meta = group.metadata
            top = meta.owner_references[0] if meta.owner_references else None
            if top is not None and top.kind == "Job":
                named_jobs.add(f"{meta.namespace}/{top.name}")
            relevant.add(name)
            stages[Ref(meta.namespace, meta.name)] = Stage(
                namespace=meta.namespace,
                name=meta.name,
                owner=top.name if top is not None else "",
                phase=_phase(group, top, jobs, members),
                after=after,
            )

        for name, refs in self._afters.items():
            if name in groups:
                add(name, refs)
        for ref in sorted({ref for refs in self._afters.values() for ref in refs}):
            key = f"{ref.namespace}/{ref.name}"
            named_jobs.add(key)
            target = key if key in groups else self._owner_index.get(ref)
            if target is not None and target in groups:
                if Ref(ref.namespace, groups[target].metadata.name) not in stages:
                    add(target)
                continue
            # A Job named that has no podgroup (its pods are gone, or not grouped yet) still says how it
            # ended.
            job = jobs.get(key)
            if job is not None:
                stages[ref] = Stage(
                    namespace=ref.namespace,
                    name=ref.name,
                    owner=ref.name,
                    phase=_job_phase(job) or Phase.PENDING,
                )
        decisions = (
            {f"{key.namespace}/{key.name}": d for key, d in evaluate(stages).items()} if stages else {}
        )
        old = self.decisions
        changed = {n for n in decisions.keys() | old.keys() if decisions.get(n) != old.get(n)}
        errors = self._after_errors
        changed |= {
            n for n in errors.keys() | self._errors_shown.keys() if errors.get(n) != self._errors_shown.get(n)
        }
        self.decisions = decisions
        self._errors_shown = dict(errors)
        self._relevant = relevant
        self._relevant_jobs = named_jobs
        return {n for n in changed if n in groups}

    def hold(self, name: str) -> tuple[str, str] | None:
        """(Event reason, message) when the podgroup must wait for its dependencies (or its annotation does
        not parse), else None."""
        error = self._after_errors.get(name)
        if error is not None:
            return INVALID_PODGROUP, error
        decision = self.decisions.get(name)
        if decision is None or decision.verdict == Verdict.READY:
            return None
        return STAGE_REASONS[decision.verdict], f"PodGroup {name!r}: {decision.reason}"

    def may_lift(self, name: str) -> bool:
        """The `kairos.io/after` gate may come off the podgroup's pods: its annotation parses and its
        dependencies succeeded, or it has none."""
        if name in self._after_errors:
            return False
        decision = self.decisions.get(name)
        return decision is None or decision.verdict == Verdict.READY


def _phase(
    group: wire.PodGroup, top: wire.OwnerReference | None, jobs: Mapping[str, wire.Job], members: Members
) -> Phase:
    """How far the podgroup got: its Job's condition when its top owner is a Job, else its pods'."""
    job = None
    if top is not None and top.kind == "Job":
        job = jobs.get(f"{group.metadata.namespace}/{top.name}")
        if job is not None and (ended := _job_phase(job)) is not None:
            return ended
    phases = [pod.status.phase for pod in members(group.metadata.namespace, group.metadata.name)]
    if not phases:
        return Phase.PENDING
    if job is not None or any(p not in wire.FINISHED_PHASES for p in phases):
        # A Job decides itself when it has ended; until then its pods say only whether it started.
        return Phase.RUNNING if any(p not in ("Pending", "") for p in phases) else Phase.PENDING
    need = max(1, group.spec.min_member or 1)
    return Phase.SUCCEEDED if phases.count("Succeeded") >= need else Phase.FAILED


def _job_phase(job: wire.Job) -> Phase | None:
    """A Job's end from its conditions (Complete or SuccessCriteriaMet; Failed or FailureTarget), or None
    while it runs."""
    for condition in job.status.conditions:
        if condition.status != "True":
            continue
        if condition.type in ("Complete", "SuccessCriteriaMet"):
            return Phase.SUCCEEDED
        if condition.type in ("Failed", "FailureTarget"):
            return Phase.FAILED
    return None


def _owner_key(group: wire.PodGroup | None) -> Ref | None:
    """(namespace, top owner name) of a PodGroup, None without an owner."""
    if group is None or not group.metadata.owner_references:
        return None
    return Ref(group.metadata.namespace, group.metadata.owner_references[0].name)
