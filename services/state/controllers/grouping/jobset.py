"""KAI's JobSet plugin (``jobset``, v0.16): one PodGroup per JobSet with a two-level sub-group hierarchy.

Claims (`KINDS`, merged by `registry`) ``jobset.x-k8s.io/v1alpha2`` JobSets; called by `decision.group_pod`.

The PodGroup is ``pg-<jobset>-<uid>``, owned by the JobSet, with ``minSubGroup`` at the root (no minMember:
written 0) and, for each replicated job in spec order, a parent sub-group named after it whose
``minSubGroup`` is its ``replicas``, followed by one leaf sub-group per replica, ``<replicated job>-replica-
<index>``, whose parent it is and whose ``minMember`` is the Job's ``parallelism``. A pod joins the leaf its
``jobset.sigs.k8s.io/replicatedjob-name`` and ``job-index`` labels name (the labels the JobSet controller
puts on each Job's pod template).

- Root ``minSubGroup``: the JobSet's ``kai.scheduler/batch-min-member`` annotation, clamped to the number
  of replicated jobs; else 1 with ``startupPolicyOrder: InOrder`` (JobSet starts one replicated job after
  the other, so only the first exists at first), else (``AnyOrder``, JobSet's default) every replicated job.
- Leaf ``minMember``: the replicated job's ``template.metadata.annotations[kai.scheduler/batch-min-member]``
  when set (applied even above the parallelism, as KAI does), else ``template.spec.parallelism`` (default
  1). Kairos departs from KAI in one case: a Job with ``completions`` below its ``parallelism`` runs only
  ``completions`` pods at a time, and KAI's leaf would wait for pods that never come; here the leaf asks for
  ``completions``, as KAI's JobSet plugin did before v0.16.
- Leaf topology: the replicated job's template annotations ``kai.scheduler/topology`` with a required or
  preferred placement; the root keeps the JobSet's own (the default plugin's).
- Legacy PodGroups: a JobSet that already has a PodGroup of the shape before v0.16 (no sub-groups) keeps
  that shape so its running pods are not moved: ``pg-<jobset>-<uid>-<replicated job>`` per replicated job
  with ``InOrder``, else ``pg-<jobset>-<uid>``, min member the JobSet's batch-min-member, else 1 (KAI's
  ``legacy_grouper.go``, marked for removal in v0.17 but still in KAI's tree as read). KAI lists every
  PodGroup of the namespace and matches the name prefix; here the names the old shape could have are read
  through `Ctx.get`, all at once.

KAI's docs still say ``InOrder`` makes one PodGroup per replicated job; its code (followed here) makes the
one PodGroup above. A malformed spec (replicated jobs missing, not a list, unnamed or named twice, a
negative or non-integer count, a hostile annotation) is refused naming the JobSet and the field; so is a
replicated job of 0 replicas, whose parent sub-group would have no child for its minSubGroup: KAI's
grouper writes it and KAI's PodGroup validation then refuses the whole PodGroup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.fields import owner_error, parsed, pod_as_owner
from services.state.controllers.grouping.minmember import min_member_override
from services.state.controllers.grouping.model import (
    GVK,
    Constraint,
    Ctx,
    Metadata,
    Plugin,
    ReadsNeeded,
    SubGroup,
)
from shared.kube import keys, values, wire

REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
IN_ORDER = "InOrder"
ANY_ORDER = "AnyOrder"
"""JobSet's default ``startupPolicyOrder``."""

MAX_SUB_GROUPS = 10_000
"""The most sub-groups one JobSet's PodGroup may have (parents and leaves). KAI builds them all; a PodGroup
of tens of thousands would not fit the API server's object size limit, and a hostile replica count of
billions would fill the grouper's memory, so such a JobSet is refused naming the count."""


@dataclass(frozen=True)
class ReplicatedJob:
    """What the PodGroup needs of one replicated job."""

    name: str
    replicas: int
    leaf_min: int
    leaf_constraint: Constraint | None


def jobset_plugin(ctx: Ctx, top: wire.Owner) -> Metadata:
    """KAI ``JobSetGrouper``: one PodGroup with a parent sub-group per replicated job and a leaf per replica,
    or the legacy shape for a JobSet that already has a PodGroup without sub-groups."""
    if not top.metadata.name or not top.metadata.uid:
        raise owner_error(top, "metadata", "the JobSet has no name or uid")
    jobs = replicated_jobs(top)
    order = startup_order(top)
    override = min_member_override(top)
    prefix = f"pg-{top.metadata.name}-{top.metadata.uid}"
    if has_legacy_podgroup(ctx, prefix, jobs):
        return legacy_metadata(ctx, top, prefix, order, override)
    md = default_metadata(ctx, top, [top])
    md.name = prefix
    md.min_available = 0
    md.min_sub_group = root_min_sub_group(len(jobs), order, override)
    md.sub_groups = sub_groups(jobs)
    leaf_of(ctx.pod, md.sub_groups).pods.append(ctx.pod.metadata.name)
    return md


def replicated_jobs(top: wire.Owner) -> list[ReplicatedJob]:
    """``spec.replicatedJobs``, checked: a non-empty list of named objects with sound counts."""
    raw = top.spec.get("replicatedJobs")
    if raw is None or raw == []:
        raise owner_error(top, "spec.replicatedJobs", "the JobSet has no replicated jobs")
    if not isinstance(raw, list):
        raise owner_error(top, "spec.replicatedJobs", f"must be a list, got {values.shown(raw)}")
    jobs: list[ReplicatedJob] = []
    names: set[str] = set()
    total = 0
    for i, rj in enumerate(raw):
        where = f"spec.replicatedJobs[{i}]"
        if not isinstance(rj, Mapping):
            raise owner_error(top, where, f"must be an object, got {values.shown(rj)}")
        name = rj.get("name")
        if not isinstance(name, str) or not name:
            raise owner_error(top, f"{where}.name", "missing")
        replicas = _count(top, rj, ("replicas",), where, low=1)
        total += 1 + replicas
        if total > MAX_SUB_GROUPS:
            raise owner_error(
                top, f"{where}.replicas", f"the JobSet would need more than {MAX_SUB_GROUPS:,} sub-groups"
            )
        named = {name} | {f"{name}-replica-{index}" for index in range(replicas)}
        if named & names:
            twice = values.shown(min(named & names))
            raise owner_error(top, f"{where}.name", f"sub-group {twice} would be named twice")
        names |= named
        jobs.append(
            ReplicatedJob(name, replicas, _leaf_min(top, rj, where), _leaf_constraint(top, rj, where))
        )
    return jobs


def startup_order(top: wire.Owner) -> str:
    """``spec.startupPolicy.startupPolicyOrder``, ``AnyOrder`` when absent."""
    policy = top.spec.get("startupPolicy")
    if policy is None:
        return ANY_ORDER
    if not isinstance(policy, Mapping):
        raise owner_error(top, "spec.startupPolicy", f"must be an object, got {values.shown(policy)}")
    order = policy.get("startupPolicyOrder", ANY_ORDER)
    if not isinstance(order, str):
        raise owner_error(
            top, "spec.startupPolicy.startupPolicyOrder", f"must be a string, got {values.shown(order)}"
        )
    return order


def root_min_sub_group(jobs: int, order: str, override: int | None) -> int:
    """How many of the `jobs` replicated jobs must be satisfied: the JobSet's batch-min-member `override`
    (at most all of them), else 1 for ``InOrder``, else all."""
    if override is not None:
        return min(override, jobs)
    return 1 if order == IN_ORDER else jobs


def sub_groups(jobs: Sequence[ReplicatedJob]) -> list[SubGroup]:
    """A parent per replicated job (``minSubGroup``: its replicas), each followed by its leaves."""
    out: list[SubGroup] = []
    for job in jobs:
        out.append(SubGroup(job.name, 0, min_sub_group=job.replicas))
        out.extend(
            SubGroup(f"{job.name}-replica-{index}", job.leaf_min, job.name, job.leaf_constraint)
            for index in range(job.replicas)
        )
    return out


def leaf_of(pod: wire.Pod, groups: Sequence[SubGroup]) -> SubGroup:
    """The leaf sub-group the pod's replicated-job and job-index labels name."""
    labels = pod.metadata.labels
    for key in (REPLICATED_JOB_LABEL, JOB_INDEX_LABEL):
        if not labels.get(key):
            raise owner_error(pod_as_owner(pod), f"metadata.labels[{key}]", "missing")
    name = f"{labels[REPLICATED_JOB_LABEL]}-replica-{labels[JOB_INDEX_LABEL]}"
    for group in groups:
        if group.name == name and group.parent is not None:
            return group
    raise owner_error(
        pod_as_owner(pod),
        f"metadata.labels[{JOB_INDEX_LABEL}]",
        f"names no replica of the JobSet (no sub-group {values.shown(name)})",
    )


# --- the shape before v0.16 -----------------------------------------------------------------------------
def has_legacy_podgroup(ctx: Ctx, prefix: str, jobs: Sequence[ReplicatedJob]) -> bool:
    """Whether a PodGroup of a name the old shape gives this JobSet exists without sub-groups."""
    names = [prefix] + [f"{prefix}-{job.name}" for job in jobs]
    found: list[Mapping[str, Any] | None] = []
    missing: list[Any] = []
    for name in names:
        try:
            found.append(ctx.get(keys.PODGROUP_API_VERSION, "PodGroup", name))
        except ReadsNeeded as needed:
            missing.extend(needed.reads)
    if missing:
        raise ReadsNeeded(missing)
    return any(pg is not None and not _has_sub_groups(pg) for pg in found)


def legacy_metadata(ctx: Ctx, top: wire.Owner, prefix: str, order: str, override: int | None) -> Metadata:
    """KAI's handler before v0.16: a PodGroup per replicated job with ``InOrder``, else one; no sub-groups."""
    md = default_metadata(ctx, top, [top])
    replicated = ctx.pod.metadata.labels.get(REPLICATED_JOB_LABEL, "")
    if not replicated:
        raise owner_error(pod_as_owner(ctx.pod), f"metadata.labels[{REPLICATED_JOB_LABEL}]", "missing")
    md.name = f"{prefix}-{replicated}" if order == IN_ORDER else prefix
    md.min_available = override or 1
    return md


def _has_sub_groups(podgroup: Mapping[str, Any]) -> bool:
    spec = podgroup.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("subGroups"))


# --- reading a replicated job ---------------------------------------------------------------------------
def _count(top: wire.Owner, rj: Mapping[str, Any], path: Sequence[str], where: str, low: int = 0) -> int:
    """A count at `path` in the replicated job `rj`: 1 when absent (the API's default), else a whole number
    >= `low`, refused naming ``<where>.<path>`` otherwise."""
    value: Any = rj
    for part in path:
        if not isinstance(value, Mapping) or part not in value:
            return 1
        value = value[part]
    field_path = ".".join((where, *path))
    return parsed(top, field_path, lambda: values.whole_of(value, low=low, high=values.INT32_MAX))


def _leaf_min(top: wire.Owner, rj: Mapping[str, Any], where: str) -> int:
    """The override in the Job template's annotations, else the parallelism (capped by the completions)."""
    override = min_member_override(
        top,
        annotations=_template_part(top, rj, where, "metadata", "annotations"),
        under=f"{where}.template.metadata",
    )
    job_spec = _template_part(top, rj, where, "spec")
    parallelism = _count(top, rj, ("template", "spec", "parallelism"), where)
    completions = None
    if "completions" in job_spec:
        completions = _count(top, rj, ("template", "spec", "completions"), where)
    if override is not None:
        return override
    return parallelism if completions is None else min(parallelism, completions)


def _leaf_constraint(top: wire.Owner, rj: Mapping[str, Any], where: str) -> Constraint | None:
    """The Job template's topology annotations, when they name a topology and a placement."""
    annotations = _template_part(top, rj, where, "metadata", "annotations")
    found: list[str] = []
    for key in (
        keys.TOPOLOGY_ANNOTATION,
        keys.TOPOLOGY_REQUIRED_ANNOTATION,
        keys.TOPOLOGY_PREFERRED_ANNOTATION,
    ):
        value = annotations.get(key, "")
        if not isinstance(value, str):
            field_path = f"{where}.template.metadata.annotations[{key}]"
            raise owner_error(top, field_path, f"must be a string, got {values.shown(value)}")
        found.append(value)
    topology, required, preferred = found
    if not topology or not (required or preferred):
        return None
    return Constraint(topology, required, preferred)


def _template_part(top: wire.Owner, rj: Mapping[str, Any], where: str, *path: str) -> Mapping[str, Any]:
    """The object at ``template.<path>`` of the replicated job (empty when absent), refused naming the field
    when it, or something on the way, is not an object."""
    value: Any = rj
    field_path = where
    for part in ("template", *path):
        value = value.get(part)
        field_path = f"{field_path}.{part}"
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise owner_error(top, field_path, f"must be an object, got {values.shown(value)}")
    out: Mapping[str, Any] = value
    return out


KINDS: Mapping[GVK, tuple[str, Plugin]] = {
    ("jobset.x-k8s.io", "v1alpha2", "JobSet"): ("jobset", jobset_plugin),
}
