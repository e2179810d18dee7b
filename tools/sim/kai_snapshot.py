"""KAI's own snapshot (what its snapshot plugin's ``GET /get-snapshot`` answers) read as a Kairos snapshot,
so that ``kairos simulate kai-snapshot.zip`` replays a KAI cluster.

KAI's file is a zip holding ``snapshot.json``: ``config`` (the SchedulerConfiguration: ``actions``, plugin
``tiers``, ``queueDepthPerAction``), ``schedulerParams`` (scheduler name, ``partitionParams`` with the node
pool, ...) and ``rawObjects``, the Kubernetes objects its cache listed, each list under its own key and
without ``apiVersion``/``kind`` (Go's JSON of typed objects). They go through the state service's own
mirror (`services.state.mirror.cache.Mirror`: `shared.kube.translate`, the storage and DRA mirrors, priority
classes resolved, pods of other schedulers counted on their nodes, objects whose references do not
resolve held back), as if its informers had listed them, and what it would write to KV is the cluster.

Read: pods, nodes, queues, podGroups, priorityClasses, topologies, persistentVolumeClaims,
storageClasses, csiStorageCapacities, resourceClaims, resourceSlices, deviceClasses; from the
configuration the actions in their order, ``queueDepthPerAction``, the scheduler name and the node pool.
Not read: bindRequests (a pod KAI's binder is still binding replays as pending), configMaps, csiDrivers,
the plugin tiers and their arguments (the replay runs Kairos's defaults: KAI's default plugins), and the
discovery section. KAI's snapshot has no PersistentVolumes, CSINodes or Namespaces (pod affinity
namespace selectors see namespaces without labels) and no capture time (the caller gives one: the file's
modification time). Objects that do not translate are left out and listed (`KaiImport.problems`).
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import msgspec

from services.state.mirror.cache import Mirror
from shared.core.node_pool import EVERYTHING, NodePool
from shared.core.policy import Policy
from shared.errors import InvalidObject
from shared.model.gather import snapshot_of
from shared.snapshot_file import CapturedSnapshot, Header, ShardCapture, kairos_version

__all__ = ["KIND", "MEMBER", "KaiImport", "is_zip", "read_kai_snapshot"]

KIND = "KAI snapshot"
MEMBER = "snapshot.json"
"""The one file KAI's zip holds (its plugin's ``SnapshotFileName``)."""
MAX_MEMBER = 2**31
"""Bytes `MEMBER` may expand to (2 GiB), as for Kairos's own files."""
_ZIP_MAGIC = b"PK\x03\x04"

CLUSTER_KINDS = {
    "nodes": "nodes",
    "pods": "pods",
    "queues": "queues",
    "podGroups": "podgroups",
    "priorityClasses": "priorityclasses",
    "topologies": "topologies",
}
"""``rawObjects`` key -> the mirror's kind."""
STORAGE_KINDS = {
    "persistentVolumeClaims": "persistentvolumeclaims",
    "storageClasses": "storageclasses",
    "csiStorageCapacities": "csistoragecapacities",
}
DRA_KINDS = {
    "resourceClaims": "resourceclaims",
    "resourceSlices": "resourceslices",
    "deviceClasses": "deviceclasses",
}
NOT_READ = ("bindRequests", "configMaps", "csiDrivers")


class KaiImport(msgspec.Struct, frozen=True, kw_only=True):
    """A KAI snapshot read as a Kairos one, with what was not carried over."""

    captured: CapturedSnapshot
    problems: dict[str, str] = msgspec.field(default_factory=dict)
    """Object ("pod ns/name") -> why it is not in the cluster (it did not decode or translate)."""
    held: dict[str, str] = msgspec.field(default_factory=dict)
    """Object -> why the mirror holds it back although it translates (an unknown queue...)."""
    not_read: dict[str, int] = msgspec.field(default_factory=dict)
    """``rawObjects`` key -> how many objects of it were not read (see the module docstring)."""


def is_zip(data: bytes) -> bool:
    return data.startswith(_ZIP_MAGIC)


def read_kai_snapshot(data: bytes, name: str, *, captured_at: float) -> KaiImport:
    """KAI's snapshot zip `data` (named `name` in errors) as a Kairos snapshot captured at `captured_at`.
    Anything else raises `InvalidObject(KIND, name, field, problem)`."""
    document = _document(data, name)
    raw = _section(document, name, "rawObjects")
    params = _section(document, name, "schedulerParams")
    scheduler = params.get("schedulerName") or "kai-scheduler"
    if not isinstance(scheduler, str):
        raise InvalidObject(KIND, name, "schedulerParams.schedulerName", "expected a string")
    pool = _pool(params.get("partitionParams"), name)
    mirror = Mirror(
        scheduler_name=scheduler, node_pool_label_key=pool.label_key or Mirror.node_pool_label_key
    )
    for key, kind in CLUSTER_KINDS.items():
        mirror.relist(kind, _items(raw, key, name))
    for key, kind in STORAGE_KINDS.items():
        mirror.storage.relist(kind, _items(raw, key, name))
    for key, kind in DRA_KINDS.items():
        mirror.dra.relist(kind, _items(raw, key, name))
    mirror.flush(captured_at)
    cluster = snapshot_of(mirror.current.values())
    policy = _policy(document.get("config"), name)
    captured = CapturedSnapshot(
        header=Header(
            kairos_version=kairos_version(), captured_at=captured_at, source=f"KAI snapshot {name}"
        ),
        cluster=cluster,
        shards=(ShardCapture(shard="default", pool=pool, policy=policy),),
    )
    not_read = {key: len(raw.get(key) or ()) for key in NOT_READ if raw.get(key)}
    return KaiImport(
        captured=captured,
        problems=dict(sorted(mirror.problems.items())),
        held=dict(sorted(mirror.held.items())),
        not_read=not_read,
    )


def _document(data: bytes, name: str) -> dict[str, Any]:
    if not is_zip(data):
        raise InvalidObject(KIND, name, "", "not a zip archive (KAI's snapshot plugin answers one)")
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            try:
                member = archive.getinfo(MEMBER)
            except KeyError:
                raise InvalidObject(KIND, name, "", f"the zip holds no {MEMBER}") from None
            if member.file_size > MAX_MEMBER:
                raise InvalidObject(KIND, name, MEMBER, f"expands beyond {MAX_MEMBER} bytes")
            text = archive.read(member)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        raise InvalidObject(KIND, name, "", f"truncated or corrupt zip ({exc})") from exc
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidObject(KIND, name, MEMBER, f"malformed JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise InvalidObject(KIND, name, MEMBER, "expected a JSON object")
    return document


def _section(document: dict[str, Any], name: str, key: str) -> dict[str, Any]:
    value = document.get(key) or {}
    if not isinstance(value, dict):
        raise InvalidObject(KIND, name, key, "expected an object")
    return value


def _items(raw: dict[str, Any], key: str, name: str) -> list[bytes]:
    """The objects of one list, each as the JSON the mirror decodes (a list that is not one is refused)."""
    items = raw.get(key)
    if items is None:
        return []
    if not isinstance(items, list):
        raise InvalidObject(KIND, name, f"rawObjects.{key}", "expected a list")
    return [json.dumps(item).encode() for item in items]


def _pool(params: object, name: str) -> NodePool:
    """``partitionParams`` (Go field names, no JSON tags) as a node pool: no key, every node."""
    if params is None:
        return EVERYTHING
    if not isinstance(params, dict):
        raise InvalidObject(KIND, name, "schedulerParams.partitionParams", "expected an object")
    key = params.get("NodePoolLabelKey") or ""
    value = params.get("NodePoolLabelValue") or ""
    if not isinstance(key, str) or not isinstance(value, str):
        raise InvalidObject(
            KIND, name, "schedulerParams.partitionParams", "expected string label key and value"
        )
    return NodePool(label_key=key, value=value) if key else EVERYTHING


def _policy(config: object, name: str) -> Policy:
    """Kairos's defaults with the configuration's actions (in order) and queue depths."""
    if config is None:
        return Policy()
    if not isinstance(config, dict):
        raise InvalidObject(KIND, name, "config", "expected an object")
    fields: dict[str, Any] = {}
    actions = config.get("actions")
    if actions:
        if not isinstance(actions, str):
            raise InvalidObject(KIND, name, "config.actions", "expected a comma-separated string")
        fields["actions"] = tuple(a.strip() for a in actions.split(",") if a.strip())
    depths = config.get("queueDepthPerAction")
    if depths:
        fields["queue_depth_per_action"] = depths
    try:
        return msgspec.convert({**msgspec.structs.asdict(Policy()), **fields}, Policy)
    except (msgspec.ValidationError, ValueError) as exc:
        field = "config.actions" if "action" in str(exc) and "depth" not in str(exc) else "config"
        raise InvalidObject(KIND, name, field, str(exc)) from exc
