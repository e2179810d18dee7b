"""kube-controller-manager's ephemeral volume controller in the simulated cluster: a pod's generic ephemeral
volume (``spec.volumes[].ephemeral.volumeClaimTemplate``) gets its PersistentVolumeClaim.

For each such volume of a pod not being deleted and not finished, the claim ``<pod>-<volume>`` is created
in the pod's namespace from the template (its metadata's labels and annotations, its spec), owned by the
pod as its controller (``ownerReferences`` with the pod's uid, ``controller: true`` and
``blockOwnerDeletion: true``), so the scheduler and the kubelet take it for the pod's
(`shared.kube.volumes`: a claim of that name the pod does not own is not the pod's) and the garbage
collector deletes it with the pod. A claim of that name that exists already is left as it is, owned by
the pod or not: the real controller does the same, and the scheduler then says the pod is not its owner.
The claim is created through the API's create path (`Cluster.create`), so the DefaultStorageClass
admission gives a template that names no class the default one.

Incremental, as the other controllers here: the pods store's listener queues a pod that has ephemeral
volumes when it is added or changes, and `run_once` (from `tools.kubesim.controllers.Controllers`) creates
the claims of the queued pods. A creation the API refuses is tried again at the pod's next change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.kubesim.errors import ApiError
from tools.kubesim.objects import clone, controller_ref
from tools.kubesim.store import Change, Key

if TYPE_CHECKING:
    from tools.kubesim.cluster import Cluster

__all__ = ["EphemeralVolumes", "ephemeral_templates"]

Obj = dict[str, Any]
PODS = "pods"
CLAIMS = "persistentvolumeclaims"
_FINISHED = frozenset({"Succeeded", "Failed"})


def ephemeral_templates(pod: Obj) -> list[tuple[str, Obj]]:
    """(claim name, volume claim template) of each generic ephemeral volume of the pod."""
    out: list[tuple[str, Obj]] = []
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        if not isinstance(volume, dict):
            continue
        ephemeral = volume.get("ephemeral")
        template = ephemeral.get("volumeClaimTemplate") if isinstance(ephemeral, dict) else None
        if isinstance(template, dict) and volume.get("name"):
            out.append((f"{pod['metadata']['name']}-{volume['name']}", template))
    return out


class EphemeralVolumes:
    """Creates the claims of pods' generic ephemeral volumes (see the module's docstring)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.queue: dict[Key, None] = {}
        """Pods whose claims to create at the next `run_once`."""
        pods = cluster.store.storage(PODS)
        pods.listeners.append(self._pod_changed)
        for pod in pods.iter():
            self._consider(pod)

    def _pod_changed(self, change: Change) -> None:
        if change.type != "DELETED":
            self._consider(change.obj)

    def _consider(self, pod: Obj) -> None:
        md = pod["metadata"]
        if md.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in _FINISHED:
            return
        if ephemeral_templates(pod):
            self.queue[md.get("namespace", ""), md["name"]] = None

    def run_once(self) -> bool:
        """Create the missing claims of the queued pods; True when one was created."""
        if not self.queue:
            return False
        batch, self.queue = self.queue, {}
        store = self.cluster.store
        created = False
        for namespace, name in batch:
            pod = store.storage(PODS).get(namespace, name)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                continue
            for claim_name, template in ephemeral_templates(pod):
                if store.storage(CLAIMS).get(namespace, claim_name) is not None:
                    continue
                try:
                    self.cluster.create(
                        self.cluster.type_of(CLAIMS), namespace, self._claim(pod, claim_name, template)
                    )
                except ApiError:
                    continue  # an invalid template: tried again when the pod changes
                created = True
        return created

    @staticmethod
    def _claim(pod: Obj, name: str, template: Obj) -> Obj:
        md = pod["metadata"]
        template_md = template.get("metadata") or {}
        metadata: Obj = {
            "name": name,
            "namespace": md.get("namespace", ""),
            "ownerReferences": [controller_ref(pod)],
        }
        for field in ("labels", "annotations"):
            if template_md.get(field):
                metadata[field] = clone(template_md[field])
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": metadata,
            "spec": clone(template.get("spec") or {}),
        }
