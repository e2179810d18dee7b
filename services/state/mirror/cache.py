"""The Kubernetes objects the state service mirrors, and the model objects they become in KV.

Fed by `services.state.sources.kube_source` (one `relist` per informer list, one `change` per watch event, the node
agents' `inventory` and `telemetry`) and drained by its flusher (`flush`), which writes the returned
`Change`s through `services.state.sources.kv_writer`. Pure: no I/O, no clock; decoding and translation are
`shared.kube`'s.

The mirror keeps the raw objects (`raw`), caches their translations, and holds back the objects whose
references do not resolve, each with the reason (`held`), until they do, so that what KV gets is always a
consistent cluster for the core:

- a queue whose parent is unknown or which sits on a cycle of parents, with every podgroup in it;
- a podgroup whose queue is not (yet) a valid queue, with every pod in it;
- a pod of this scheduler without a podgroup yet (the pod-grouper's work: `ungrouped`), or whose podgroup
  is held back or not yet seen (a podgroup that does not exist yet is waited for without a word on the pod:
  KAI v0.15 treats it as a creation race);
- a pod whose ``kai.scheduler/subgroup-name`` label names a sub-group its podgroup does not have: that pod
  alone, the rest of its gang goes on (KAI v0.15), with the problem shown on the pod like a translation's;
- a podgroup whose `kairos.io/after` dependencies have not all succeeded, or whose annotation does not
  parse, with every pod in it. The verdicts are `stages`' (`services.state.mirror.stages`); pods still carrying
  the `kairos.io/after` scheduling gate once their podgroup may run are listed by `ungatable`, for the gate
  keeper to lift.

An object that does not translate (a bad annotation, a negative quota) keeps its last good translation
when it had one (a running pod must stay counted on its node) and is otherwise held back; either way the
problem is recorded under the object's name (`problems`), and `reportable` gives the write-back what to
show. A decoding or translation that fails with any other exception (a Kairos bug that an object's content
reaches) is handled the same way for that object alone, its traceback kept in `unforeseen` for the owner's
log: no object a tenant can write stops the flush for the others.

Namespaces go to KV as their names and labels alone (`shared.model.Namespace`, what pod affinity
namespace selectors read); a namespace's change rewrites its own key only, and only when its labels moved.

One path computes every flush (`flush`, `_recompute`): the objects marked dirty since the last one are
recomputed, with what depends on them; a full flush (at start, after a relist, when a queue, priority class
or topology changed) marks every object dirty, recomputes the queues and topologies too, and removes from
KV what nothing produces any more.

Concerns are delegated: the raw objects and how they are named (`raw`, `services.state.mirror.raw_objects`);
decoding, the translation cache and the problems (`translations`, `services.state.mirror.translations`);
the queues' chains of parents (`services.state.mirror.queue_tree`); a node's GPUs are corrected by its
agent's fresh inventory and carry its telemetry (`gpus`, `services.state.mirror.gpu_overlay`), and what
pods Kairos does not schedule hold on a node is taken off its capacity (`foreign`,
`services.state.mirror.foreign`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import msgspec

from services.state.mirror.dependencies import AFTER_ANNOTATION
from services.state.mirror.dra_mirror import DraMirror
from services.state.mirror.foreign import Footprint, ForeignPods, subtract
from services.state.mirror.gpu_inventory import merge_inventory
from services.state.mirror.gpu_overlay import GpuOverlay
from services.state.mirror.numa_overlay import NumaOverlay
from services.state.mirror.pod_index import PodIndex
from services.state.mirror.problems import (
    INVALID_REASONS,
    STAGE_REASONS,
    WAITING_FOR_MIN_MEMBER,
    Problem,
    ProblemKind,
)
from services.state.mirror.queue_tree import valid_queues
from services.state.mirror.raw_objects import (
    JOBS,
    KINDS,
    NAMESPACES,
    NODES,
    PODGROUPS,
    PODS,
    PRIORITY_CLASSES,
    QUEUES,
    SINGULAR,
    TOPOLOGIES,
    RawObjects,
    group_of,
    name_of,
    only_status,
)
from services.state.mirror.stages import StageVerdicts
from services.state.mirror.translations import Translations
from services.state.mirror.volume_mirror import StorageMirror
from services.state.sources.kv_objects import Change, Obj, key_of
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import GpuTelemetry
from shared.contracts.inventory import GpuInventory
from shared.errors import InvalidObject
from shared.kube import keys, translate, wire
from shared.kube.translate.podgroups import podgroup_restated
from shared.kube.translate.pods import pod_moved
from shared.kube.values import shown
from shared.model import Node, Pod, PodGroup, Queue

__all__ = ["Mirror"]

_STAGE_HOLDS = frozenset(STAGE_REASONS.values())


@dataclass
class Mirror:
    """Raw objects by kind and name, their translations, and what KV holds."""

    scheduler_name: str = "kai-scheduler"
    node_pool_label_key: str = keys.NODE_POOL_LABEL
    """The label naming a podgroup's node pool (a backed-off PodGroup is held back in its pool only)."""
    raw: RawObjects = field(default_factory=RawObjects)
    current: dict[str, Obj] = field(default_factory=dict)
    """What this mirror last told KV (by KV key)."""
    translations: Translations = field(default_factory=Translations)
    """The cached translations, and each object's problem decoding or translating it
    (`services.state.mirror.translations`)."""
    held: dict[str, str] = field(default_factory=dict)
    """Object -> why it is held back from KV although it translates (recomputed with the object: a queue's by
    every full flush, a podgroup's or a pod's whenever it is dirty)."""
    stages: StageVerdicts = field(default_factory=StageVerdicts)
    """The verdicts of the podgroups with `kairos.io/after`."""
    gpus: GpuOverlay = field(default_factory=GpuOverlay)
    """The node agents' inventories and telemetry."""
    foreign: ForeignPods = field(default_factory=ForeignPods)
    """What pods Kairos does not schedule hold on each node."""
    numa: NumaOverlay = field(default_factory=NumaOverlay)
    """The nodes' NodeResourceTopology objects, laid over them as `Node.numa` (`services.state.mirror.numa_overlay`)."""
    storage: StorageMirror = field(default_factory=StorageMirror)
    """Claims, volumes, storage classes, CSINodes and capacities, written as they are
    (`services.state.mirror.volume_mirror`)."""
    dra: DraMirror = field(default_factory=DraMirror)
    """DeviceClasses, ResourceSlices, ResourceClaims and templates, written as they are
    (`services.state.mirror.dra_mirror`)."""
    _dirty: dict[str, set[str]] = field(default_factory=lambda: {kind: set() for kind in KINDS})
    pod_index: PodIndex = field(default_factory=PodIndex)
    """The members of each podgroup, and the ungrouped and gated pods (`services.state.mirror.pod_index`)."""
    _full: bool = True
    """The next flush recomputes everything (it marks every object dirty: `_mark_everything`): at start,
    after a relist, and when a queue, priority class or topology changed (they reach every podgroup).
    Otherwise a flush recomputes only the podgroups, pods, nodes and namespaces that changed, and what
    depends on them (a namespace: nothing else)."""
    full_flushes: int = 0
    """Flushes that recomputed everything (the rest recomputed only what changed)."""
    _queues: dict[str, Queue] = field(default_factory=dict)
    """The valid queues as of the last flush."""
    _groups: dict[str, PodGroup] = field(default_factory=dict)
    """The podgroups in KV as of the last flush, by "ns/name"."""
    _short: dict[str, Problem] = field(default_factory=dict)
    """Label -> the WaitingForMinMember problem of each podgroup in KV with fewer pods than its min member."""
    _recount: set[str] = field(default_factory=set)
    """Podgroups whose members or translation changed since `reportable` last counted them (counting every
    podgroup every round cost more than any other part of the report)."""
    _keys: dict[tuple[str, str], str] = field(default_factory=dict)
    """(kind, name) -> the KV key its object is under, for podgroups and nodes in KV."""
    _pod_keys: dict[str, str] = field(default_factory=dict)
    """Pod name -> its KV key, for the pods in KV (a pod held back may be counted in `foreign` instead)."""
    refusal_sources: list[Mapping[str, str]] = field(default_factory=list)
    """The pod-work loops' refusals ("pod ns/name" -> why), reported on the pods like a translation problem
    (`services.state.controllers.podwork.PodWorkLoop.refusals`): a pod the pod-grouper cannot group is held back as
    ungrouped, and this is what tells its owner why."""
    refusal_owners: list[Mapping[str, translate.InvolvedObject]] = field(default_factory=list)
    """The owners those refusals name, by pod label (`PodWorkLoop.refusal_owners`): told too."""
    _held_reasons: dict[str, str] = field(default_factory=dict)
    """Footprint label -> the Event reason when it is not the kind's Invalid* one (a waiting stage)."""
    _pod_sets: dict[str, tuple[PodGroup, frozenset[str]]] = field(default_factory=dict)
    """Podgroup "ns/name" -> (its translation, the names of its pod sets), for the sub-group label check."""
    _resources_touched: set[str] = field(default_factory=set)
    """Podgroups whose object, translation or pods changed since the write-back last took them
    (`take_resources_touched`)."""
    _resources_all: bool = True
    """Every podgroup is touched: at start, after a relist or a full flush, and when a node's GPU memory label
    changed (what a fractional pod on it holds)."""

    @property
    def problems(self) -> dict[str, str]:
        """Object ("pod ns/name", "queue q") -> what is wrong with it (it did not decode or translate)."""
        return self.translations.problems

    @property
    def unforeseen(self) -> list[str]:
        """Tracebacks of decodings and translations that failed with an exception other than
        `InvalidObject` (a Kairos bug that one object's content reaches) since the owner last drained them
        to its log; the object is held back like an invalid one, and everything else goes on."""
        return self.translations.unforeseen

    @property
    def unforeseen_total(self) -> int:
        return self.translations.unforeseen_total

    # --- input ------------------------------------------------------------------------------------------
    def relist(self, kind: str, objects: Iterable[bytes]) -> None:
        """Replace everything held of `kind` by a fresh list."""
        fresh: dict[str, Any] = {}
        for data in objects:
            obj = self.translations.decode(kind, data)
            if obj is not None:
                fresh[name_of(obj)] = obj
        old = self.raw[kind]
        for gone in old.keys() - fresh.keys():
            self._forget(kind, gone)
        if kind == PODGROUPS:
            self.stages.relisted(fresh)
        elif kind in (PODS, JOBS):
            self.stages.relisted()
        self._dirty[kind].update(old.keys() | fresh.keys())
        self.raw[kind] = fresh
        self._full = True
        self._resources_all = True
        if kind == PODS:
            self._recount.update(self.pod_index.clear())
            self.foreign.reindex()
            for name, pod in fresh.items():
                self._pod_changed(name, None, pod)

    def change(self, kind: str, event: str, data: bytes) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        obj = self.translations.decode(kind, data)
        if obj is None:
            return
        name = name_of(obj)
        objects = self.raw[kind]
        before = objects.get(name)
        if event == "DELETED":
            objects.pop(name, None)
            self._forget(kind, name)
        else:
            objects[name] = obj
        after = objects.get(name)
        if kind == PODS:
            self._pod_changed(name, before, after)
            old_group, new_group = group_of(before), group_of(after)
            self.stages.pod_changed(old_group, new_group)
            if old_group is not None:
                self._resources_touched.add(old_group)
            if new_group is not None and new_group != old_group:
                self._resources_touched.add(new_group)
        elif kind == PODGROUPS:
            self._resources_touched.add(name)
            self.stages.group_changed(name, before, after)
            if self._restated(name, before, after):
                return
        elif kind == JOBS:
            self.stages.job_changed(name)
        elif kind in (QUEUES, PRIORITY_CLASSES, TOPOLOGIES) and not only_status(before, after):
            self._full = True
        elif kind == NODES and _gpu_memory_label(before) != _gpu_memory_label(after):
            self._resources_all = True
        self._dirty[kind].add(name)

    def inventory(self, inventory: GpuInventory) -> None:
        """A node agent's inventory arrived."""
        self.gpus.inventory(inventory)
        self._dirty[NODES].add(inventory.node)

    def telemetry(self, telemetry: GpuTelemetry) -> None:
        """A node agent's telemetry arrived: folded into the decayed averages; the node is looked at again
        only when the change is worth a write."""
        written = self.current.get(s.node_key(telemetry.node))
        if self.gpus.telemetry(telemetry, written.gpu_devices if isinstance(written, Node) else None):
            self._dirty[NODES].add(telemetry.node)

    def topologies_changed(self, nodes: Iterable[str]) -> None:
        """The NodeResourceTopology of these nodes came, went or changed (`numa`): write them again."""
        self._dirty[NODES].update(nodes)

    def touch_nodes(self) -> None:
        """Re-examine every node at the next flush (an inventory may have gone stale meanwhile)."""
        self._dirty[NODES].update(self.raw.nodes)

    def _pod_changed(self, name: str, before: wire.Pod | None, after: wire.Pod | None) -> None:
        """Keep the pod indexes up to date: podgroup members, ungrouped and gated pods, GPU groups."""
        self._recount.update(self.pod_index.track(name, before, after, self.scheduler_name))
        self._dirty[PODS].update(self.foreign.track(name, before, after))

    # --- output -----------------------------------------------------------------------------------------
    def take_resources_touched(self) -> set[str]:
        """The podgroups ("ns/name") whose ``resourcesStatus`` may have changed since the last call: those
        whose PodGroup, translation or pods (joined, left, changed) changed; every podgroup held after a
        relist, a full flush or a node's GPU memory label changing. The write-back's sweep recounts these
        (`services.state.controllers.writeback`), where it once recounted every podgroup each time."""
        touched = self._resources_touched
        self._resources_touched = set()
        if self._resources_all:
            self._resources_all = False
            touched.update(self.raw.podgroups)
        return touched

    def members(self, namespace: str, podgroup: str) -> list[wire.Pod]:
        """The pods (raw) that belong to a podgroup, by name."""
        names = self.pod_index.members.get(f"{namespace}/{podgroup}", ())
        pods = self.raw.pods
        return [pods[n] for n in sorted(names) if n in pods]

    def node_count(self) -> int:
        return len(self.raw.nodes)

    def ungrouped(self) -> list[wire.Pod]:
        """Pods of this scheduler, alive and without a podgroup: the pod-grouper's work, oldest first (by
        creation time, then name), so the order does not depend on the order the watch told of them."""
        pods = self.raw.pods
        waiting = [(name, pods[name]) for name in self.pod_index.ungrouped if name in pods]
        waiting.sort(key=lambda item: (item[1].metadata.creation_timestamp or "", item[0]))
        return [pod for _, pod in waiting]

    def ungatable(self) -> list[wire.Pod]:
        """Pods carrying the `kairos.io/after` gate whose podgroup may run (its dependencies succeeded, or it
        has none): the gate keeper's work. A pod without a podgroup yet, or whose podgroup has not been
        seen, keeps its gate until the mirror knows what its podgroup waits for."""
        pods = self.raw.pods
        out = []
        for name in self.pod_index.gated:
            pod = pods.get(name)
            if pod is None or (group := translate.podgroup_name_of(pod)) is None:
                continue
            key = f"{pod.metadata.namespace}/{group}"
            if key in self.raw.podgroups and self.stages.may_lift(key):
                out.append(pod)
        return out

    def flush(self, now: float) -> list[Change]:
        """The changes that bring KV from `current` to what the mirror's objects make of it now (`now`: epoch
        seconds, the agents' clock, decides which GPU inventories are stale); `current` then holds it.

        One path computes every flush (`_recompute`): a full one (`_full`) marks every object dirty
        (`_mark_everything`), recomputes the queues and topologies too, and removes from KV whatever it
        held that nothing produced (objects adopted from KV that are gone, removed queues and topologies)."""
        if not any(self._dirty.values()) and not self.storage.dirty and not self.dra.dirty:
            return []
        self._dirty[PODGROUPS].update(self.stages.decide(self.raw.podgroups, self.raw.jobs, self.members))
        full = self._full
        if full:
            self._full = False
            self.full_flushes += 1
            self._mark_everything()
        touched = self._recompute(now, full)
        for dirty in self._dirty.values():
            dirty.clear()
        if full:
            for key in [key for key in self.current if key not in touched]:
                touched[key] = None
        changes = []
        for key, obj in touched.items():
            before = self.current.get(key)
            if obj is None:
                if before is not None:
                    del self.current[key]
                    changes.append(Change(key, before, None))
            elif before != obj:
                self.current[key] = obj
                changes.append(Change(key, before, obj))
        return changes

    def adopt(self, objects: Mapping[str, Obj]) -> None:
        """Start from what KV holds (a restarted owner): the first flush then writes only differences."""
        self.current = dict(objects)
        self._full = True

    def reportable(self) -> dict[str, Problem]:
        """Queues, PodGroups and pods of ours held back for a fault of their own (not translating, an
        unknown or cyclic parent, an unknown queue), and gangs with fewer pods than their min member, by
        label: what the write-back shows as Events and conditions. A pod held only because its podgroup is
        is left out (the podgroup carries the problem)."""
        found: dict[str, Problem] = {}
        kinds: dict[str, ProblemKind] = {"queue": "Queue", "podgroup": "PodGroup", "pod": "Pod"}
        refused = [item for source in self.refusal_sources for item in source.items()]
        refused_labels = {label for label, _ in refused}
        for label, message in (*refused, *self.problems.items(), *self.held.items()):
            singular, _, name = label.partition(" ")
            kind = kinds.get(singular)
            if kind is None or label in found:
                continue
            if kind == "Pod":
                raw_pod = self.raw.pods.get(name)
                if (
                    (label in self.held and label not in refused_labels)
                    or raw_pod is None
                    or raw_pod.spec.scheduler_name != self.scheduler_name
                ):
                    continue
            namespace, _, short = name.rpartition("/")
            owner = (
                next((o[label] for o in self.refusal_owners if label in o), None) if kind == "Pod" else None
            )
            found[label] = Problem(
                kind=kind,
                namespace=namespace,
                name=short,
                reason=self._held_reasons.get(label, INVALID_REASONS[kind]),
                message=message,
                owner=owner,
            )
        for name in self._recount:
            problem = self._short_of(name)
            if problem is None:
                self._short.pop(f"podgroup {name}", None)
            else:
                self._short[f"podgroup {name}"] = problem
        self._recount.clear()
        found.update(self._short)
        return found

    def _short_of(self, name: str) -> Problem | None:
        """The WaitingForMinMember problem of podgroup `name` if it is in KV with fewer pods than it needs."""
        group = self._groups.get(name)
        if group is None:
            return None
        # Every pod counts, finished ones too (a Job whose pods completed is not short of its gang), as in
        # `shared.model.validate`.
        have = len(self.pod_index.members.get(name, ()))
        if have == 0:
            return None
        need = group.root.min_pods()
        if have >= need:
            return None
        return Problem(
            kind="PodGroup",
            namespace=group.namespace,
            name=group.name,
            reason=WAITING_FOR_MIN_MEMBER,
            message=(
                f"PodGroup {name!r}: spec.minMember: waiting for min member: {have} of {need} pods "
                "exist; the gang is placed whole or not at all"
            ),
        )

    # --- helpers ----------------------------------------------------------------------------------------
    def _mark_everything(self) -> None:
        """Mark every object dirty for a full flush: those the mirror holds, and those the last flush wrote
        (an object that went was marked when it went; these are marked again so its key and what it counted
        go whatever the way it went)."""
        self._dirty[NAMESPACES].update(self.raw.namespaces)
        self._dirty[PODGROUPS].update(self.raw.podgroups.keys() | self._groups.keys())
        self._dirty[PODS].update(self.raw.pods.keys() | self._pod_keys.keys())
        self._dirty[NODES].update(self.raw.nodes)
        self._dirty[NODES].update(name for kind, name in self._keys if kind == "node")
        self.storage.dirty.update(self.storage.objects)
        self.dra.dirty.update(self.dra.objects)
        self._resources_all = True

    def _recompute(self, now: float, full: bool) -> dict[str, Obj | None]:
        """What KV should hold under the keys the dirty objects touch (None: nothing), with the bookkeeping
        (keys, holds, foreign pods, the podgroups in KV) kept up to date; everything else stays as it is.
        Namespaces, podgroups, pods and nodes are recomputed when dirty (and the pods of a dirty podgroup, the
        nodes whose foreign usage moved); the queues and topologies, which reach every podgroup, only by a
        `full` flush, which marks every object dirty."""
        out: dict[str, Obj | None] = dict(self.storage.drain())
        out.update(self.dra.drain())
        if full:
            self._recompute_cluster_wide(out)
        for name in self._dirty[NAMESPACES]:
            raw_namespace = self.raw.namespaces.get(name)
            out[s.namespace_key(name)] = (
                None if raw_namespace is None else translate.namespace_of(raw_namespace)
            )
        translate_group = self._podgroup_translator()
        pods = set(self._dirty[PODS])
        nodes = set(self._dirty[NODES])
        self._recount.update(self._dirty[PODGROUPS])
        # A podgroup's translation (its preemptibility, which the count reads) is made here, after the
        # change that touched it may have been counted already.
        self._resources_touched.update(self._dirty[PODGROUPS])
        for name in self._dirty[PODGROUPS]:
            pods.update(self.pod_index.members.get(name, ()))
            self._groups.pop(name, None)
            self._release(f"podgroup {name}")
            old_key = self._keys.pop(("podgroup", name), None)
            if old_key is not None:
                out[old_key] = None
            raw_group = self.raw.podgroups.get(name)
            if raw_group is None:
                continue
            group = translate_group(name, raw_group)
            if group is None:
                continue
            if not self._may_schedule(name, group, self._queues):
                continue
            self._groups[name] = group
            self._keys[("podgroup", name)] = key = key_of(group)
            out[key] = group
        for name in pods:
            before = self._pod_keys.pop(name, None)
            if before is not None:
                out.setdefault(before, None)
            counted_on = self.foreign.uncount(name)
            if counted_on is not None:
                nodes.add(counted_on)
            self.held.pop(f"pod {name}", None)
            raw_pod = self.raw.pods.get(name)
            if raw_pod is None:
                continue
            pod = self._pod(name, raw_pod, self._groups)
            if isinstance(pod, Pod):
                self._pod_keys[name] = key = key_of(pod)
                out[key] = pod
            elif pod is not None:
                self.foreign.count(name, *pod)
                nodes.add(pod[0])
        for name in nodes:
            old_key = self._keys.pop(("node", name), None)
            if old_key is not None:
                out.setdefault(old_key, None)
            used = self.foreign.on(name)
            if name not in self.raw.nodes:
                continue
            node = self._node(name, used, now)
            if node is not None:
                self._keys[("node", name)] = key = key_of(node)
                out[key] = node
        return out

    def _may_schedule(self, name: str, group: PodGroup, queues: Mapping[str, Queue]) -> bool:
        """Whether the podgroup goes to KV: its queue is valid and its dependencies succeeded; otherwise it
        is held with the reason."""
        if group.queue not in queues:
            self.held[f"podgroup {name}"] = _unknown_queue(
                name,
                group.queue,
                self.held.get(f"queue {group.queue}") or self.problems.get(f"queue {group.queue}"),
            )
            return False
        if (stage := self.stages.hold(name)) is not None:
            reason, message = stage
            self.held[f"podgroup {name}"] = message
            self._held_reasons[f"podgroup {name}"] = reason
            return False
        return True

    def _release(self, label: str) -> None:
        self.held.pop(label, None)
        self._held_reasons.pop(label, None)

    def _recompute_cluster_wide(self, out: dict[str, Obj | None]) -> None:
        """The topologies and the valid queues into `out`, their holds recomputed (`_queues` kept)."""
        for topology in self.raw.topologies.values():
            translated = self.translations.translate(
                f"topology {name_of(topology)}", topology, partial(translate.topology_of, topology)
            )
            if translated is not None:
                out[key_of(translated)] = translated
        for label in [label for label in self.held if label.startswith("queue ")]:
            self._release(label)
        self._queues = self._valid_queues()
        for queue in self._queues.values():
            out[key_of(queue)] = queue

    def _valid_queues(self) -> dict[str, Queue]:
        ordered = sorted(
            self.raw.queues.items(), key=lambda item: (item[1].metadata.creation_timestamp or "", item[0])
        )
        translated: dict[str, Queue] = {}
        for index, (name, raw_queue) in enumerate(ordered):
            queue = self.translations.translate(
                f"queue {name}",
                (raw_queue, index),
                partial(translate.queue_of, raw_queue, creation_index=index),
            )
            if queue is not None:
                translated[name] = queue
        valid, held = valid_queues(translated, lambda name: f"queue {name}" in self.problems)
        self.held.update(held)
        return valid

    def _pod(
        self, name: str, raw_pod: wire.Pod, groups: Mapping[str, PodGroup]
    ) -> Pod | tuple[str, Footprint] | None:
        """A pod of ours in a known podgroup, or (node, what it holds there) for a pod that holds a node
        without being in KV (`services.state.mirror.foreign`), or nothing. A pod of ours not in KV is held with
        the reason."""
        ours = raw_pod.spec.scheduler_name == self.scheduler_name
        group_name = translate.podgroup_name_of(raw_pod) if ours else None
        group_key = f"{raw_pod.metadata.namespace}/{group_name}" if group_name else None
        if ours and group_key is not None and group_key in groups:
            sub_group = raw_pod.metadata.labels.get(keys.SUBGROUP_LABEL)
            label = f"pod {name}"
            if sub_group:
                sets = self._sub_groups_of(group_key, groups[group_key])
                source: tuple[object, ...] = (raw_pod, group_key, sets)
                make = partial(_pod_in, raw_pod, group_key, sets)
            else:
                source = (raw_pod, group_key)
                make = partial(translate.pod_of, raw_pod, podgroup=group_key)
            pod = self.translations.translate(label, source, partial(self._moved_or, label, source, make))
            if isinstance(pod, Pod):
                return pod
        if ours and group_key is None:
            self.held[f"pod {name}"] = f"pod {name}: waiting for its podgroup (pod-grouper)"
        elif (
            ours
            and group_key is not None
            and group_key not in groups
            and self._held_reasons.get(f"podgroup {group_key}") in _STAGE_HOLDS
            and (stage := self.stages.decisions.get(group_key)) is not None
        ):
            self.held[f"pod {name}"] = (
                f"pod {name}: {stage.reason} ({AFTER_ANNOTATION} of podgroup {group_key})"
            )
        elif ours and group_key not in groups:
            why = self.held.get(f"podgroup {group_key}") or self.problems.get(f"podgroup {group_key}")
            self.held[f"pod {name}"] = (
                f"pod {name}: podgroup {group_key} is not scheduled: {why}"
                if why
                else f"pod {name}: podgroup {group_key} does not exist (yet)"
            )
        return self.foreign.holding(raw_pod)

    def _moved_or(self, label: str, source: tuple[object, ...], make: Callable[[], Pod]) -> Pod:
        """The pod's last translation brought to its new raw object when only its node and status moved
        (`translate.pod_moved`: a bind, the kubelet's Running) and nothing else it was translated from
        changed; otherwise `make()`, the whole translation."""
        last = self.translations.last(label)
        if last is not None:
            before, translated = last
            if (
                isinstance(before, tuple)
                and isinstance(translated, Pod)
                and isinstance(raw := source[0], wire.Pod)
                and isinstance(before[0], wire.Pod)
                and before[1:] == source[1:]
                and (moved := pod_moved(before[0], translated, raw)) is not None
            ):
                return moved
        return make()

    def _restated(self, name: str, before: wire.PodGroup | None, after: wire.PodGroup | None) -> bool:
        """Whether a podgroup's change leaves its translation exactly as it is (only its status moved: the
        write-back patches it about once per bound pod; `translate.podgroup_restated`): its cached translation
        then stands as made from `after`, and the podgroup is not looked at again. Nothing else a dirty
        podgroup recomputes reads the status: its pods, its holds (the stages have their own look,
        `StageVerdicts.group_changed`), its count of members."""
        if before is None or after is None:
            return False
        label = f"podgroup {name}"
        last = self.translations.last(label)
        if last is None:
            return False
        source, translated = last
        if not (isinstance(source, tuple) and source[0] is before and isinstance(translated, PodGroup)):
            return False
        if podgroup_restated(before, translated, after, self.node_pool_label_key) is not translated:
            return False
        self.translations.remade(label, (after, *source[1:]))
        return True

    def _sub_groups_of(self, key: str, group: PodGroup) -> frozenset[str]:
        """The names of podgroup `key`'s pod sets (its leaf sub-groups, or the default one), computed once
        per translation of the podgroup."""
        cached = self._pod_sets.get(key)
        if cached is not None and cached[0] is group:
            return cached[1]
        names = frozenset(ps.name for ps in group.root.all_pod_sets())
        self._pod_sets[key] = (group, names)
        return names

    def _node(self, name: str, used: Footprint | None, now: float) -> Node | None:
        """The node as KV should hold it: translated, corrected by a fresh inventory and carrying the
        telemetry (`gpus`), less what foreign pods hold on it."""
        raw_node = self.raw.nodes[name]
        inventory = self.gpus.fresh_inventory(name, now)
        node = self.translations.translate(
            f"node {name}",
            (raw_node, inventory),
            partial(_merged, raw_node, inventory),
        )
        if node is None:
            return None
        node = self.numa.attach(node)
        written = self.current.get(key_of(node))
        devices = self.gpus.devices(
            name, inventory, written.gpu_devices if isinstance(written, Node) else (), now
        )
        if devices:
            node = msgspec.structs.replace(node, gpu_devices=devices)
        return node if used is None else subtract(node, used)

    def _podgroup_translator(self) -> Callable[[str, wire.PodGroup], PodGroup | None]:
        """Translate podgroups (through the cache) with the priority classes the mirror holds now: a
        podgroup's priority and preemptibility come from its class, or the cluster's default one."""
        priorities = {name: int(pc.value) for name, pc in self.raw.priorityclasses.items()}
        fallback = translate.default_priority(self.raw.priorityclasses.values())

        def podgroup(name: str, raw_group: wire.PodGroup) -> PodGroup | None:
            return self.translations.translate(
                f"podgroup {name}",
                (raw_group, priorities, fallback),
                partial(
                    translate.podgroup_of,
                    raw_group,
                    priority_classes=priorities,
                    default_priority=fallback,
                    node_pool_label_key=self.node_pool_label_key,
                ),
            )

        return podgroup

    def _forget(self, kind: str, name: str) -> None:
        """Drop what is remembered of an object that is gone."""
        self.translations.forget(f"{SINGULAR[kind]} {name}")
        if kind == PODGROUPS:
            self._pod_sets.pop(name, None)


def _merged(raw_node: wire.Node, inventory: GpuInventory | None) -> Node:
    """The node translated, corrected by its agent's fresh inventory (`services.state.mirror.gpu_inventory`)."""
    return merge_inventory(translate.node_of(raw_node), inventory)


def _unknown_queue(name: str, queue: str, why: str | None) -> str:
    if why:
        return f"PodGroup {name!r}: spec.queue: queue {queue!r} is held back ({why})"
    return f"PodGroup {name!r}: spec.queue: queue {queue!r} does not exist"


def _pod_in(raw_pod: wire.Pod, group_key: str, sub_groups: frozenset[str]) -> Pod:
    """The pod translated, unless its ``kai.scheduler/subgroup-name`` label names a sub-group its podgroup
    does not have: KAI v0.15 then leaves that pod alone out of scheduling (the rest of the gang is not held
    for it) and tells why on the pod."""
    name = raw_pod.metadata.labels.get(keys.SUBGROUP_LABEL, "")
    if name not in sub_groups:
        raise InvalidObject(
            "Pod",
            name_of(raw_pod),
            f"metadata.labels[{keys.SUBGROUP_LABEL}]",
            f"podgroup {group_key} has no sub-group {shown(name)} (it has: {', '.join(sorted(sub_groups))})",
        )
    return translate.pod_of(raw_pod, podgroup=group_key)


def _gpu_memory_label(node: Any) -> str | None:
    """A raw node's GPU memory label (None: no node), which a fractional pod's share is counted from."""
    return None if node is None else node.metadata.labels.get(keys.GPU_MEMORY_LABEL)
