"""The subset of Kubernetes JSON that Kairos reads, as msgspec Structs, and its decoders.

Objects come from the API server (lists, watch events, GETs) through `shared.kubeapi` as raw JSON bytes and
are decoded here; `shared.kube.translate` turns them into the model and the state service groups pods
(`services.state.controllers.grouping`). Field names are Kubernetes' camelCase (snake_case here); fields Kairos does not
read are ignored, so newer API servers and CRD versions decode. Quantities and timestamps stay strings:
`translate` parses them and names the field when one is malformed. A document that does not match raises
`InvalidObject` naming the kind, the object ("namespace/name") and the field path
(``spec.containers[0].resources``).

The SchedulingShard's spec is the exception to "unknown fields are ignored": it is configuration a user
writes by hand, so a misspelt field there is an error naming it (``spec.placementStrategy.gpuu``) rather
than a setting silently not applied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, TypeVar, overload

import msgspec

from shared.errors import InvalidObject

__all__ = [
    "Affinity",
    "Container",
    "ContainerPort",
    "Namespace",
    "Node",
    "ObjectMeta",
    "Owner",
    "OwnerReference",
    "Pod",
    "PodGroup",
    "PriorityClass",
    "Queue",
    "ResourceList",
    "SchedulingShard",
    "Topology",
    "TopologySpreadConstraint",
    "convert",
    "decode",
    "decode_namespace",
    "decode_node",
    "decode_owner",
    "decode_pod",
    "decode_podgroup",
    "decode_priority_class",
    "decode_queue",
    "decode_scheduling_shard",
    "decode_topology",
    "object_name",
]

ResourceList = dict[str, str | int | float]
"""Resource name -> quantity ("500m", "2Gi"); numbers are accepted for hand-written objects."""


class _Wire(msgspec.Struct, rename="camel", frozen=True, kw_only=True, omit_defaults=True):
    """Base of every wire struct: camelCase names, keyword construction, immutable."""


# --- metadata --------------------------------------------------------------------------------------------
class OwnerReference(_Wire, frozen=True, kw_only=True):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ObjectMeta(_Wire, frozen=True, kw_only=True):
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int = 0
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    owner_references: list[OwnerReference] = msgspec.field(default_factory=list)


class _Object(_Wire, frozen=True, kw_only=True):
    """What an object of every kind starts with: Kubernetes' TypeMeta and ObjectMeta. A kind names itself
    (`KIND`, `RESOURCE`) and declares its own apiVersion and kind defaults, spec and status."""

    KIND: ClassVar[str]
    """The kind's name in errors ("Pod"); `decode` takes it, and lower-cased."""
    RESOURCE: ClassVar[str]
    """The kind's resource name ("pods"), which `decode` takes too."""
    api_version: str = ""
    kind: str = ""
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


# --- pods ------------------------------------------------------------------------------------------------
class ResourceRequirements(_Wire, frozen=True, kw_only=True):
    requests: ResourceList = msgspec.field(default_factory=dict)
    limits: ResourceList = msgspec.field(default_factory=dict)


class ConfigMapKeySelector(_Wire, frozen=True, kw_only=True):
    name: str = ""
    key: str = ""
    optional: bool | None = None


class EnvVarSource(_Wire, frozen=True, kw_only=True):
    config_map_key_ref: ConfigMapKeySelector | None = None


class EnvVar(_Wire, frozen=True, kw_only=True):
    name: str
    value: str | None = None
    value_from: EnvVarSource | None = None


class ConfigMapEnvSource(_Wire, frozen=True, kw_only=True):
    name: str = ""
    optional: bool | None = None


class EnvFromSource(_Wire, frozen=True, kw_only=True):
    config_map_ref: ConfigMapEnvSource | None = None


class ContainerPort(_Wire, frozen=True, kw_only=True):
    """A container port; only one with a ``hostPort`` binds a port on the node (kube-scheduler's NodePorts)."""

    name: str = ""
    container_port: int = 0
    host_port: int = 0
    protocol: str = "TCP"
    host_ip: str = msgspec.field(default="", name="hostIP")


class Container(_Wire, frozen=True, kw_only=True):
    name: str = ""
    resources: ResourceRequirements = msgspec.field(default_factory=ResourceRequirements)
    restart_policy: str | None = None
    env: list[EnvVar] = msgspec.field(default_factory=list)
    env_from: list[EnvFromSource] = msgspec.field(default_factory=list)
    ports: list[ContainerPort] = msgspec.field(default_factory=list)


class PersistentVolumeClaimVolumeSource(_Wire, frozen=True, kw_only=True):
    claim_name: str = ""
    read_only: bool = False


class Volume(_Wire, frozen=True, kw_only=True):
    """A pod volume: its name (Kairos adds the GPU-sharing ConfigMap's) and the claim it uses, if any
    (`shared.kube.volumes.claims_of`; an ephemeral volume's claim is generated, its template not read), or
    the in-tree disk that CSI migration counts against a node's attach limit (`shared.kube.volumes.inline_of`)."""

    name: str = ""
    persistent_volume_claim: PersistentVolumeClaimVolumeSource | None = None
    ephemeral: dict[str, Any] | None = None
    aws_elastic_block_store: dict[str, Any] | None = None
    gce_persistent_disk: dict[str, Any] | None = None
    azure_disk: dict[str, Any] | None = None
    cinder: dict[str, Any] | None = None
    portworx_volume: dict[str, Any] | None = None


class NodeSelectorRequirement(_Wire, frozen=True, kw_only=True):
    key: str
    operator: str
    values: list[str] = msgspec.field(default_factory=list)


class NodeSelectorTerm(_Wire, frozen=True, kw_only=True):
    match_expressions: list[NodeSelectorRequirement] = msgspec.field(default_factory=list)
    match_fields: list[NodeSelectorRequirement] = msgspec.field(default_factory=list)


class NodeSelector(_Wire, frozen=True, kw_only=True):
    node_selector_terms: list[NodeSelectorTerm] = msgspec.field(default_factory=list)


class PreferredSchedulingTerm(_Wire, frozen=True, kw_only=True):
    weight: int = 0
    preference: NodeSelectorTerm = msgspec.field(default_factory=NodeSelectorTerm)


class NodeAffinity(_Wire, frozen=True, kw_only=True):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = msgspec.field(
        default_factory=list
    )


class LabelSelectorRequirement(_Wire, frozen=True, kw_only=True):
    key: str
    operator: str
    values: list[str] = msgspec.field(default_factory=list)


class LabelSelector(_Wire, frozen=True, kw_only=True):
    match_labels: dict[str, str] = msgspec.field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = msgspec.field(default_factory=list)


class PodAffinityTerm(_Wire, frozen=True, kw_only=True):
    label_selector: LabelSelector | None = None
    topology_key: str = ""
    namespaces: list[str] = msgspec.field(default_factory=list)
    namespace_selector: LabelSelector | None = None
    match_label_keys: list[str] = msgspec.field(default_factory=list)
    mismatch_label_keys: list[str] = msgspec.field(default_factory=list)


class WeightedPodAffinityTerm(_Wire, frozen=True, kw_only=True):
    weight: int = 0
    pod_affinity_term: PodAffinityTerm = msgspec.field(default_factory=PodAffinityTerm)


class PodAffinity(_Wire, frozen=True, kw_only=True):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = msgspec.field(
        default_factory=list
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = msgspec.field(
        default_factory=list
    )


class Affinity(_Wire, frozen=True, kw_only=True):
    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class Toleration(_Wire, frozen=True, kw_only=True):
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


class TopologySpreadConstraint(_Wire, frozen=True, kw_only=True):
    """One ``spec.topologySpreadConstraints`` entry. Every field may be missing here so that
    `shared.kube.translate.pod_of` can name the one at fault (``maxSkew`` and ``topologyKey`` are
    required by the API server; ``None`` is kube-scheduler's default for the optional ones)."""

    max_skew: int | None = None
    topology_key: str = ""
    when_unsatisfiable: str = ""
    label_selector: LabelSelector | None = None
    min_domains: int | None = None
    node_affinity_policy: str | None = None
    node_taints_policy: str | None = None
    match_label_keys: list[str] = msgspec.field(default_factory=list)


class PodSchedulingGate(_Wire, frozen=True, kw_only=True):
    name: str


class PodResourceClaim(_Wire, frozen=True, kw_only=True):
    """One entry of ``spec.resourceClaims`` (DRA; `shared.kube.dra.pod_claims_of`)."""

    name: str = ""
    resource_claim_name: str | None = None
    resource_claim_template_name: str | None = None


class PodResourceClaimStatus(_Wire, frozen=True, kw_only=True):
    """The claim the resourceclaim controller made for a template entry of ``spec.resourceClaims``."""

    name: str = ""
    resource_claim_name: str | None = None


class PodSpec(_Wire, frozen=True, kw_only=True):
    containers: list[Container] = msgspec.field(default_factory=list)
    init_containers: list[Container] = msgspec.field(default_factory=list)
    overhead: ResourceList = msgspec.field(default_factory=dict)
    node_name: str = ""
    scheduler_name: str = ""
    node_selector: dict[str, str] = msgspec.field(default_factory=dict)
    affinity: Affinity | None = None
    tolerations: list[Toleration] = msgspec.field(default_factory=list)
    topology_spread_constraints: list[TopologySpreadConstraint] = msgspec.field(default_factory=list)
    priority_class_name: str = ""
    priority: int | None = None
    scheduling_gates: list[PodSchedulingGate] = msgspec.field(default_factory=list)
    volumes: list[Volume] = msgspec.field(default_factory=list)
    resource_claims: list[PodResourceClaim] = msgspec.field(default_factory=list)
    workload_ref: Any = None
    """Kubernetes 1.35's ``spec.workloadRef`` (the Workload API, alpha) as the API returns it; the
    pod-grouper reads and checks it (`services.state.controllers.grouping.workload`)."""


class Condition(_Wire, frozen=True, kw_only=True):
    type: str
    status: str = ""
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class ContainerStatus(_Wire, frozen=True, kw_only=True):
    name: str = ""
    ready: bool = False
    restart_count: int = 0


class PodStatus(_Wire, frozen=True, kw_only=True):
    phase: str = ""
    conditions: list[Condition] = msgspec.field(default_factory=list)
    container_statuses: list[ContainerStatus] = msgspec.field(default_factory=list)
    resource_claim_statuses: list[PodResourceClaimStatus] = msgspec.field(default_factory=list)


FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases after which a pod runs no more and holds nothing on its node."""


class Pod(_Object, frozen=True, kw_only=True):
    KIND = "Pod"
    RESOURCE = "pods"
    api_version: str = "v1"
    kind: str = "Pod"
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


# --- nodes -----------------------------------------------------------------------------------------------
class Taint(_Wire, frozen=True, kw_only=True):
    key: str
    value: str = ""
    effect: str = ""


class NodeSpec(_Wire, frozen=True, kw_only=True):
    unschedulable: bool = False
    taints: list[Taint] = msgspec.field(default_factory=list)


class NodeStatus(_Wire, frozen=True, kw_only=True):
    allocatable: ResourceList = msgspec.field(default_factory=dict)
    capacity: ResourceList = msgspec.field(default_factory=dict)
    conditions: list[Condition] = msgspec.field(default_factory=list)


class Node(_Object, frozen=True, kw_only=True):
    KIND = "Node"
    RESOURCE = "nodes"
    api_version: str = "v1"
    kind: str = "Node"
    spec: NodeSpec = msgspec.field(default_factory=NodeSpec)
    status: NodeStatus = msgspec.field(default_factory=NodeStatus)


# --- namespaces ------------------------------------------------------------------------------------------
class Namespace(_Object, frozen=True, kw_only=True):
    """A namespace: only its name and labels are read (a pod affinity term's namespace selector)."""

    KIND = "Namespace"
    RESOURCE = "namespaces"
    api_version: str = "v1"
    kind: str = "Namespace"


# --- priority classes ------------------------------------------------------------------------------------
class PriorityClass(_Object, frozen=True, kw_only=True):
    KIND = "PriorityClass"
    RESOURCE = "priorityclasses"
    api_version: str = "scheduling.k8s.io/v1"
    kind: str = "PriorityClass"
    value: int = 0
    global_default: bool = False
    preemption_policy: str = ""


# --- queues (scheduling.run.ai/v2) -------------------------------------------------------------------------
class QueueResource(_Wire, frozen=True, kw_only=True):
    """Go's zero values are the defaults: an unset limit is 0, not unlimited (KAI reads it the same way)."""

    quota: float = 0.0
    over_quota_weight: float = 0.0
    limit: float = 0.0


class QueueResources(_Wire, frozen=True, kw_only=True):
    gpu: QueueResource = msgspec.field(default_factory=QueueResource)
    cpu: QueueResource = msgspec.field(default_factory=QueueResource)
    memory: QueueResource = msgspec.field(default_factory=QueueResource)


class QueueSpec(_Wire, frozen=True, kw_only=True):
    display_name: str = ""
    parent_queue: str = ""
    resources: QueueResources | None = None
    priority: int | None = None
    preempt_min_runtime: str | None = None
    reclaim_min_runtime: str | None = None


class QueueStatus(_Wire, frozen=True, kw_only=True):
    allocated: ResourceList = msgspec.field(default_factory=dict)
    allocated_non_preemptible: ResourceList = msgspec.field(default_factory=dict)
    requested: ResourceList = msgspec.field(default_factory=dict)
    child_queues: list[str] = msgspec.field(default_factory=list)
    conditions: list[Condition] = msgspec.field(default_factory=list)
    """Kairos's ``Accepted`` condition (`services.state.mirror.problems`); the CRD's status keeps unknown fields."""


class Queue(_Object, frozen=True, kw_only=True):
    KIND = "Queue"
    RESOURCE = "queues"
    api_version: str = "scheduling.run.ai/v2"
    kind: str = "Queue"
    spec: QueueSpec = msgspec.field(default_factory=QueueSpec)
    status: QueueStatus = msgspec.field(default_factory=QueueStatus)


# --- podgroups (scheduling.run.ai/v2alpha2) ----------------------------------------------------------------
class TopologyConstraint(_Wire, frozen=True, kw_only=True):
    topology: str = ""
    required_topology_level: str = ""
    preferred_topology_level: str = ""


class SubGroup(_Wire, frozen=True, kw_only=True):
    name: str
    min_member: int | None = None
    min_sub_group: int | None = None
    parent: str | None = None
    topology_constraint: TopologyConstraint | None = None


class PodGroupSpec(_Wire, frozen=True, kw_only=True):
    min_member: int | None = None
    min_sub_group: int | None = None
    queue: str = ""
    priority_class_name: str = ""
    preemptibility: Literal["", "preemptible", "non-preemptible"] = ""
    topology_constraint: TopologyConstraint | None = None
    sub_groups: list[SubGroup] = msgspec.field(default_factory=list)
    mark_unschedulable: bool | None = None
    scheduling_backoff: int | None = None
    staleness_grace_period: str | None = None
    preemption_delay: str | None = None


class UnschedulableExplanation(_Wire, frozen=True, kw_only=True):
    reason: str = ""
    message: str = ""
    details: dict[str, Any] | None = None


class SchedulingCondition(_Wire, frozen=True, kw_only=True):
    type: str = ""
    node_pool: str = ""
    reason: str = ""
    message: str = ""
    reasons: list[UnschedulableExplanation] = msgspec.field(default_factory=list)
    last_transition_time: str | None = None
    status: str = ""
    transition_id: str = msgspec.field(default="", name="transitionID")


class PodGroupCondition(_Wire, frozen=True, kw_only=True):
    type: str = ""
    status: str = ""
    transition_id: str = msgspec.field(default="", name="transitionID")
    last_transition_time: str | None = None
    reason: str = ""
    message: str = ""


class PodGroupResourcesStatus(_Wire, frozen=True, kw_only=True):
    allocated: ResourceList = msgspec.field(default_factory=dict)
    allocated_non_preemptible: ResourceList = msgspec.field(default_factory=dict)
    requested: ResourceList = msgspec.field(default_factory=dict)


class PodGroupStatus(_Wire, frozen=True, kw_only=True):
    phase: str = ""
    conditions: list[PodGroupCondition] = msgspec.field(default_factory=list)
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    pending: int = 0
    scheduling_conditions: list[SchedulingCondition] = msgspec.field(default_factory=list)
    resources_status: PodGroupResourcesStatus = msgspec.field(default_factory=PodGroupResourcesStatus)


class PodGroup(_Object, frozen=True, kw_only=True):
    KIND = "PodGroup"
    RESOURCE = "podgroups"
    api_version: str = "scheduling.run.ai/v2alpha2"
    kind: str = "PodGroup"
    spec: PodGroupSpec = msgspec.field(default_factory=PodGroupSpec)
    status: PodGroupStatus = msgspec.field(default_factory=PodGroupStatus)


# --- topologies (kai.scheduler/v1alpha1) -------------------------------------------------------------------
class TopologyLevel(_Wire, frozen=True, kw_only=True):
    node_label: str
    alias: str = ""
    """A name constraints may use for the level instead of its node label (KAI v0.17)."""


class TopologySpec(_Wire, frozen=True, kw_only=True):
    levels: list[TopologyLevel] = msgspec.field(default_factory=list)


class Topology(_Object, frozen=True, kw_only=True):
    KIND = "Topology"
    RESOURCE = "topologies"
    api_version: str = "kai.scheduler/v1alpha1"
    kind: str = "Topology"
    spec: TopologySpec = msgspec.field(default_factory=TopologySpec)


# --- scheduling shards (kai.scheduler/v1) -----------------------------------------------------------------
class _ShardConfig(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the SchedulingShard's spec structs: hand-written configuration, so unknown fields are errors."""


class PlacementStrategy(_ShardConfig, frozen=True, kw_only=True):
    """ "binpack" or "spread" for each resource; unset is binpack (checked by `shared.kube.scheduling_shard`)."""

    gpu: str | None = None
    cpu: str | None = None


class MinRuntime(_ShardConfig, frozen=True, kw_only=True):
    """Go duration strings ("5m", "1h30m")."""

    preempt_min_runtime: str | None = None
    reclaim_min_runtime: str | None = None


class UsageParams(_ShardConfig, frozen=True, kw_only=True):
    """How usage is aggregated for time-based fair share; durations are Go duration strings."""

    half_life_period: str | None = None
    window_size: str | None = None
    window_type: str | None = None
    tumbling_window_start_time: str | None = None
    cron_string: str = ""
    fetch_interval: str | None = None
    staleness_period: str | None = None
    wait_timeout: str | None = None
    extra_params: dict[str, str] = msgspec.field(default_factory=dict)


class UsageDBConfig(_ShardConfig, frozen=True, kw_only=True):
    client_type: str = ""
    connection_string: str = ""
    connection_string_env_var: str = ""
    usage_params: UsageParams | None = None


class PluginConfig(_ShardConfig, frozen=True, kw_only=True):
    """An override of one plugin: unset fields keep the default; `arguments` replaces the default ones."""

    enabled: bool | None = None
    priority: int | None = None
    arguments: dict[str, str] | None = None


class ActionConfig(_ShardConfig, frozen=True, kw_only=True):
    enabled: bool | None = None
    priority: int | None = None


class ScenarioSearchBudgets(_ShardConfig, frozen=True, kw_only=True):
    """KAI v0.16's time budgets of the victim search (alpha in KAI); Go duration strings, by action or
    scenario generator name (``default`` for the rest)."""

    max_action_search_duration: dict[str, str] = msgspec.field(default_factory=dict)
    max_job_search_duration: str | None = None
    min_job_search_duration: str | None = None
    max_generator_search_duration: dict[str, str] = msgspec.field(default_factory=dict)


class SchedulingShardSpec(_ShardConfig, frozen=True, kw_only=True):
    args: dict[str, str] = msgspec.field(default_factory=dict)
    placement_strategy: PlacementStrategy | None = None
    partition_label_value: str = ""
    queue_depth_per_action: dict[str, int] = msgspec.field(default_factory=dict)
    min_runtime: MinRuntime | None = None
    k_value: float | None = None
    usage_db_config: UsageDBConfig | None = msgspec.field(default=None, name="usageDBConfig")
    plugins: dict[str, PluginConfig] = msgspec.field(default_factory=dict)
    actions: dict[str, ActionConfig] = msgspec.field(default_factory=dict)
    scenario_search_budgets: ScenarioSearchBudgets | None = None
    go_mem_limit_ratio: float | None = None
    go_mem_limit: str | int | float | None = None
    """A Kubernetes quantity (``2Gi``)."""


class SchedulingShardStatus(_Wire, frozen=True, kw_only=True):
    conditions: list[Condition] = msgspec.field(default_factory=list)


class SchedulingShard(_Object, frozen=True, kw_only=True):
    """One scheduling shard's configuration (cluster-scoped); `shared.kube.scheduling_shard` reads it."""

    KIND = "SchedulingShard"
    RESOURCE = "schedulingshards"
    api_version: str = "kai.scheduler/v1"
    kind: str = "SchedulingShard"
    spec: SchedulingShardSpec = msgspec.field(default_factory=SchedulingShardSpec)
    status: SchedulingShardStatus = msgspec.field(default_factory=SchedulingShardStatus)


# --- workload owners (any kind) ----------------------------------------------------------------------------
class Owner(_Object, frozen=True, kw_only=True):
    """A pod's owner of any kind (Job, Deployment, PyTorchJob, ...): what the pod-grouper reads of it."""

    KIND = "owner"
    RESOURCE = "owners"
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    status: dict[str, Any] = msgspec.field(default_factory=dict)


class JobStatus(_Wire, frozen=True, kw_only=True):
    conditions: list[Condition] = msgspec.field(default_factory=list)
    active: int = 0
    succeeded: int = 0
    failed: int = 0


class Job(_Object, frozen=True, kw_only=True):
    """A batch/v1 Job as far as stages with dependencies care: has it completed, has it failed."""

    KIND = "Job"
    RESOURCE = "jobs"
    api_version: str = "batch/v1"
    kind: str = "Job"
    status: JobStatus = msgspec.field(default_factory=JobStatus)


# --- decoding --------------------------------------------------------------------------------------------
T = TypeVar("T", bound=_Object)

_TYPES: tuple[type[_Object], ...] = (
    Pod,
    Node,
    PriorityClass,
    Queue,
    PodGroup,
    Topology,
    SchedulingShard,
    Owner,
    Job,
    Namespace,
)
_BY_NAME: dict[str, type[_Object]] = {
    name: cls for cls in _TYPES for name in (cls.KIND, cls.KIND.lower(), cls.RESOURCE)
}
_DECODERS: dict[type[_Object], msgspec.json.Decoder[Any]] = {cls: msgspec.json.Decoder(cls) for cls in _TYPES}


class _NameMeta(msgspec.Struct):
    name: object = ""
    namespace: object = ""


class _Named(msgspec.Struct):
    metadata: _NameMeta | None = None


_NAME_DECODER = msgspec.json.Decoder(_Named)
_PATH = re.compile(r"^(?P<problem>.*) - at `\$(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN_FIELD = re.compile(r"^Object contains unknown field `(?P<field>[^`]*)`$")


def _type_of(kind: str | type[Any]) -> type[_Object]:
    if isinstance(kind, type) and kind in _DECODERS:
        return kind
    if isinstance(kind, type):
        raise InvalidObject("kind", kind.__name__, "", "not a wire type")
    cls = _BY_NAME.get(kind)
    if cls is None:
        raise InvalidObject("kind", kind, "", f"not a kind Kairos decodes (one of {sorted(_BY_NAME)})")
    return cls


def object_name(namespace: object, name: object) -> str:
    """How errors and logs name an object: "namespace/name", or just the name when cluster-scoped."""
    ns = namespace if isinstance(namespace, str) else ""
    nm = name if isinstance(name, str) else ""
    return f"{ns}/{nm}" if ns else nm


def _name_in_bytes(data: bytes | str) -> str:
    try:
        named = _NAME_DECODER.decode(data)
    except msgspec.MsgspecError:
        return ""
    meta = named.metadata
    return object_name(meta.namespace, meta.name) if meta is not None else ""


def _name_in_mapping(obj: object) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if not isinstance(meta, Mapping):
        return ""
    return object_name(meta.get("namespace"), meta.get("name"))


def _invalid(cls: type[_Object], name: str, exc: msgspec.MsgspecError) -> InvalidObject:
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        match = _PATH.match(text)
        if match is not None:
            path, problem = match["path"].lstrip("."), match["problem"]
            unknown = _UNKNOWN_FIELD.match(problem)
            if unknown is not None:  # name the field itself, as a user would look for it
                path = f"{path}.{unknown['field']}" if path else unknown["field"]
                problem = "unknown field"
            return InvalidObject(cls.KIND, name, path, problem)
        return InvalidObject(cls.KIND, name, "", text)
    return InvalidObject(cls.KIND, name, "", f"not a valid JSON document: {text}")


@overload
def decode(kind: type[T], data: bytes | str) -> T: ...
@overload
def decode(kind: str, data: bytes | str) -> Any: ...
def decode(kind: str | type[Any], data: bytes | str) -> Any:
    """Decode one object's JSON. `kind` is a wire type or a name: "Pod", "pod" or "pods" (and so on)."""
    cls = _type_of(kind)
    try:
        return _DECODERS[cls].decode(data)
    except msgspec.MsgspecError as exc:
        raise _invalid(cls, _name_in_bytes(data), exc) from exc


@overload
def convert(kind: type[T], obj: Mapping[str, Any]) -> T: ...
@overload
def convert(kind: str, obj: Mapping[str, Any]) -> Any: ...
def convert(kind: str | type[Any], obj: Mapping[str, Any]) -> Any:
    """Convert an already-parsed object (a dict from YAML or a JSON library) like `decode`."""
    cls = _type_of(kind)
    try:
        return msgspec.convert(obj, type=cls)
    except msgspec.MsgspecError as exc:
        raise _invalid(cls, _name_in_mapping(obj), exc) from exc


def _decoder_of(cls: type[T]) -> Callable[[bytes | str], T]:
    def decode_one(data: bytes | str) -> T:
        return decode(cls, data)

    return decode_one


decode_pod = _decoder_of(Pod)
decode_node = _decoder_of(Node)
decode_namespace = _decoder_of(Namespace)
decode_priority_class = _decoder_of(PriorityClass)
decode_queue = _decoder_of(Queue)
decode_podgroup = _decoder_of(PodGroup)
decode_topology = _decoder_of(Topology)
decode_scheduling_shard = _decoder_of(SchedulingShard)
decode_owner = _decoder_of(Owner)
