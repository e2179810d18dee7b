"""The pod-grouper's decision: which PodGroup a new pod belongs to, as KAI v0.17's pod-grouper decides it; pure.

Called by the state service's pod-grouper loop (`services.state.controllers.podgrouper`), which walks a pod's owners with
`owner_refs_to_follow` (fetching each owner), asks `group_pod` for the PodGroup manifest and the pod patch,
creates the PodGroup (or, when it exists, applies `podgroup_update`) and then patches the pod. No I/O here:
everything the decision reads is an argument, and a plugin that reads more of the cluster (a RayJob's
RayCluster, a Knative Revision, an MPIJob's launcher pods, an existing PodGroup) asks for it through its
`Ctx` (`ReadsNeeded`), which the loop answers. The webhook (`services.state.webhook.webhook`) follows owners with
`owner_refs_to_follow` too, to read the annotations up the chain.

KAI's rules (``pkg/podgrouper``): the top owner's kind picks a plugin (a table keyed by group, version and
kind, a version of ``*`` matching any); every plugin starts from the default one: PodGroup
``pg-<top owner>-<uid>`` owned by the top owner, labels and annotations inherited from it, queue from the
``kai.scheduler/queue`` label of the top owner or the pod (else the ``project`` label, else
``default-queue``), priority class from a ``priorityClassName`` label or the pod's ``spec.priorityClassName``
when that PriorityClass exists (else the per-kind defaults ConfigMap's, else the kind's default),
preemptibility from a ``kai.scheduler/preemptibility`` label (else the ConfigMap's), topology from the top
owner's ``kai.scheduler/topology*`` annotations, the preemption delay and staleness grace period from the
annotations, min member 1. A pod (or any owner of it) with ``kai.scheduler/skip-podgrouper: "true"`` and a
pod that names its PodGroup are left alone; a pod naming an upstream Workload (``spec.workloadRef``) is
grouped by it over its kind's decision; a kind no plugin claims is grouped by the Karta describing it, else
by the default plugin.

One module per concept, as KAI has one plugin per kind:

- `model`: the settings (`GrouperConfig`), the owner to fetch (`OwnerRef`), the reads (`ObjectRead`,
  `PodsRead`, `ReadsNeeded`), the decision (`Grouping`) and the metadata every plugin fills (KAI
  ``podgroup.Metadata``).
- `fields`: reading an owner's spec, with errors naming the field; `chain`: following and checking owners.
- `default`: KAI's default plugin, which every other plugin starts from; `kind_defaults`: the per-kind
  defaults ConfigMap.
- one module per kind's plugin, each claiming its kinds in ``KINDS``: `podjob` (Pods, and `spark` for
  Spark pods), `deployment`, `statefulset`, `job` (batch Job, with `minmember`), `cronjob`, `jobset`,
  `kubeflow` (the distributed rule) with `pytorch`, `tensorflow`, `xgboost`, `jax`, `mpi`, and `notebook`;
  `ray` (RayCluster, RayJob, RayService), `leaderworkerset`, `knative`, `grove` (PodCliqueSet,
  PodGangSet), `aml`, `spotrequest`, `runaijob`; `skip` (skipped top owners: Argo Workflows, TrainJobs,
  Run:ai's workload kinds, DynamoGraphDeployments); `karta` and `karta_paths` (the fallback grouper);
  `workload` (the Workload API layer).
- `registry`: every module's ``KINDS``, merged (a kind claimed twice fails at import).
- `manifest`: the PodGroup manifest and the pod patch; `decision`: `group_pod`; `update`: `podgroup_update`.
"""

from services.state.controllers.grouping.chain import owner_refs_to_follow
from services.state.controllers.grouping.decision import group_pod
from services.state.controllers.grouping.default import top_owner_metadata
from services.state.controllers.grouping.model import GrouperConfig, Grouping, OwnerRef
from services.state.controllers.grouping.update import podgroup_update

__all__ = [
    "GrouperConfig",
    "Grouping",
    "OwnerRef",
    "group_pod",
    "owner_refs_to_follow",
    "podgroup_update",
    "top_owner_metadata",
]
