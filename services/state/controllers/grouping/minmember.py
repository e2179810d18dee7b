"""KAI's min-member override (``minmember``): a gang size a user writes on a workload as an annotation.

Not a plugin: the batch Job (`job`), JobSet (`jobset`) and StatefulSet (`statefulset`) plugins read their
override through `min_member_override`. KAI v0.15 added ``kai.scheduler/batch-min-member`` for Jobs and
JobSets; its ``minmember`` package (v0.17) parses every such annotation one way: base-10, an int32, at
least 1. A value it refuses is refused here naming the object and the annotation.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.state.controllers.grouping.fields import parsed
from shared.kube import keys, values, wire

MIN_MEMBER_MINIMUM = 1
"""KAI ``minmember.Parse`` refuses a value below 1: a gang of no pod is not a gang."""


def annotation_field(key: str, under: str = "metadata") -> str:
    """The field path of annotation `key` under `under` (``metadata``, or a template's metadata)."""
    return f"{under}.annotations[{key}]"


def min_member_override(
    obj: wire.Owner,
    key: str = keys.BATCH_MIN_MEMBER_ANNOTATION,
    annotations: Mapping[str, object] | None = None,
    under: str = "metadata",
) -> int | None:
    """The override `key` names (None when the annotation is absent): on `obj` itself, or in
    `annotations` (a template's, at field path `under`), which errors still attribute to `obj`."""
    found = obj.metadata.annotations if annotations is None else annotations
    if key not in found:
        return None
    raw = found[key]
    return parsed(
        obj,
        annotation_field(key, under),
        lambda: values.whole(
            raw, low=MIN_MEMBER_MINIMUM, high=values.INT32_MAX, what="a whole number of pods"
        ),
    )
