"""Kubeflow Notebooks in the simulated API server: their CRD, served from the start, and a simulated
notebook-controller that runs each Notebook as a StatefulSet of one pod, so that a Notebook written for
Kubeflow applies unchanged and its pod reaches KAI's notebook grouping (Notebook -> StatefulSet -> pod).

**CRD** (`NOTEBOOK_CRD`, created by `Cluster` at start through `OPERATOR`): ``notebooks.kubeflow.org``,
versions v1alpha1, v1beta1 (the stored one) and v1, namespaced, schema-less, with the status subresource.

**Controller** (`NotebookController`, started by `tools.kubesim.controllers.Controllers` through
`OPERATOR`), as Kubeflow's notebook-controller ``generateStatefulSet`` and ``generateService`` do:

- A StatefulSet ``<notebook>`` controlled by the Notebook (the owner reference says ``kubeflow.org/v1beta1``,
  the version of the controller's types, whatever version the Notebook was applied as), of 1 replica (0
  while the Notebook carries the culler's ``kubeflow-resource-stopped`` annotation), selector
  ``statefulset: <notebook>``. Its pod template: the labels ``statefulset`` and ``notebook-name`` and every
  label of the Notebook (its queue and priority labels reach the pod), the Notebook's annotations but those
  whose key mentions ``kubectl`` or ``notebook``, and ``spec.template.spec`` with the first container given
  the working directory ``/home/jovyan``, the port 8888 ``notebook-port`` when it declares none and
  ``NB_PREFIX=/notebook/<namespace>/<notebook>``, and ``fsGroup: 100`` when the pod has no security
  context. Replicas and template are brought back in line when they drift. kubesim's StatefulSet
  controller then makes the pod ``<notebook>-0``.
- A ClusterIP Service ``<notebook>`` (port 80 ``http-<notebook>`` to the container's first port, selector
  ``statefulset: <notebook>``), controlled by the Notebook.
- Status: ``readyReplicas`` (the StatefulSet's), ``containerState`` (that of the pod's container named like
  the Notebook) and ``conditions`` (Running, Waiting or Terminated, newest first, one per change).
- A malformed spec (``spec.template.spec`` not an object, ``containers`` not a non-empty list of objects),
  which the real API server's schema refuses, creates nothing and records a Warning Event
  ``NotebookFailedValidation`` naming the field; kubesim has no CRD schema.

Not simulated: Istio VirtualServices, the culler's idleness probes (the stop annotation is honoured when set
by hand), PodDefaults, the Spark ports of some forks. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tools.kubesim.objects import clone, controller_of, controller_ref, rfc3339
from tools.kubesim.operators import AGE_COLUMN, OperatorSpec, custom_resource_definition

if TYPE_CHECKING:
    from tools.kubesim.controllers import Controllers
    from tools.kubesim.store import Change

__all__ = ["NOTEBOOK_CRD", "STOP_ANNOTATION", "NotebookController"]

Obj = dict[str, Any]

GROUP = "kubeflow.org"
KIND = "Notebook"
PLURAL = "notebooks"
STORAGE = f"{GROUP}/{PLURAL}"
STORED_VERSION = "v1beta1"
VERSIONS = ("v1alpha1", STORED_VERSION, "v1")
OWNER_API_VERSION = f"{GROUP}/{STORED_VERSION}"
COMPONENT = "notebook-controller"
STATEFULSETS = "apps/statefulsets"
SERVICES = "services"

STOP_ANNOTATION = "kubeflow-resource-stopped"
"""Set by Kubeflow's culler (or by hand) to stop a Notebook: its StatefulSet is scaled to 0."""
CONTAINER_PORT = 8888
SERVING_PORT = 80
FS_GROUP = 100
WORKING_DIR = "/home/jovyan"


NOTEBOOK_CRD: Obj = custom_resource_definition(
    GROUP, KIND, PLURAL, VERSIONS, stored=STORED_VERSION, subresources={"status": {}}, columns=[AGE_COLUMN]
)
"""The CustomResourceDefinition kubesim serves from its start."""


def spec_problem(notebook: Obj) -> tuple[str, str] | None:
    """The first (field, problem) of a Notebook spec the real API server's schema would refuse."""
    spec = notebook.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    pod_spec = template.get("spec") if isinstance(template, dict) else None
    if not isinstance(pod_spec, dict):
        return "spec.template.spec", "must be a pod spec object"
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return "spec.template.spec.containers", "must be a non-empty list of containers"
    for i, container in enumerate(containers):
        if not isinstance(container, dict):
            return f"spec.template.spec.containers[{i}]", "must be a container object"
    return None


def _pod_template(notebook: Obj) -> Obj:
    md = notebook["metadata"]
    name, ns = md["name"], md["namespace"]
    labels = {"statefulset": name, "notebook-name": name, **(md.get("labels") or {})}
    annotations = {
        k: v for k, v in (md.get("annotations") or {}).items() if "kubectl" not in k and "notebook" not in k
    }
    pod_spec: Obj = clone(notebook["spec"]["template"]["spec"])
    container = pod_spec["containers"][0]
    container.setdefault("workingDir", WORKING_DIR)
    if container.get("ports") is None:
        container["ports"] = [{"containerPort": CONTAINER_PORT, "name": "notebook-port", "protocol": "TCP"}]
    env = container.get("env") if isinstance(container.get("env"), list) else []
    container["env"] = [*env, {"name": "NB_PREFIX", "value": f"/notebook/{ns}/{name}"}]
    if pod_spec.get("securityContext") is None:
        pod_spec["securityContext"] = {"fsGroup": FS_GROUP}
    template_md: Obj = {"labels": labels}
    if annotations:
        template_md["annotations"] = annotations
    return {"metadata": template_md, "spec": pod_spec}


def _statefulset_spec(notebook: Obj) -> Obj:
    md = notebook["metadata"]
    stopped = STOP_ANNOTATION in (md.get("annotations") or {})
    return {
        "replicas": 0 if stopped else 1,
        "selector": {"matchLabels": {"statefulset": md["name"]}},
        "template": _pod_template(notebook),
    }


def _service_port(notebook: Obj) -> int:
    container = notebook["spec"]["template"]["spec"]["containers"][0]
    ports = container.get("ports")
    if isinstance(ports, list) and ports and isinstance(ports[0], dict):
        port = ports[0].get("containerPort")
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            return port
    return CONTAINER_PORT


def _next_condition(state: Obj, now: str) -> Obj:
    """The notebook-controller's ``getNextCondition``: the container state as a condition."""
    if "running" in state:
        return {"type": "Running", "lastProbeTime": now, "reason": "", "message": ""}
    if "waiting" in state:
        waiting = state.get("waiting") or {}
        reason, message = str(waiting.get("reason", "")), str(waiting.get("message", ""))
        return {"type": "Waiting", "lastProbeTime": now, "reason": reason, "message": message}
    terminated = state.get("terminated") or {}
    reason = str(terminated.get("reason", ""))
    return {"type": "Terminated", "lastProbeTime": now, "reason": reason, "message": reason}


class NotebookController:
    """Kubeflow's notebook-controller, reconciling one Notebook at a time for `Controllers`."""

    def __init__(self, controllers: Controllers) -> None:
        self.controllers = controllers
        # A StatefulSet's status changes as its pod comes up; the built-in controllers do not pass that on to
        # a StatefulSet's owner, so the Notebook listens itself.
        controllers.cluster.store.storage(STATEFULSETS).listeners.append(self._statefulset_changed)

    def _statefulset_changed(self, change: Change) -> None:
        ref = controller_of(change.obj)
        if (
            ref is None
            or ref.get("kind") != KIND
            or not str(ref.get("apiVersion", "")).startswith(f"{GROUP}/")
        ):
            return
        ns = change.obj["metadata"].get("namespace", "")
        self.controllers.mark_dirty(STORAGE, ns, str(ref.get("name", "")))

    def reconcile(self, storage: str, notebook: Obj) -> None:  # noqa: ARG002 - one storage: the Notebooks
        cluster = self.controllers.cluster
        problem = spec_problem(notebook)
        if problem is not None:
            field, message = problem
            cluster.record_event(
                notebook, "Warning", f"{KIND}FailedValidation", f"{field}: {message}", COMPONENT
            )
            return
        sts = self._statefulset(notebook)
        self._service(notebook)
        self._status(notebook, sts)

    def _statefulset(self, notebook: Obj) -> Obj | None:
        cluster = self.controllers.cluster
        md = notebook["metadata"]
        ns, name = md["namespace"], md["name"]
        want = _statefulset_spec(notebook)
        existing = cluster.store.storage(STATEFULSETS).get(ns, name)
        if existing is None:
            manifest = {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "ownerReferences": [controller_ref(notebook, OWNER_API_VERSION)],
                },
                "spec": want,
            }
            self.controllers.create_owned(notebook, STORAGE, STATEFULSETS, manifest)
            return cluster.store.storage(STATEFULSETS).get(ns, name)
        ref = controller_of(existing)
        if ref is None or ref.get("uid") != md.get("uid"):
            return None
        spec = existing.get("spec") or {}
        if spec.get("replicas") != want["replicas"] or spec.get("template") != want["template"]:
            updated = {
                **existing,
                "metadata": dict(existing["metadata"]),
                "spec": {**spec, "replicas": want["replicas"], "template": want["template"]},
            }
            cluster.store.put(STATEFULSETS, updated)
            return updated
        return existing

    def _service(self, notebook: Obj) -> None:
        cluster = self.controllers.cluster
        md = notebook["metadata"]
        ns, name = md["namespace"], md["name"]
        if cluster.store.storage(SERVICES).get(ns, name) is not None:
            return
        manifest = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": name,
                "namespace": ns,
                "ownerReferences": [controller_ref(notebook, OWNER_API_VERSION)],
            },
            "spec": {
                "type": "ClusterIP",
                "selector": {"statefulset": name},
                "ports": [
                    {
                        "name": f"http-{name}",
                        "port": SERVING_PORT,
                        "targetPort": _service_port(notebook),
                        "protocol": "TCP",
                    }
                ],
            },
        }
        self.controllers.create_owned(notebook, STORAGE, SERVICES, manifest)

    def _status(self, notebook: Obj, sts: Obj | None) -> None:
        cluster = self.controllers.cluster
        md = notebook["metadata"]
        old: Obj = notebook.get("status") or {}
        ready = (sts.get("status") or {}).get("readyReplicas", 0) if sts is not None else 0
        state: Obj = old.get("containerState") or {}
        conditions: list[Obj] = list(old.get("conditions") or [])
        pod = cluster.store.storage("pods").get(md["namespace"], f"{md['name']}-0")
        if pod is not None and (
            sts is None or (controller_of(pod) or {}).get("uid") == sts["metadata"]["uid"]
        ):
            for container in (pod.get("status") or {}).get("containerStatuses") or ():
                if container.get("name") != md["name"] or container.get("state") == state:
                    continue
                state = container.get("state") or {}
                condition = _next_condition(state, rfc3339(cluster.now()))
                first = conditions[0] if conditions else {}
                if any(first.get(k) != condition[k] for k in ("type", "reason", "message")):
                    conditions = [condition, *conditions]
                break
        status: Obj = {"readyReplicas": ready, "containerState": state, "conditions": conditions}
        current = cluster.store.storage(STORAGE).get(md["namespace"], md["name"])
        if current is not None and current["metadata"].get("uid") == md.get("uid"):
            self.controllers.write_status(STORAGE, current, status)


OPERATOR = OperatorSpec(
    name="notebook",
    crds=(NOTEBOOK_CRD,),
    storages={STORAGE: COMPONENT},
    owners={(f"{GROUP}/{version}", KIND): STORAGE for version in VERSIONS},
    start=NotebookController,
)
