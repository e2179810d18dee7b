"""Node filters beyond resource fit: KAI's predicates plugin, each returning a reason or None.

Order matters only for which reason a pending pod reports: queue capacity on the node, GPU resource type
(MIG/fraction compatibility), GPU memory synced, healthy GPU devices (live telemetry: a node with an
unhealthy device has that many fewer GPUs, and no shared pod joins a device reported unhealthy), pod slots
(with a reservation pod for a new shared device), then the Kubernetes filters (node selector and affinity,
taints, host ports (kube-scheduler's NodePorts), the pod's persistent volume claims
(`shared.core.volumes`: kube-scheduler's volume filters), its DRA claims (`shared.core.dra`: kube-scheduler's
DynamicResources), inter-pod affinity and anti-affinity:
`shared.core.pod_affinity`), in kube-scheduler's words, and last Kubernetes' pod topology spread
(`shared.core.spread`: a pod's DoNotSchedule constraints; a pod without any pays one tuple test).

Each refusal says whether evicting pods could change it (`shared.core.plugins.points.Code`), as
kube-scheduler's plugins do: node selector and affinity, taints, a node of the wrong GPU kind (MIG or not,
its MIG strategy), a pod asking for GPU memory on a node whose GPU memory is unknown are UNRESOLVABLE;
queue capacity on the node, unhealthy devices, pod slots, MIG beside legacy MIG pods and host ports are
UNSCHEDULABLE, unless the node's affinity or taints refuse the pod as well (kube-scheduler checks those
before resources, so its answer for such a node is UNRESOLVABLE; the reason shown stays KAI's first). The
volume, inter-pod affinity and spread filters give their own codes.

Private to the core: `check` is the predicates plugin's node filter (`shared.core.builtin_plugins`); the
allocation helper (`shared.core.allocation`) asks `fit_failure`, the session's node-filter chain, of every
node it tries, and the victim solver asks it where evicting pods might help; the victim solver's
node-affinity filter uses `node_affinity_matches`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core import pod_affinity, selectors, spread, volumes
from shared.core.cluster import EPS
from shared.core.fractional_gpus import preferable_gpus
from shared.core.plugins.points import Code, Refusal
from shared.core.scoring import fitting_gpus, measured, usable_whole_gpus
from shared.core.tasks import PODS, TaskState
from shared.model.objects import Taint
from shared.model.status import ACTIVE_USED, PodStatus

if TYPE_CHECKING:
    from shared.core.cluster import NodeState
    from shared.core.session import Session

NODE_POD_NUMBER_EXCEEDED = "node(s) pod number exceeded"
NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
TAINTS = "node(s) had untolerated taint"
UNHEALTHY_GPU_DEVICES = "node(s) had unhealthy GPU devices"
NODE_PORTS = "node(s) didn't have free ports for the requested pod ports"
"""kube-scheduler's NodePorts reason (``ErrReason``)."""


def fit_failure(ssn: Session, task: TaskState, node: NodeState) -> Refusal | None:
    """Why the task cannot go on this node, beyond releasing-or-idle resources; None when it can: the
    session's node filters in chain order, the first refusal wins (none at all without the predicates
    plugin). A filter's plain-string answer is read as UNSCHEDULABLE; a filter that raises refuses the node
    with `Code.ERROR`, naming itself (`shared.core.plugins.runtime.Runtime.filter`)."""
    return ssn.plugins.filter(ssn, task, node)


_UNRESOLVABLE_AFFINITY = Refusal(NODE_AFFINITY, Code.UNRESOLVABLE)
_PORTS = Refusal(NODE_PORTS)


def check(ssn: Session, task: TaskState, node: NodeState) -> Refusal | None:
    """KAI's predicates plugin: the filters above, in that order."""
    capacity = ssn.task_capacity_on_node(task, node)
    if not capacity.ok:
        return _resolvable(
            task,
            node,
            f"node does not have enough capacity. Reason: {capacity.reason}, Details: {capacity.message}",
        )
    reason = resource_type(task, node)
    if reason:
        return _resolvable(task, node, reason) if reason.startswith(_LEGACY_BESIDE) else _unresolvable(reason)
    if task.kind == "memory" and not node.node.gpu_memory_synced:
        return _unresolvable(
            "node is not a gpu node or the gpu memory count on the node was not synced yet, "
            f"task: <{task.job.namespace}/{task.name}>, node: <{node.name}>"
        )
    reason = healthy_devices(ssn, task, node) or max_pods(ssn, task, node)
    if reason:
        return _resolvable(task, node, reason)
    if not node_affinity_matches(task, node):
        return _UNRESOLVABLE_AFFINITY
    taint = untolerated_taint(task, node)
    if taint is not None:
        return _unresolvable(taint_reason(taint))
    if not ports_free(task, node):
        return _PORTS
    refusal = volumes.reason(ssn, task, node) or pod_affinity.reason(ssn, task, node)
    if refusal is not None:
        return refusal
    return spread.filter_reason(ssn, task, node, affinity=node_affinity_matches, tolerates=tolerated)


def _unresolvable(reason: str) -> Refusal:
    return Refusal(reason, Code.UNRESOLVABLE)


def _resolvable(task: TaskState, node: NodeState, reason: str) -> Refusal:
    """A refusal evicting pods might lift, unless the node's affinity or taints refuse the pod anyway."""
    if node_affinity_matches(task, node) and tolerated(task, node):
        return Refusal(reason)
    return Refusal(reason, Code.UNRESOLVABLE)


_LEGACY_BESIDE = "MIG job cannot be scheduled on node with legacy MIG jobs"
"""The one `resource_type` reason evicting pods can lift (the legacy MIG pods on the node)."""


def resource_type(task: TaskState, node: NodeState) -> str | None:
    """KAI `PredicateByNodeResourcesType`."""
    if task.pod.legacy_mig:
        return f"Legacy MIG jobs cannot be scheduled on node {node.name}"
    if task.is_cpu_only:
        return None
    mig_node = node.mig_enabled
    if not mig_node and task.kind == "mig":
        return "MIG job cannot be scheduled on non-MIG node"
    if mig_node:
        if task.kind == "mig" and node.legacy_mig_tasks:
            return f"{_LEGACY_BESIDE}: <{sorted(node.legacy_mig_tasks)}>"
        strategy = node.node.mig_strategy
        if strategy == "single" and task.kind != "regular":
            return "only whole gpu jobs can run on a node with MigStrategy='single'"
        if strategy == "mixed" and task.kind != "mig":
            return "non MIG jobs cant run on a node with MigStrategy='mixed'"
    return None


def healthy_devices(ssn: Session, task: TaskState, node: NodeState) -> str | None:
    """Whether the task still fits once the node's unhealthy devices are taken out (`Node.gpu_devices`);
    nodes nobody measures, CPU-only and MIG tasks pass."""
    if not node.node.gpu_devices or task.is_cpu_only or task.kind == "mig":
        return None
    seen = measured(node)
    if not seen.unhealthy_free and not seen.unhealthy_groups:
        return None
    if task.is_shared:
        return None if len(fitting_gpus(ssn, node, task)) >= task.gpu.devices else UNHEALTHY_GPU_DEVICES
    return None if usable_whole_gpus(node) + EPS >= task.whole_gpus else UNHEALTHY_GPU_DEVICES


def max_pods(ssn: Session, task: TaskState, node: NodeState) -> str | None:
    available = node.idle(PODS) + node.releasing(PODS)
    if not task.is_shared:
        return None if available > 0 else NODE_POD_NUMBER_EXCEEDED
    if not _needs_new_gpu_group(ssn, task, node):
        return None
    return None if available >= 2 else NODE_POD_NUMBER_EXCEEDED


def _needs_new_gpu_group(ssn: Session, task: TaskState, node: NodeState) -> bool:
    immediate = preferable_gpus(ssn, node, task, pipeline_only=False)
    if immediate is not None and not immediate.releasing:
        return any(g.startswith("new-") for g in immediate.groups)
    pipelined = preferable_gpus(ssn, node, task, pipeline_only=True)
    if pipelined is not None:
        return any(g.startswith("new-") for g in pipelined.groups)
    return True


def node_affinity_matches(task: TaskState, node: NodeState) -> bool:
    """The pod's nodeSelector and required node affinity hold on the node (`shared.core.selectors`)."""
    return selectors.node_affinity_matches(task.pod, node.labels)


def untolerated_taint(task: TaskState, node: NodeState) -> Taint | None:
    """The node's first NoSchedule or NoExecute taint none of the pod's tolerations tolerates, or None."""
    for taint in node.node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(selectors.tolerates(toleration, taint) for toleration in task.pod.tolerations):
            return taint
    return None


def tolerated(task: TaskState, node: NodeState) -> bool:
    """No NoSchedule or NoExecute taint of the node is left untolerated by the pod."""
    return untolerated_taint(task, node) is None


def taint_reason(taint: Taint) -> str:
    """kube-scheduler's TaintToleration reason, naming the taint."""
    return f"{TAINTS} {{{taint.key}: {taint.value}}}"


def ports_free(task: TaskState, node: NodeState) -> bool:
    """kube-scheduler's NodePorts filter: no active pod on the node (this session's own evictions excluded,
    as for pod affinity) nor a pod outside the snapshot (`Node.used_host_ports`) binds a host port that
    conflicts with one the task asks for. Only a task that asks for host ports scans the node's pods."""
    wanted = task.pod.host_ports
    if not wanted:
        return True
    for used in node.node.used_host_ports:
        if any(port.conflicts(used) for port in wanted):
            return False
    for entry in node.tasks.values():
        t = entry.task
        if t is task or not t.pod.host_ports or t.status not in ACTIVE_USED or t.node != node.name:
            continue
        if t.status == PodStatus.RELEASING and t.is_virtual:
            continue
        for used in t.pod.host_ports:
            if any(port.conflicts(used) for port in wanted):
                return False
    return True
