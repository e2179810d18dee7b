"""Hostile input, shared by the specs that show one tenant's object never stops scheduling for another:
the values a user can write where Kairos reads a number, a boolean or a choice, and builders of the objects
that carry them (pods, owners, PodGroups, Queues) as the API server would return them.

Used by tests/unit/test_hostile_input.py (the state service's pure path) and tests/e2e/test_hostile_tenant.py
(the same objects applied with kubectl to `kairos up`).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from shared.kube import keys
from tests.builders import (
    READY,
    node_manifest,
    pod_manifest,
    podgroup_manifest,
    queue_manifest,
    stored,
)

LONG_DIGITS = "9" * 5000
"""Beyond Python's 4,300-digit limit on int(): the value that stopped the state service."""

HOSTILE_VALUES: tuple[str, ...] = (
    LONG_DIGITS,
    "-" + LONG_DIGITS,
    "0." + LONG_DIGITS,
    LONG_DIGITS + "Gi",
    "1e" + LONG_DIGITS,
    "²",  # str.isdigit() says yes, int() says no
    "٣",  # int() says 3, Kubernetes and KAI say no
    "\uff11\uff12",  # full-width digits
    "1_000",
    " 5",
    "5 ",
    "5\n",
    "",
    " ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e400",
    "-1e400",
    "1e-400",
    "-1",
    "-0",
    "0",
    "0x10",
    "1.5",
    "2147483648",
    "-2147483649",
    "9223372036854775808",
    "\x00",
    "true",
    "ja",
)
"""Text a user can write into an annotation or a label value (the API server validates neither's content)."""

HOSTILE_TEXT = st.one_of(
    st.sampled_from(HOSTILE_VALUES),
    st.text(max_size=12),
    st.from_regex(r"[+-]?[0-9]{0,40}(\.[0-9]{0,5})?([eE][+-]?[0-9]{1,5})?(Ki|Mi|Gi|m|k)?", fullmatch=True),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)

HOSTILE_JSON: st.SearchStrategy[Any] = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64),
        st.floats(allow_nan=False, allow_infinity=False),
        HOSTILE_TEXT,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
"""Any JSON value: what a field of an owner's spec (a CRD Kairos does not validate) may hold."""

POD_ANNOTATIONS = (
    keys.GPU_FRACTION,
    keys.GPU_MEMORY,
    keys.GPU_FRACTION_NUM_DEVICES,
    keys.LAST_START_ANNOTATION,
    keys.STALENESS_GRACE_PERIOD_ANNOTATION,
    keys.GPU_GROUPS_ANNOTATION,
    keys.TOPOLOGY_ANNOTATION,
    keys.TOPOLOGY_REQUIRED_ANNOTATION,
    keys.TOPOLOGY_PREFERRED_ANNOTATION,
    "nvidia.com/mig-1g.5gb",
)
"""The pod annotations Kairos reads (besides the podgroup's name, which the builders set)."""

POD_LABELS = (
    keys.TASK_PRIORITY_LABEL,
    keys.SUBGROUP_LABEL,
    keys.QUEUE_LABEL,
    keys.NODE_POOL_LABEL,
    keys.PRIORITY_CLASS_LABEL,
    keys.PREEMPTIBILITY_LABEL,
    keys.KAI_GPU_GROUP_LABEL,
    "training.kubeflow.org/replica-index",
    "training.kubeflow.org/replica-type",
    "training.kubeflow.org/job-role",
    "ray.io/group",
    "leaderworkerset.sigs.k8s.io/group-index",
    "leaderworkerset.sigs.k8s.io/worker-index",
    "jobset.sigs.k8s.io/replicatedjob-name",
    "jobset.sigs.k8s.io/job-index",
    "serving.knative.dev/revision",
    "spark-app-selector",
    "spark-app-name",
    "grove.io/podgang",
)

OWNER_ANNOTATIONS = (
    keys.BATCH_MIN_MEMBER_ANNOTATION,
    keys.SEGMENT_SIZE_ANNOTATION,
    keys.SEGMENT_REQUIRED_ANNOTATION,
    keys.SEGMENT_PREFERRED_ANNOTATION,
    keys.TOPOLOGY_ANNOTATION,
    keys.TOPOLOGY_REQUIRED_ANNOTATION,
    keys.TOPOLOGY_PREFERRED_ANNOTATION,
    keys.STALENESS_GRACE_PERIOD_ANNOTATION,
    keys.PREEMPTION_DELAY_ANNOTATION,
    "kai.scheduler/min-member",
    "autoscaling.knative.dev/min-scale",
    "leaderworkerset.sigs.k8s.io/size",
)

OWNER_KINDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("batch/v1", "Job", ("parallelism", "completions")),
    ("kubeflow.org/v1", "PyTorchJob", ("pytorchReplicaSpecs",)),
    ("kubeflow.org/v1", "TFJob", ("tfReplicaSpecs", "runPolicy")),
    ("kubeflow.org/v2beta1", "MPIJob", ("mpiReplicaSpecs", "launcherCreationPolicy")),
    ("jobset.x-k8s.io/v1alpha2", "JobSet", ("replicatedJobs",)),
    ("ray.io/v1", "RayCluster", ("headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling", "suspend")),
    ("ray.io/v1", "RayJob", ("rayClusterSpec", "clusterSelector")),
    ("ray.io/v1", "RayService", ("rayClusterConfig",)),
    ("apps/v1", "Deployment", ("replicas",)),
    ("apps/v1", "StatefulSet", ("replicas", "podManagementPolicy")),
    ("kubeflow.org/v1", "XGBoostJob", ("xgbReplicaSpecs", "runPolicy")),
    ("kubeflow.org/v1", "JAXJob", ("jaxReplicaSpecs", "runPolicy")),
    ("kubeflow.org/v1beta1", "Notebook", ("template",)),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", ("replicas", "leaderWorkerTemplate", "startupPolicy")),
    ("serving.knative.dev/v1", "Service", ("template", "traffic")),
    ("grove.io/v1alpha1", "PodCliqueSet", ("replicas", "template")),
    ("amlarc.azureml.com/v1alpha1", "AmlJob", ("job",)),
    ("egx.nvidia.io/v1", "SPOTRequest", ("replicas",)),
    ("run.ai/v1", "RunaiJob", ("parallelism", "completions")),
)
"""Owner kinds with a grouping of their own, and the spec fields it reads."""


def pod_doc(
    name: str,
    *,
    namespace: str = "team-a",
    podgroup: str | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pending pod of Kairos's scheduler in `podgroup` (when given), asking for and limited to `requests`,
    as the API server returns it (uid ``uid-<namespace>-<name>``)."""
    if podgroup is not None:
        annotations = {**(annotations or {}), keys.PODGROUP_ANNOTATION: podgroup}
    manifest = pod_manifest(
        name,
        namespace,
        labels=labels,
        annotations=annotations,
        requests=requests,
        limits=requests,
        owners=[owner] if owner is not None else (),
        scheduler=keys.SCHEDULER_NAME,
        image="busybox",
    )
    return stored(manifest, uid="uid-{namespace}-{name}")


def owner_doc(
    api_version: str,
    kind: str,
    name: str,
    *,
    namespace: str = "team-a",
    annotations: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A workload object that owns pods, as the API server returns it (uid ``uid-<kind>-<name>``)."""
    metadata = {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}
    manifest = {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": dict(spec or {})}
    return stored(manifest, uid="uid-{kind}-{name}")


def podgroup_doc(
    name: str, *, namespace: str = "team-a", queue: str = "team-a", **spec: Any
) -> dict[str, Any]:
    """A PodGroup of one pod in `queue`, with `spec`'s fields, as the API server returns it (uid
    ``uid-pg-<name>``)."""
    return stored(podgroup_manifest(name, 1, queue, namespace, **spec), uid="uid-pg-{name}")


def queue_doc(name: str, *, parent: str = "", **resources: Any) -> dict[str, Any]:
    """A Queue under `parent` whose spec's resources are `resources` (none: unlimited GPUs of weight 1), as
    the API server returns it."""
    return stored(queue_manifest(name, parent, weight=1, resources=resources or None))


def node_doc(name: str, *, gpus: int = 8) -> dict[str, Any]:
    """A ready node of 64 cores, 512 GiB and `gpus` GPUs of 81,920 MiB, as the API server returns it."""
    manifest = node_manifest(name, gpus, cpu="64", memory="512Gi", labels={keys.GPU_MEMORY_LABEL: "81920"})
    return stored(manifest, status={"conditions": [READY]})
