"""The label, annotation and resource names Kairos reads and writes on Kubernetes objects.

KAI's names (``pkg/common/constants``, ``pkg/podgrouper/podgrouper/plugins/constants``) so workloads written
for KAI work unchanged, plus the few Kairos adds (prefixed ``kairos.io/``). Used by `shared.kube.translate`,
the state service's pod-grouper (`services.state.controllers.grouping`) and the shells that patch objects.
"""

from __future__ import annotations

# --- KAI's API versions -----------------------------------------------------------------------------------
QUEUE_API_VERSION = "scheduling.run.ai/v2"
PODGROUP_API_VERSION = "scheduling.run.ai/v2alpha2"

# --- resources -------------------------------------------------------------------------------------------
CPU = "cpu"
MEMORY = "memory"
PODS = "pods"
NVIDIA_GPU = "nvidia.com/gpu"
AMD_GPU = "amd.com/gpu"
GPU_RESOURCES = (NVIDIA_GPU, AMD_GPU)
MIG_PREFIX = "nvidia.com/mig-"
EPHEMERAL_STORAGE = "ephemeral-storage"
HUGEPAGES_PREFIX = "hugepages-"
"""Huge pages of one size (``hugepages-2Mi``), in bytes."""

# --- pods ------------------------------------------------------------------------------------------------
PODGROUP_ANNOTATION = "pod-group-name"
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
GPU_FRACTION = "gpu-fraction"
GPU_MEMORY = "gpu-memory"
GPU_FRACTION_NUM_DEVICES = "gpu-fraction-num-devices"
TASK_PRIORITY_LABEL = "kai.scheduler/task-priority"
KAI_GPU_GROUP_LABEL = "runai-gpu-group"
"""KAI's binder labels a GPU-sharing pod with its GPU group; multi-device fractions add one
``runai-gpu-group/<group>`` label per further device."""
KAI_MULTI_GPU_GROUP_PREFIX = KAI_GPU_GROUP_LABEL + "/"
GPU_GROUPS_ANNOTATION = "kairos.io/gpu-groups"
"""Written by Kairos's binder: the pod's shared GPU groups, comma-separated, in device order."""
SKIP_PODGROUPER_ANNOTATION = "kai.scheduler/skip-podgrouper"

# --- workloads (pod or top owner) --------------------------------------------------------------------------
QUEUE_LABEL = "kai.scheduler/queue"
NODE_POOL_LABEL = "kai.scheduler/node-pool"
PRIORITY_CLASS_LABEL = "priorityClassName"
PREEMPTIBILITY_LABEL = "kai.scheduler/preemptibility"
PROJECT_LABEL = "project"
USER_LABEL = "user"
TOPOLOGY_ANNOTATION = "kai.scheduler/topology"
TOPOLOGY_REQUIRED_ANNOTATION = "kai.scheduler/topology-required-placement"
TOPOLOGY_PREFERRED_ANNOTATION = "kai.scheduler/topology-preferred-placement"
SEGMENT_SIZE_ANNOTATION = "kai.scheduler/segment-size"
SEGMENT_REQUIRED_ANNOTATION = "kai.scheduler/segment-topology-required-placement"
SEGMENT_PREFERRED_ANNOTATION = "kai.scheduler/segment-topology-preferred-placement"
BATCH_MIN_MEMBER_ANNOTATION = "kai.scheduler/batch-min-member"
STALENESS_GRACE_PERIOD_ANNOTATION = "kai.scheduler/staleness-grace-period"

# --- podgroups -------------------------------------------------------------------------------------------
TOP_OWNER_METADATA_ANNOTATION = "kai.scheduler/top-owner-metadata"
LAST_START_ANNOTATION = "kai.scheduler/last-start-timestamp"
STALE_SINCE_ANNOTATION = "kai.scheduler/stale-podgroup-timestamp"

# --- nodes -----------------------------------------------------------------------------------------------
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_ENABLED_LABEL = "node-role.kubernetes.io/mig-enabled"
NODE_NAME_LABEL = "kairos.io/node-name"
"""Added by Kairos to every translated node (value: the node's name), so a pod's node-affinity
``matchFields`` on ``metadata.name`` (what DaemonSets use) becomes an ordinary label requirement."""
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"

# --- defaults --------------------------------------------------------------------------------------------
DEFAULT_QUEUE = "default-queue"
"""KAI's pod-grouper queue when neither the pod nor its top owner names one."""
DEFAULT_QUEUE_PRIORITY = 100
DEFAULT_PODGROUP_PRIORITY = 50
"""KAI's podgroup priority when its PriorityClass is unknown and no PriorityClass is globalDefault."""
NON_PREEMPTIBLE_PRIORITY = 100
"""Podgroups at or above this priority are non-preemptible unless they say otherwise (KAI's build class)."""
DEFAULT_NODE_POOL = "default"
SCHEDULER_NAME = "kai-scheduler"
PREEMPTION_DELAY_ANNOTATION = "kai.scheduler/preemption-delay"
"""KAI v0.17: on a workload or its pods, how long a pending gang waits before it may evict others (a Go
duration); the pod-grouper writes it to the PodGroup's ``spec.preemptionDelay``."""

LAST_EVICTION_ANNOTATION = "kai.scheduler/last-eviction-timestamp"
"""On a PodGroup, when its pods were last evicted (RFC 3339): its preemption delay counts again from then."""
