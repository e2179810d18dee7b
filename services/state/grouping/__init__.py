"""The pod-grouper's decision: which PodGroup a new pod belongs to, as KAI's pod-grouper decides it; pure.

Called by the state service's pod-grouper loop (`services.state.podgrouper`), which walks a pod's owners with
`owner_refs_to_follow` (fetching each owner), asks `group_pod` for the PodGroup manifest and the pod patch,
creates the PodGroup (or, when it exists, applies `podgroup_update`) and then patches the pod. No I/O here:
everything the decision reads is an argument. The webhook (`services.state.webhook`) follows owners with
`owner_refs_to_follow` too, to read the annotations up the chain.

KAI's rules (``pkg/podgrouper``): the top owner's kind picks a plugin (a table keyed by group, version and
kind); every plugin starts from the default one: PodGroup ``pg-<top owner>-<uid>`` owned by the top owner,
labels and annotations inherited from it, queue from the ``kai.scheduler/queue`` label of the top owner or
the pod (else the ``project`` label, else ``default-queue``), priority class from a ``priorityClassName``
label or the pod's ``spec.priorityClassName`` when that PriorityClass exists (else the kind's default:
``train``, ``inference`` for Deployments), preemptibility from a ``kai.scheduler/preemptibility`` label,
topology from the top owner's ``kai.scheduler/topology*`` annotations, min member 1. Kinds handled beyond
that: Pod, Deployment (one PodGroup per pod), batch Job (``kai.scheduler/batch-min-member``), CronJob,
JobSet, PyTorchJob (master/worker sub-groups, segments), MPIJob, RayCluster (head and worker-group
sub-groups), and Argo Workflows and Kubeflow TrainJobs, which are skipped for the owner below them.
StatefulSet and ReplicaSet use the default plugin, as in KAI, and so does any other kind.

One module per concept, as KAI has one plugin per kind:

- `model`: the settings (`GrouperConfig`), the owner to fetch (`OwnerRef`), the decision (`Grouping`) and
  the metadata every plugin fills (KAI ``podgroup.Metadata``).
- `fields`: reading an owner's spec, with errors naming the field; `chain`: following and checking owners.
- `default`: KAI's default plugin, which every other plugin starts from.
- one module per kind's plugin: `deployment`, `job` (batch Job), `cronjob`, `kubeflow` (the distributed
  rule `pytorch` and `mpi` start from), `pytorch`, `mpi`, `jobset`, `ray`, `skip` (skipped top owners).
- `registry`: the table from (group, version, kind) to plugin, the one place a kind is wired in.
- `manifest`: the PodGroup manifest and the pod patch; `decision`: `group_pod`; `update`: `podgroup_update`.

Not done (KAI reads more cluster state for these): the per-kind defaults ConfigMap, legacy per-pod Job
PodGroups, RayJob/RayService (they need the RayCluster object), Knative, LeaderWorkerSet, Grove, Spark,
and the TF/XGBoost/JAX jobs, which fall back to the default plugin.
"""

from services.state.grouping.chain import owner_refs_to_follow
from services.state.grouping.decision import group_pod
from services.state.grouping.default import top_owner_metadata
from services.state.grouping.model import GrouperConfig, Grouping, OwnerRef
from services.state.grouping.update import podgroup_update

__all__ = [
    "GrouperConfig",
    "Grouping",
    "OwnerRef",
    "group_pod",
    "owner_refs_to_follow",
    "podgroup_update",
    "top_owner_metadata",
]
