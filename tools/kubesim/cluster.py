"""The simulated cluster's API semantics: what get, list, watch, create, update, patch, delete, binding and
eviction do to the object store, plus garbage collection, namespaces, CRDs and start-up objects.

`Cluster` is the pure heart of the simulated API server. The aiohttp shell (`tools.kubesim.server`)
parses a request, calls one method here and encodes what it returns (or the `ApiError` it raises), then
calls `settle()`, which runs the workload controllers (`controllers`, given to the cluster by `start`
as `Workloads`: `tools.kubesim.assembly` builds the cluster and then them, and neither module imports the
other), the default scheduler (`scheduler`) and the node simulator (`nodesim`) until nothing changes;
`next_deadline()` tells it when timer-driven work (a bound pod starting, a pod finishing) is due next.
Tests drive a `Cluster` directly with a fake clock (`tools.kubesim.assembly.build_cluster`). Time is the
injected `clock` (seconds since the epoch): the shell passes the event loop's clock shifted to wall time,
so that timestamps read true and tests can use `looptime`.

Simplifications (also in the package docstring): deletion is immediate unless an object has finalizers
or is a pod that terminates gracefully (`tools.kubesim.nodesim`: ``kairos.io/stop-seconds``);
both Foreground and Background propagation delete dependents synchronously (Foreground first); a
dependent is deleted even when it has other owners; list pages are served from the current state, not a
snapshot; custom resources are stored without schema validation or pruning.
"""

from __future__ import annotations

import base64
import binascii
import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import msgspec
import yaml

from shared.errors import ConfigError
from tools.kubesim import default_storage_class, disruption, kinds
from tools.kubesim.errors import (
    ApiError,
    already_exists,
    bad_request,
    conflict,
    forbidden,
    gone,
    invalid,
    not_found,
    status_success,
)
from tools.kubesim.nodesim import NodeSimulator
from tools.kubesim.objects import clone, meta, new_uid, random_suffix, rfc3339
from tools.kubesim.operators import crds
from tools.kubesim.patch import json_patch, merge_patch, strategic_merge_patch
from tools.kubesim.resources import (
    EVENTS_V1_VIEW,
    Registry,
    ResourceType,
    builtin_types,
    crd_types,
)
from tools.kubesim.scheduler import DefaultScheduler
from tools.kubesim.selectors import (
    EVENTS_V1_FIELDS,
    EVERYTHING,
    FieldSelector,
    LabelSelector,
    parse_fields,
    parse_labels,
)
from tools.kubesim.store import Change, Store
from tools.kubesim.writes import DeferredCreate, Write

__all__ = [
    "BOOKMARK",
    "DEFAULT_NAMESPACES",
    "KAI_PRIORITY_CLASSES",
    "PATCH_TYPES",
    "Cluster",
    "DeferredCreate",
    "ListResult",
    "SimOptions",
    "WatchStream",
    "Workloads",
    "Write",
]

Obj = dict[str, Any]

DEFAULT_NAMESPACES = (
    "default",
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "kai-scheduler",
    "kai-resource-reservation",
    "kai-scale-adjust",
)
"""Kubernetes' own, and those a Kairos install creates (deploy/: its services; the GPU reservation pods;
the node-scale-adjuster's scaling pods, deploy/autoscaling)."""
PROTECTED_NAMESPACES = frozenset(("default", "kube-system", "kube-public"))
KAI_PRIORITY_CLASSES = (
    ("train", 50, "KAI Scheduler: preemptible training workloads"),
    ("build-preemptible", 75, "KAI Scheduler: preemptible build/interactive workloads"),
    ("build", 100, "KAI Scheduler: build/interactive workloads (non-preemptible)"),
    ("inference", 125, "KAI Scheduler: inference workloads (non-preemptible)"),
)
"""KAI Scheduler's predefined priority classes (name, value), from KAI's docs/priority/README.md."""
SYSTEM_PRIORITY_CLASSES = (
    ("system-cluster-critical", 2_000_000_000, "Used for system critical pods that must run in the cluster."),
    ("system-node-critical", 2_000_001_000, "Used for system critical pods that must not be moved."),
)
PATCH_TYPES = {
    "application/merge-patch+json": "merge",
    "application/json-patch+json": "json",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
    "application/apply-patch+json": "apply",
}
BOOKMARK = "BOOKMARK"
# Kinds that PUT may create when missing, as the real registry allows.
_CREATE_ON_UPDATE = frozenset(("events", "coordination.k8s.io/leases"))
_CRD_STORAGE = "apiextensions.k8s.io/customresourcedefinitions"
_PDB_STORAGE = "policy/poddisruptionbudgets"
_SPEC_FIELDS_IGNORED = frozenset(("metadata", "status", "kind", "apiVersion"))


class SimOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the simulated cluster behaves (the CLI flags of `python -m tools.kubesim`)."""

    run_delay: float = 0.5
    """Seconds from a pod's binding until it runs: long enough to see Pending-then-Running, short enough
    that tests and demos do not wait; 0 makes binding and running one step."""
    watch_history: int = 5000
    """Changes kept per resource for watches that resume from a resourceVersion; older ones get 410 Gone.
    A few thousand covers a resuming informer without holding much memory."""
    default_scheduler: bool = True
    """Bind pods of schedulerName default-scheduler (or none) first-fit, as a cluster's kube-scheduler
    would, so system workloads run; pods of any other scheduler are never bound by the simulator."""
    seed: int | None = None
    """Seed of generated names and uids (None: random), for reproducible tests."""

    def __post_init__(self) -> None:
        if self.run_delay < 0:
            raise ConfigError(f"kubesim option run_delay: must be >= 0, got {self.run_delay}")
        if self.watch_history < 1:
            raise ConfigError(f"kubesim option watch_history: must be >= 1, got {self.watch_history}")


class ListResult(msgspec.Struct, frozen=True):
    items: list[Obj]
    resource_version: str
    continue_token: str = ""


class WatchStream:
    """One watch: the events not yet sent, filled synchronously by the storage's listener.

    The shell drains `pending` and sets `wake` to be told when more arrive; `close()` unsubscribes.
    """

    def __init__(
        self,
        cluster: Cluster,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
    ) -> None:
        self.cluster = cluster
        self.rt = rt
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.pending: deque[tuple[str, Obj]] = deque()
        self.wake: Callable[[], None] | None = None
        self.ended = False
        self._storage = cluster.store.storage(rt.storage)
        self._everything = namespace is None and not labels and not fields
        """Whether the watch takes every object of its resource (most informers'): each change is then
        passed on as it is, without matching the object and the one it replaced."""

    def matches(self, obj: Obj) -> bool:
        if self.namespace is not None and obj.get("metadata", {}).get("namespace") != self.namespace:
            return False
        return self.labels.matches(obj) and self.fields.matches(obj)

    def on_change(self, change: Change) -> None:
        if self._everything:
            self.pending.append((change.type, self.cluster.view(self.rt, change.obj)))
            if self.wake is not None:
                self.wake()
            return
        now_match = self.matches(change.obj)
        if change.type == "MODIFIED" and change.old is not None:
            was_match = self.matches(change.old)
            if now_match and not was_match:
                kind = "ADDED"
            elif was_match and not now_match:
                kind = "DELETED"
            elif now_match:
                kind = "MODIFIED"
            else:
                return
        elif now_match:
            kind = change.type
        else:
            return
        self.pending.append((kind, self.cluster.view(self.rt, change.obj)))
        if self.wake is not None:
            self.wake()

    def on_close(self) -> None:
        self.ended = True
        if self.wake is not None:
            self.wake()

    def bookmark(self, annotations: dict[str, str] | None = None) -> Obj:
        md: Obj = {"resourceVersion": str(self.cluster.store.rv)}
        if annotations:
            md["annotations"] = annotations
        return {"kind": self.rt.kind, "apiVersion": self.rt.api_version, "metadata": md}

    def close(self) -> None:
        if self.on_change in self._storage.listeners:
            self._storage.listeners.remove(self.on_change)
        if self.on_close in self._storage.closers:
            self._storage.closers.remove(self.on_close)


def _encode_continue(rv: int, key: tuple[str, str]) -> str:
    raw = msgspec.json.encode({"rv": rv, "ns": key[0], "name": key[1]})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    """(the first page's resourceVersion, the last key served) of a continue token."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = msgspec.json.decode(raw)
        return int(data["rv"]), (str(data["ns"]), str(data["name"]))
    except (binascii.Error, msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from exc


def _spec_changed(old: Obj, new: Obj) -> bool:
    keys = (set(old) | set(new)) - _SPEC_FIELDS_IGNORED
    return any(old.get(k) != new.get(k) for k in keys)


def _same_except_rv(old: Obj, new: Obj) -> bool:
    if old.keys() != new.keys():
        return False
    for key, value in new.items():
        if key == "metadata":
            a = {k: v for k, v in old[key].items() if k != "resourceVersion"}
            b = {k: v for k, v in value.items() if k != "resourceVersion"}
            if a != b:
                return False
        elif old[key] != value:
            return False
    return True


class Workloads(Protocol):
    """What the cluster asks of its workload controllers (`tools.kubesim.controllers.Controllers`), given
    to it by `Cluster.start`: the cluster calls them, they call the cluster back, neither imports the other."""

    def storage_added(self, key: str) -> None:
        """A CRD's storage was registered."""

    def run_once(self) -> bool:
        """Reconcile what changed; whether anything was done."""


class Cluster:
    """The simulated cluster: its resource types, its objects and what acts on them."""

    controllers: Workloads
    """The workload controllers, given by `start` (`tools.kubesim.assembly` builds them)."""

    def __init__(self, options: SimOptions | None = None, *, clock: Callable[[], float]) -> None:
        """An empty cluster: its resource types, storages, node simulator and default scheduler. `start` then
        gives it its controllers and creates the start-up objects (`tools.kubesim.assembly.build_cluster`
        does both)."""
        self.options = options or SimOptions()
        self.clock = clock
        self.defer_creates: Callable[[], bool] = lambda: False
        """Whether the pods controllers create must first pass admission webhooks (the server sets it: when
        any webhook configuration exists); they then wait in `deferred` for the server."""
        self.deferred: deque[DeferredCreate] = deque()
        self.rng = random.Random(self.options.seed)
        self.registry = Registry(builtin_types())
        self.store = Store(history=self.options.watch_history)
        for storage_key, rt in self.registry.storages().items():
            index = ("spec.nodeName",) if storage_key == "pods" else ()
            self.store.add_storage(storage_key, namespaced=rt.namespaced, index_fields=index)
        self.nodesim = NodeSimulator(self, run_delay=self.options.run_delay)
        self.scheduler = DefaultScheduler(self, enabled=self.options.default_scheduler)

    def start(self, controllers: Workloads) -> None:
        """Take `controllers` (built for this cluster) and create what a new cluster holds: the default
        namespaces, the system and KAI priority classes, the operators' CRDs; then settle."""
        self.controllers = controllers
        for name in DEFAULT_NAMESPACES:
            self.create(self.type_of("namespaces"), None, {"metadata": {"name": name}})
        for name, value, description in (*SYSTEM_PRIORITY_CLASSES, *KAI_PRIORITY_CLASSES):
            self.create(
                self.type_of("scheduling.k8s.io/priorityclasses"),
                None,
                {"metadata": {"name": name}, "value": value, "description": description},
            )
        for crd in crds():
            self.create(self.type_of(_CRD_STORAGE), None, clone(crd))
        self.settle()

    # --- helpers --------------------------------------------------------------------------------------------
    def now(self) -> float:
        return self.clock()

    def type_of(self, storage_key: str) -> ResourceType:
        """The canonical (first registered, non-converted) type of a storage."""
        rt = self.registry.storages().get(storage_key)
        if rt is None:
            raise not_found("resources", storage_key)
        return rt

    def lookup(self, group: str, version: str, plural: str) -> ResourceType:
        return self.registry.lookup(group, version, plural)

    def view(self, rt: ResourceType, obj: Obj) -> Obj:
        """A stored object as `rt` presents it (events.k8s.io conversion, a CRD's requested version)."""
        if rt.view == EVENTS_V1_VIEW:
            return kinds.to_events_v1(obj)
        if rt.crd and obj.get("apiVersion") != rt.api_version:
            return {**obj, "apiVersion": rt.api_version}
        return obj

    def stored_form(self, rt: ResourceType, body: Obj) -> Obj:
        """An object as `rt` presents it (`view`) turned back into what the storage holds."""
        if rt.view == EVENTS_V1_VIEW:
            return kinds.from_events_v1(body)
        return body

    def _key(self, rt: ResourceType, namespace: str | None) -> str:
        return (namespace or "") if rt.namespaced else ""

    def get_stored(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.store.storage(rt.storage).get(self._key(rt, namespace), name)
        if obj is None:
            raise not_found(rt.plural, name, rt.group)
        return obj

    def _check_kind(self, rt: ResourceType, body: Obj) -> None:
        kind = body.get("kind")
        api_version = body.get("apiVersion")
        stored_kind = "Event" if rt.view else rt.kind
        if kind not in (None, "", stored_kind):
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({rt.kind})")
        expected = "v1" if rt.view else rt.api_version
        if api_version not in (None, "", expected):
            group = str(api_version).rsplit("/", 1)[0] if "/" in str(api_version) else ""
            # A custom resource may be written through any served version of its group.
            if not (rt.crd and group == rt.group):
                raise bad_request(
                    f"the API version in the data ({api_version}) does not match the expected API version ({rt.api_version})"
                )
        body["kind"] = stored_kind
        body["apiVersion"] = expected

    # --- reads ------------------------------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        return self.view(rt, self.get_stored(rt, namespace, name))

    def find(self, storage_key: str, namespace: str | None, name: str) -> Obj | None:
        """The stored object, None when absent: for assertions (`find("pods", "default", "p")`,
        `find("scheduling.run.ai/queues", None, "q")`). The result must not be mutated."""
        storage = self.store.storages.get(storage_key)
        if storage is None:
            return None
        return storage.get((namespace or "") if storage.namespaced else "", name)

    def objects(self, storage_key: str, namespace: str | None = None) -> list[Obj]:
        """Every stored object of a resource (in `namespace` when given), in key order: for assertions."""
        storage = self.store.storages.get(storage_key)
        return [] if storage is None else list(storage.page(namespace if storage.namespaced else None, None))

    def selectors(
        self, rt: ResourceType, label: str | None, field: str | None
    ) -> tuple[LabelSelector, FieldSelector]:
        """Parse a request's `labelSelector` and `fieldSelector` for objects of `rt`."""
        rename = (lambda f: EVENTS_V1_FIELDS.get(f, f)) if rt.view == EVENTS_V1_VIEW else None
        return parse_labels(label), parse_fields(field, rt.storage, rename)

    def list_objects(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        labels: LabelSelector = EVERYTHING,
        fields: FieldSelector | None = None,
        limit: int = 0,
        continue_token: str = "",
    ) -> ListResult:
        """Objects of `rt` (in `namespace` when given) in key order, filtered, paginated by `limit`.

        Every page reports the resourceVersion of the first: pages come from the current state, and a watch
        from that version replays whatever changed while the pages were read, as after a snapshot list.
        """
        fields = fields or FieldSelector()
        storage = self.store.storage(rt.storage)
        ns = namespace if (rt.namespaced and namespace) else None
        first_rv = self.store.rv
        after: tuple[str, str] | None = None
        if continue_token:
            first_rv, after = _decode_continue(continue_token)
        rv = str(first_rv)
        candidates: Iterable[Obj]
        pinned_name = fields.exact("metadata.name")
        pinned_node = fields.exact("spec.nodeName") if rt.storage == "pods" else None
        if pinned_name is not None and (ns is not None or not rt.namespaced):
            one = storage.get(ns or "", pinned_name)
            candidates = [one] if one is not None else []
        elif pinned_node is not None:
            candidates = sorted(
                storage.indexed("spec.nodeName", pinned_node),
                key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]),
            )
            if after is not None:
                candidates = [
                    o
                    for o in candidates
                    if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after
                ]
            if ns is not None:
                candidates = [o for o in candidates if o["metadata"].get("namespace") == ns]
        else:
            candidates = storage.page(ns, after)
        items: list[Obj] = []
        token = ""
        filtering = bool(labels) or bool(fields)
        iterator = iter(candidates)
        for obj in iterator:
            if filtering and not (labels.matches(obj) and fields.matches(obj)):
                continue
            items.append(self.view(rt, obj))
            if limit and len(items) >= limit:
                if next(iterator, None) is not None:
                    md = obj["metadata"]
                    token = _encode_continue(first_rv, (md.get("namespace", ""), md["name"]))
                break
        return ListResult(items, rv, token)

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        resource_version: str | None,
        labels: LabelSelector = EVERYTHING,
        fields: FieldSelector | None = None,
        send_initial_events: bool = False,
        bookmarks: bool = False,
    ) -> WatchStream:
        """Start a watch. Without a resourceVersion (or "0") the current objects come first as ADDED;
        from a resourceVersion the changes after it are replayed (410 Gone when they left the window)."""
        stream = WatchStream(
            self, rt, namespace if (rt.namespaced and namespace) else None, labels, fields or FieldSelector()
        )
        storage = self.store.storage(rt.storage)
        if resource_version in (None, "", "0") or send_initial_events:
            for obj in storage.page(stream.namespace, None):
                if stream.matches(obj):
                    stream.pending.append(("ADDED", self.view(rt, obj)))
            if send_initial_events and bookmarks:
                stream.pending.append((BOOKMARK, stream.bookmark({"k8s.io/initial-events-end": "true"})))
        else:
            try:
                since = int(str(resource_version))
            except ValueError as exc:
                raise bad_request(f"invalid resource version {resource_version!r}") from exc
            if since > self.store.rv:
                # A version this server never gave out: the client watched an earlier incarnation of it (a
                # restarted simulator starts its history again). kube-apiserver refuses such a watch too
                # ("Too large resource version"); clients list again, as after a 410.
                raise gone(f"too large resource version: {since}, current {self.store.rv}")
            for change in storage.changes_after(since):
                stream.on_change(change)
        storage.listeners.append(stream.on_change)
        storage.closers.append(stream.on_close)
        return stream

    # --- writes ---------------------------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str | None, body: Any, *, dry_run: bool = False) -> Obj:
        """Create an object of `rt` from `body` (which the store owns afterwards)."""
        return self.finish(self.begin_create(rt, namespace, body), dry_run=dry_run)[0]

    def begin_create(self, rt: ResourceType, namespace: str | None, body: Any) -> Write:
        """The first half of a create, up to what admission webhooks see: the object checked against the
        request, its namespace resolved and the decoding defaults filled (a pod's spec and priority), but no
        name generated from generateName, no uid and no timestamps yet, as on the real server."""
        body = self.stored_form(rt, kinds.require_dict(body))
        self._check_kind(rt, body)
        md = body.setdefault("metadata", {})
        if not isinstance(md, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            body_ns = md.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            ns = namespace or body_ns
            if not ns:
                raise bad_request(f"a namespace is required to create {rt.plural}")
            kinds.check_namespace_name(rt.kind, md.get("name") or md.get("generateName") or "", ns)
            if self.store.storage("namespaces").get("", ns) is None:
                raise not_found("namespaces", ns)
            md["namespace"] = ns
        else:
            md.pop("namespace", None)
        for field in (
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "managedFields",
        ):
            md.pop(field, None)
        kinds.default_object(rt, body)
        if rt.storage == "pods" and isinstance(body.get("spec"), dict):
            self._admit_pod_priority(body)
        elif rt.storage == default_storage_class.CLAIMS:
            default_storage_class.admit(self.store, body)
        return Write(rt=rt, operation="CREATE", obj=body)

    def _finish_create(self, write: Write, *, dry_run: bool) -> Obj:
        rt, body = write.rt, write.obj
        md = body["metadata"]
        ns = md.get("namespace", "") if rt.namespaced else ""
        storage = self.store.storage(rt.storage)
        if write.admitted:
            # A webhook changed the object: decoding defaults again, as the real server does.
            kinds.default_object(rt, body)
        if not md.get("name") and isinstance(md.get("generateName"), str) and md["generateName"]:
            for _ in range(100):
                candidate = md["generateName"] + random_suffix(self.rng)
                if storage.get(ns, candidate) is None:
                    md["name"] = candidate
                    break
        kinds.check_name(rt, md.get("name"))
        name = md["name"]
        if storage.get(ns, name) is not None:
            raise already_exists(rt.plural, name, rt.group)
        now = self.now()
        md["uid"] = new_uid(self.rng)
        md["creationTimestamp"] = rfc3339(now)
        md["generation"] = 1
        kinds.validate(rt, body)
        kinds.validate_create(rt, body)
        kinds.prepare_create(rt, body, now)
        if dry_run:
            return self.view(rt, body)
        if rt.storage == _CRD_STORAGE:
            self._register_crd(body)
        stored = self.store.put(rt.storage, body)
        if rt.storage == "namespaces":
            self._namespace_defaults(name)
        return self.view(rt, stored)

    def still_current(self, write: Write) -> bool:
        """Whether the object an update began from is still the stored one."""
        if write.old is None:
            return True
        md = write.old["metadata"]
        return (
            self.store.storage(write.rt.storage).get(self._key(write.rt, md.get("namespace")), md["name"])
            is write.old
        )

    def finish(self, write: Write, *, dry_run: bool = False) -> tuple[Obj, bool]:
        """The second half of a write begun by `begin_create`, `begin_replace` or `begin_patch`, after
        admission: validate and store (nothing stored with `dry_run`). Returns (object, created).

        An update whose object changed in the store since it began fails with 409 Conflict (the server
        begins it again when the client gave no resourceVersion)."""
        if write.operation == "CREATE":
            return self._finish_create(write, dry_run=dry_run), True
        rt, existing, new = write.rt, write.old, write.obj
        assert existing is not None
        md = existing["metadata"]
        current = self.store.storage(rt.storage).get(self._key(rt, md.get("namespace")), md["name"])
        if current is None:
            raise not_found(rt.plural, md["name"], rt.group)
        if current is not existing:
            self._check_precondition(rt, current, existing["metadata"].get("resourceVersion"))
        if write.admitted:
            kinds.default_object(rt, new)
            kinds.validate(rt, new)
            if rt.storage == "pods":
                kinds.check_pod_update(existing, new)
        if dry_run:
            return self.view(rt, new), False
        return self.view(rt, self._commit(rt, existing, new)), False

    def _admit_pod_priority(self, pod: Obj) -> None:
        spec = pod["spec"]
        classes = self.store.storage("scheduling.k8s.io/priorityclasses")
        class_name = spec.get("priorityClassName")
        if class_name:
            pc = classes.get("", class_name)
            if pc is None:
                raise forbidden(
                    "pods", meta(pod)["name"], f"no PriorityClass with name {class_name} was found"
                )
        else:
            pc = next((c for c in classes.iter() if c.get("globalDefault")), None)
            if pc is not None:
                spec["priorityClassName"] = meta(pc)["name"]
        spec["priority"] = int(pc["value"]) if pc is not None else 0
        if pc is not None and pc.get("preemptionPolicy"):
            spec["preemptionPolicy"] = pc["preemptionPolicy"]

    def _namespace_defaults(self, namespace: str) -> None:
        sa = self.store.storage("serviceaccounts")
        if sa.get(namespace, "default") is None:
            self.create(self.type_of("serviceaccounts"), namespace, {"metadata": {"name": "default"}})

    def _register_crd(self, crd: Obj) -> None:
        self.registry.remove_crd(meta(crd)["name"])
        for rt in crd_types(crd):
            clash = self.registry.find(rt.group, rt.version, rt.plural)
            if clash is not None and not clash.crd:
                raise invalid(
                    "CustomResourceDefinition",
                    meta(crd)["name"],
                    "spec.group",
                    "conflicts with a built-in resource",
                )
            self.registry.add(rt)
            self.store.add_storage(rt.storage, namespaced=rt.namespaced)
            self.controllers.storage_added(rt.storage)

    def replace(
        self, rt: ResourceType, namespace: str | None, name: str, body: Any, *, subresource: str = ""
    ) -> tuple[Obj, bool]:
        """PUT: replace the object (or only its status); returns (object, created)."""
        return self.finish(self.begin_replace(rt, namespace, name, body, subresource=subresource))

    def begin_replace(
        self, rt: ResourceType, namespace: str | None, name: str, body: Any, *, subresource: str = ""
    ) -> Write:
        """The first half of a PUT (a CREATE for kinds a PUT may create); `finish` stores it."""
        body = self.stored_form(rt, kinds.require_dict(body))
        md = body.get("metadata")
        if not isinstance(md, dict):
            raise bad_request("metadata must be an object")
        if md.get("name") not in (None, "", name):
            raise bad_request(
                f"the name of the object ({md.get('name')}) does not match the name on the URL ({name})"
            )
        existing = self.store.storage(rt.storage).get(self._key(rt, namespace), name)
        if existing is None:
            if rt.storage in _CREATE_ON_UPDATE and not subresource:
                md["name"] = name
                return self.begin_create(rt, namespace, body)
            raise not_found(rt.plural, name, rt.group)
        self._check_kind(rt, body)
        self._check_precondition(rt, existing, md.get("resourceVersion"))
        new = self._updated(rt, existing, body, subresource)
        return Write(rt=rt, operation="UPDATE", obj=new, old=existing, subresource=subresource)

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        data: bytes,
        *,
        subresource: str = "",
        force: bool = False,
    ) -> tuple[Obj, bool]:
        """PATCH in one of `PATCH_TYPES`; server-side apply creates a missing object. Returns (object, created)."""
        return self.finish(
            self.begin_patch(rt, namespace, name, content_type, data, subresource=subresource, force=force)
        )

    def begin_patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        data: bytes,
        *,
        subresource: str = "",
        force: bool = False,
    ) -> Write:
        """The first half of a PATCH: the patched object, checked; `finish` stores it."""
        kind = PATCH_TYPES.get(content_type.split(";", maxsplit=1)[0].strip())
        if kind is None:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: {', '.join(PATCH_TYPES)}",
            )
        try:
            document = yaml.safe_load(data) if kind == "apply" else msgspec.json.decode(data)
        except (msgspec.DecodeError, yaml.YAMLError) as exc:
            raise bad_request(
                f"the patch is not valid {'YAML' if kind == 'apply' else 'JSON'}: {exc}"
            ) from exc
        existing = self.store.storage(rt.storage).get(self._key(rt, namespace), name)
        if existing is None:
            if kind == "apply" and not subresource:
                doc = kinds.require_dict(document, "an apply patch")
                doc.setdefault("metadata", {})["name"] = name
                return self.begin_create(rt, namespace, doc)
            raise not_found(rt.plural, name, rt.group)
        del force  # field ownership is not tracked, so there are no conflicts to force
        current = clone(self.view(rt, existing))
        match kind:
            case "merge":
                patched = merge_patch(current, document)
            case "json":
                patched = json_patch(current, document)
            case _:
                patched = strategic_merge_patch(current, document)
        patched = self.stored_form(rt, kinds.require_dict(patched, "the patched object"))
        md = patched.get("metadata")
        if not isinstance(md, dict) or md.get("name") != name:
            raise invalid(rt.kind, name, "metadata.name", "a patch may not change the name")
        self._check_kind(rt, patched)
        self._check_precondition(rt, existing, md.get("resourceVersion"))
        new = self._updated(rt, existing, patched, subresource)
        return Write(rt=rt, operation="UPDATE", obj=new, old=existing, subresource=subresource)

    def _check_precondition(self, rt: ResourceType, existing: Obj, rv: Any) -> None:
        if rv and str(rv) != existing["metadata"].get("resourceVersion"):
            raise conflict(
                rt.plural,
                existing["metadata"]["name"],
                "the object has been modified; please apply your changes to the latest version and try again",
                rt.group,
            )

    def _updated(self, rt: ResourceType, existing: Obj, body: Obj, subresource: str) -> Obj:
        """The object an update of `existing` with `body` stores (status and spec split as the real server does)."""
        old_md = existing["metadata"]
        if subresource == "status":
            status = body.get("status")
            new = {**existing, "metadata": dict(old_md)}
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
            return new
        if subresource:
            raise ApiError(
                405, "MethodNotAllowed", f"the server does not allow this method on {rt.plural}/{subresource}"
            )
        new = body
        md = new["metadata"]
        for field in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "generation",
        ):
            if field in old_md:
                md[field] = old_md[field]
            else:
                md.pop(field, None)
        md["name"] = old_md["name"]
        md.pop("managedFields", None)
        if rt.has_status or rt.storage == "namespaces":
            if "status" in existing:
                new["status"] = existing["status"]
            else:
                new.pop("status", None)
        if rt.storage == "namespaces":
            new["spec"] = existing.get("spec", {})
        if rt.storage == "apiextensions.k8s.io/customresourcedefinitions" and "status" in existing:
            new["status"] = existing["status"]
        kinds.default_object(rt, new)
        kinds.validate(rt, new)
        if rt.storage == "pods":
            kinds.check_pod_update(existing, new)
        if _spec_changed(existing, new):
            md["generation"] = int(old_md.get("generation", 1)) + 1
        if rt.storage == _CRD_STORAGE:
            self._register_crd(new)
        return new

    def _commit(self, rt: ResourceType, existing: Obj, new: Obj) -> Obj:
        md = new["metadata"]
        if (
            md.get("deletionTimestamp")
            and not md.get("finalizers")
            and not md.get("deletionGracePeriodSeconds")
        ):
            # The last finalizer of an object being deleted went: it goes now (a pod still terminating
            # gracefully is removed by its kubelet instead).
            removed = self.remove(rt.storage, md.get("namespace", ""), md["name"], "Background")
            return removed if removed is not None else existing
        if _same_except_rv(existing, new):
            return existing
        return self.store.put(rt.storage, new)

    # --- delete -----------------------------------------------------------------------------------------------
    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        options: Any = None,
        *,
        dry_run: bool = False,
    ) -> Obj:
        """DELETE with DeleteOptions (preconditions, propagationPolicy); returns the object as deleted."""
        opts = options if isinstance(options, dict) else {}
        existing = self.get_stored(rt, namespace, name)
        pre = opts.get("preconditions") or {}
        # Worded as the registry's BeforeDelete, which names the kind, not the resource.
        uid = existing["metadata"].get("uid")
        if pre.get("uid") and pre["uid"] != uid:
            raise conflict(
                rt.kind,
                name,
                f"the UID in the precondition ({pre['uid']}) does not match the UID in record ({uid}). "
                "The object might have been deleted and then recreated",
                rt.group,
            )
        rv = existing["metadata"].get("resourceVersion")
        if pre.get("resourceVersion") and pre["resourceVersion"] != rv:
            raise conflict(
                rt.kind,
                name,
                f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does not match the "
                f"ResourceVersion in record ({rv}). The object might have been modified",
                rt.group,
            )
        policy = opts.get("propagationPolicy")
        if policy is None:
            policy = "Orphan" if opts.get("orphanDependents") is True else "Background"
        if policy not in ("Orphan", "Background", "Foreground"):
            raise invalid(
                "DeleteOptions",
                "",
                "propagationPolicy",
                'supported values: "Foreground", "Background", "Orphan"',
            )
        if rt.storage == "namespaces" and name in PROTECTED_NAMESPACES:
            raise forbidden("namespaces", name, "this namespace may not be deleted")
        if dry_run:
            return self.view(rt, existing)
        if rt.storage == "pods" and not existing["metadata"].get("finalizers"):
            grace = self.nodesim.termination_grace(existing, opts)
            if grace is not None:
                return self.view(rt, self._terminate(existing, grace))
        if existing["metadata"].get("finalizers"):
            if existing["metadata"].get("deletionTimestamp"):
                return self.view(rt, existing)
            md = dict(existing["metadata"])
            md["deletionTimestamp"] = rfc3339(self.now())
            md["deletionGracePeriodSeconds"] = 0
            return self.view(rt, self.store.put(rt.storage, {**existing, "metadata": md}))
        removed = self.remove(rt.storage, self._key(rt, namespace), name, policy)
        assert removed is not None
        if rt.storage == "namespaces":
            removed = {**removed, "status": {"phase": "Terminating"}}
        return self.view(rt, removed)

    def _terminate(self, pod: Obj, grace: int) -> Obj:
        """Graceful deletion: the pod stays, marked for deletion `grace` seconds from now, until its kubelet
        has stopped its containers (`tools.kubesim.nodesim`); a longer grace than one given before does not
        extend it."""
        md = dict(pod["metadata"])
        if md.get("deletionTimestamp") and int(md.get("deletionGracePeriodSeconds") or 0) <= grace:
            return pod
        md["deletionTimestamp"] = rfc3339(self.now() + grace)
        md["deletionGracePeriodSeconds"] = grace
        return self.store.put("pods", {**pod, "metadata": md})

    def delete_collection(
        self,
        rt: ResourceType,
        namespace: str | None,
        *,
        labels: LabelSelector = EVERYTHING,
        fields: FieldSelector | None = None,
        options: Any = None,
    ) -> list[Obj]:
        listed = self.list_objects(rt, namespace, labels=labels, fields=fields)
        out = []
        for obj in listed.items:
            md = obj["metadata"]
            try:
                out.append(self.delete(rt, md.get("namespace"), md["name"], options))
            except ApiError as exc:
                if exc.code != 404:
                    raise
        return out

    def remove(self, storage_key: str, namespace: str, name: str, policy: str) -> Obj | None:
        """Delete an object now, with its dependents per `policy`, a namespace's contents, a CRD's objects
        (no finalizers, no grace period: what the API's delete ends in, and how a controller drops a pod)."""
        storage = self.store.storage(storage_key)
        obj = storage.get(namespace if storage.namespaced else "", name)
        if obj is None:
            return None
        uid = obj["metadata"].get("uid", "")
        if policy == "Foreground":
            self._delete_dependents(uid, "Foreground")
        if storage_key == "namespaces":
            for key, other in list(self.store.storages.items()):
                if other.namespaced:
                    for child in list(other.iter(name)):
                        self.remove(key, name, child["metadata"]["name"], "Background")
        if storage_key == _CRD_STORAGE:
            self._drop_crd(obj)
        removed = self.store.remove(storage_key, namespace, name)
        if policy == "Orphan":
            self._orphan_dependents(uid)
        elif policy == "Background":
            self._delete_dependents(uid, "Background")
        return removed

    def _drop_crd(self, crd: Obj) -> None:
        gone_types = self.registry.remove_crd(crd["metadata"]["name"])
        for key in {rt.storage for rt in gone_types}:
            storage = self.store.storages.get(key)
            if storage is None:
                continue
            for obj in list(storage.iter()):
                self.remove(key, obj["metadata"].get("namespace", ""), obj["metadata"]["name"], "Background")
            for closer in list(storage.closers):
                closer()
            self.store.drop_storage(key)

    def _delete_dependents(self, uid: str, policy: str) -> None:
        for storage_key, ns, name in self.store.dependents_of(uid):
            if storage_key in self.store.storages:
                self.remove(storage_key, ns, name, policy)

    def _orphan_dependents(self, uid: str) -> None:
        for storage_key, ns, name in self.store.dependents_of(uid):
            storage = self.store.storages.get(storage_key)
            obj = storage.get(ns, name) if storage is not None else None
            if obj is None:
                continue
            md = dict(obj["metadata"])
            md["ownerReferences"] = [r for r in md.get("ownerReferences") or () if r.get("uid") != uid]
            if not md["ownerReferences"]:
                del md["ownerReferences"]
            self.store.put(storage_key, {**obj, "metadata": md})

    # --- pods/binding, pods/eviction, scale ------------------------------------------------------------------
    def bind(self, namespace: str, name: str, body: Any) -> Obj:
        """POST pods/binding: assign the pod to `target.name`; 409 if it already has a node."""
        binding = kinds.require_dict(body, "a Binding")
        pods = self.store.storage("pods")
        pod = pods.get(namespace, name)
        if pod is None:
            raise not_found("pods", name)
        md = binding.get("metadata") or {}
        if md.get("name") not in (None, "", name):
            raise bad_request(f"the name of the binding ({md.get('name')}) does not match the pod ({name})")
        target = binding.get("target")
        node_name = target.get("name") if isinstance(target, dict) else None
        if not node_name or not isinstance(node_name, str):
            raise invalid("Binding", name, "target.name", "Required value")
        # The binding's uid and resourceVersion are preconditions of the storage update, whose failure the
        # registry answers as a Conflict on the pod carrying the storage error.
        for field, what in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            if md.get(field) and md[field] != pod["metadata"].get(field):
                raise conflict(
                    "pods",
                    name,
                    f"StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/{name}, "
                    f"ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: {what} in precondition: "
                    f"{md[field]}, {what} in object meta: {pod['metadata'].get(field)}",
                )
        if pod["metadata"].get("deletionTimestamp"):
            raise conflict("pods/binding", name, f"pod {name} is being deleted, cannot be assigned to a host")
        current = (pod.get("spec") or {}).get("nodeName")
        if current:
            raise conflict("pods/binding", name, f'pod {name} is already assigned to node "{current}"')
        if (pod.get("spec") or {}).get("schedulingGates"):
            # The real registry returns a plain error here, which the server answers as 500 Unknown.
            raise ApiError(500, "Unknown", f"pod {name} has non-empty .spec.schedulingGates")
        if self.store.storage("nodes").get("", node_name) is None:
            raise not_found("nodes", node_name)
        self.assign(pod, node_name, md.get("annotations") or {})
        return status_success(201)

    def assign(self, pod: Obj, node_name: str, annotations: dict[str, str] | None = None) -> Obj:
        """Store `pod` bound to `node_name` (binding's effect; also the default scheduler's)."""
        now = rfc3339(self.now())
        pod_md = dict(pod["metadata"])
        if annotations:
            pod_md["annotations"] = {**(pod_md.get("annotations") or {}), **annotations}
        status = dict(pod.get("status") or {})
        conditions = [c for c in status.get("conditions") or () if c.get("type") != "PodScheduled"]
        conditions.append(
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
        )
        status["conditions"] = conditions
        new = {**pod, "metadata": pod_md, "spec": {**pod["spec"], "nodeName": node_name}, "status": status}
        return self.store.put("pods", new)

    def evict(self, namespace: str, name: str, body: Any) -> Obj:
        """POST pods/eviction: delete the pod unless a PodDisruptionBudget refuses (429, `disruption`);
        the eviction's deleteOptions (preconditions) apply to the delete."""
        eviction = body if isinstance(body, dict) else {}
        md = eviction.get("metadata") or {}
        pod = self.store.storage("pods").get(namespace, name)
        if pod is None:
            raise not_found("pods", name)
        if md.get("name") not in (None, "", name):
            raise bad_request("name in URL does not match name in Eviction object")
        budgets = self.store.storage(_PDB_STORAGE).iter(namespace)
        refused = disruption.refusal(pod, budgets, self.store.storage("pods").iter(namespace), self._owner)
        if refused is not None:
            raise refused
        self.delete(self.type_of("pods"), namespace, name, eviction.get("deleteOptions"))
        return status_success(201)

    def _owner(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        """A pod's controller as the disruption controller finds it (`disruption.Lookup`)."""
        rt = self.registry.by_kind(api_version, kind)
        if rt is None or "scale" not in rt.subresources:
            raise disruption.Unscalable(f"{kind} does not implement the scale subresource")
        return self.find(rt.storage, namespace, name)

    def get_scale(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.get_stored(rt, namespace, name)
        md = obj["metadata"]
        selector = (obj.get("spec") or {}).get("selector") or {}
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": md["name"],
                "namespace": md.get("namespace", ""),
                "uid": md.get("uid"),
                "resourceVersion": md.get("resourceVersion"),
                "creationTimestamp": md.get("creationTimestamp"),
            },
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
            "status": {
                "replicas": (obj.get("status") or {}).get("replicas", 0),
                "selector": ",".join(f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()),
            },
        }

    def set_scale(
        self, rt: ResourceType, namespace: str | None, name: str, replicas: Any, rv: Any = None
    ) -> Obj:
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid(
                "Scale", name, "spec.replicas", "must be greater than or equal to 0", value=replicas
            )
        existing = self.get_stored(rt, namespace, name)
        self._check_precondition(rt, existing, rv)
        if existing["spec"].get("replicas") != replicas:
            md = dict(existing["metadata"])
            md["generation"] = int(md.get("generation", 1)) + 1
            self.store.put(
                rt.storage, {**existing, "metadata": md, "spec": {**existing["spec"], "replicas": replicas}}
            )
        return self.get_scale(rt, namespace, name)

    def patch_scale(
        self, rt: ResourceType, namespace: str | None, name: str, content_type: str, data: bytes
    ) -> Obj:
        kind = PATCH_TYPES.get(content_type.split(";", maxsplit=1)[0].strip())
        if kind is None or kind == "apply":
            raise ApiError(415, "UnsupportedMediaType", "unsupported patch type for scale")
        try:
            document = msgspec.json.decode(data)
        except msgspec.DecodeError as exc:
            raise bad_request(f"the patch is not valid JSON: {exc}") from exc
        current = self.get_scale(rt, namespace, name)
        if kind == "merge":
            patched = merge_patch(current, document)
        elif kind == "json":
            patched = json_patch(current, document)
        else:
            patched = strategic_merge_patch(current, document)
        return self.set_scale(
            rt,
            namespace,
            name,
            (patched.get("spec") or {}).get("replicas"),
            (patched.get("metadata") or {}).get("resourceVersion"),
        )

    def review(self, rt: ResourceType, namespace: str | None, body: Any) -> Obj:
        """Answer an access review (everything is allowed: there is no authorisation) or an identity review;
        a POST to the legacy `bindings` collection binds the pod its body names."""
        question = kinds.require_dict(body, f"a {rt.kind}")
        if rt.kind == "Binding":
            return self.bind(namespace or "", str((question.get("metadata") or {}).get("name", "")), question)
        answer: Obj = {**question, "apiVersion": rt.api_version, "kind": rt.kind}
        answer.setdefault("metadata", {})["creationTimestamp"] = rfc3339(self.now())
        if rt.kind == "SelfSubjectReview":
            answer["status"] = {
                "userInfo": {
                    "username": "kubesim-admin",
                    "groups": ["system:masters", "system:authenticated"],
                }
            }
        else:
            answer["status"] = {"allowed": True, "reason": "the simulated API server allows every request"}
        return answer

    # --- events ---------------------------------------------------------------------------------------------
    def record_event(self, about: Obj, type_: str, reason: str, message: str, component: str) -> None:
        """Write a core/v1 Event about `about` (or bump the count of the same one)."""
        md = about["metadata"]
        ns = md.get("namespace") or "default"
        if self.store.storage("namespaces").get("", ns) is None:
            return
        name = f"{md['name']}.{reason.lower().replace('/', '.')}"
        events = self.store.storage("events")
        now = rfc3339(self.now())
        existing = events.get(ns, name)
        if existing is not None:
            self.store.put(
                "events",
                {
                    **existing,
                    "metadata": dict(existing["metadata"]),
                    "count": int(existing.get("count", 1)) + 1,
                    "lastTimestamp": now,
                    "message": message,
                },
            )
            return
        self.create(
            self.type_of("events"),
            ns,
            {
                "metadata": {"name": name, "namespace": ns},
                "involvedObject": {
                    "kind": about.get("kind", ""),
                    "namespace": md.get("namespace", ""),
                    "name": md["name"],
                    "uid": md.get("uid", ""),
                    "apiVersion": about.get("apiVersion", ""),
                    "resourceVersion": md.get("resourceVersion", ""),
                },
                "reason": reason,
                "message": message,
                "type": type_,
                "source": {"component": component},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
                "reportingComponent": component,
                "reportingInstance": "",
            },
        )

    # --- nodes and manifests at start-up -----------------------------------------------------------------------
    def add_node(self, node: Obj) -> Obj:
        """Create a node object (from `tools.kubesim.nodes.node_object`) with its kubelet status filled."""
        self.nodesim.complete_node(node)
        return self.create(self.type_of("nodes"), None, node)

    def apply_manifest(self, doc: Obj) -> Obj:
        """Create (or replace) one manifest as `kubectl apply` would, by its apiVersion and kind."""
        api_version = str(doc.get("apiVersion", ""))
        kind = str(doc.get("kind", ""))
        rt = self.registry.by_kind(api_version, kind)
        if rt is None:
            raise bad_request(f"no resource of apiVersion {api_version!r} and kind {kind!r} is served")
        md = doc.get("metadata") or {}
        ns = md.get("namespace") or ("default" if rt.namespaced else None)
        existing = self.store.storage(rt.storage).get(self._key(rt, ns), str(md.get("name", "")))
        if existing is None:
            return self.create(rt, ns, doc)
        doc.setdefault("metadata", {})["resourceVersion"] = existing["metadata"]["resourceVersion"]
        return self.replace(rt, ns, md["name"], doc)[0]

    # --- reconciliation ---------------------------------------------------------------------------------------
    def settle(self, max_rounds: int = 1000) -> None:
        """Run controllers, the default scheduler and due node-simulator timers until nothing changes."""
        for _ in range(max_rounds):
            progressed = self.nodesim.run_once(self.now())
            progressed = self.controllers.run_once() or progressed
            progressed = self.scheduler.run_once() or progressed
            if not progressed:
                return

    def next_deadline(self) -> float | None:
        """When timer-driven work is due next (in `clock` time), None when nothing is scheduled."""
        return self.nodesim.next_deadline()
