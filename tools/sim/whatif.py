"""What-if changes to a captured snapshot: the flags of `kairos simulate`, parsed and applied; pure.

`parse_*` read one flag's value (errors are `InvalidObject("flag", "--add-nodes", "", problem)`, naming the
flag and what is wrong with its value); `WhatIf.apply` makes the changes to the snapshot's cluster and
shards, refusing a queue or node the snapshot does not hold by name. `tools.sim.replay` then schedules the
result.

- ``--add-nodes COUNT:SHAPE``: COUNT new nodes. SHAPE is either ``like=NODE`` (copies of a node of the
  snapshot: its capacity, labels and taints; its GPU telemetry is left out) or a list of
  ``gpu=8,cpu=64,memory=512Gi`` (cpu in cores or millicores, ``500m``; memory and ``gpu-memory`` as
  Kubernetes quantities, ``gpu-memory`` per device, default 80Gi), optionally with ``pool=NAME`` (the node
  pool label of the shards, ``kai.scheduler/node-pool`` by default), ``label=KEY=VALUE`` (repeatable),
  ``max-pods=N`` and ``prefix=NAME`` (the new nodes' names, ``PREFIX-0``... ; default ``whatif``); the
  two combine: ``like=node-3,gpu=4,pool=b``.
- ``--remove-node NAME``: the node leaves; the pods on it are pending again (their controllers recreate
  them), as when a node is deleted.
- ``--cordon NAME``: the node is unschedulable (kubectl cordon's ``node.kubernetes.io/unschedulable``
  taint): what runs there stays, nothing new lands.
- ``--queue-quota QUEUE:RESOURCE=VALUE``, ``--queue-limit ...``, ``--queue-weight ...``: a queue's
  deserved quota, limit or over-quota weight of ``gpu``, ``cpu`` (cores) or ``memory`` (a quantity);
  ``unlimited`` (or -1) for a quota or limit without bound.
- ``--strategy binpack|spread``: every shard's placement strategy, for GPUs and CPU, as a SchedulingShard's
  ``placementStrategy`` sets it (the device order plugin gpupack or gpuspread, gpusharingorder with binpack
  only, and the consolidation action only with binpack, as KAI's operator derives them).
- ``--time-based-fair-share on|off``: with ``on``, the queues' recorded usage shifts their over-quota
  shares (kValue); a snapshot without recorded usage takes what each queue holds at the capture as its
  usage, as if it had held it the whole window. ``off`` drops the usage.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

import msgspec

from shared.core.node_pool import in_pool
from shared.core.policy import KNOWN_ACTIONS, Placement, PluginConfig, Policy, QueueUsage
from shared.core.queue_plan import plan_queues
from shared.errors import InvalidObject
from shared.kube.kai_plugins import DEFAULT_PRIORITIES
from shared.kube.keys import NODE_POOL_LABEL, UNSCHEDULABLE_TAINT
from shared.kube.quantity import QuantityError, parse_quantity
from shared.kube.values import InvalidValueError, decimal, whole
from shared.model import Node, PodStatus, Queue, QueueResource, Snapshot
from shared.model.objects import UNLIMITED, Taint
from shared.snapshot_file import CapturedSnapshot, ShardCapture

__all__ = [
    "AddNodes",
    "QueueChange",
    "WhatIf",
    "parse_add_nodes",
    "parse_queue_change",
    "parse_switch",
]

SETTINGS = {"quota": "--queue-quota", "limit": "--queue-limit", "weight": "--queue-weight"}
RESOURCES = ("gpu", "cpu", "memory")
SHAPE_KEYS = ("like", "gpu", "cpu", "memory", "gpu-memory", "max-pods", "pool", "label", "prefix")
DEFAULT_GPU_MEMORY_MIB = 81_920
"""An 80 GB device (an H100's or A100's), when a shape names GPUs but not their memory."""
DEFAULT_PREFIX = "whatif"
MAX_ADDED_NODES = 100_000


def _flag_error(flag: str, problem: str) -> InvalidObject:
    return InvalidObject("flag", flag, "", problem)


@dataclass(frozen=True)
class AddNodes:
    """``--add-nodes COUNT:SHAPE`` read (see the module docstring)."""

    text: str
    count: int
    like: str | None = None
    gpus: int | None = None
    cpu_millis: float | None = None
    memory_bytes: float | None = None
    gpu_memory_mib: int | None = None
    max_pods: int | None = None
    pool: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    prefix: str = DEFAULT_PREFIX


@dataclass(frozen=True)
class QueueChange:
    """``--queue-quota|limit|weight QUEUE:RESOURCE=VALUE`` read; `value` in the model's units."""

    text: str
    setting: Literal["quota", "limit", "weight"]
    queue: str
    resource: Literal["gpu", "cpu", "memory"]
    value: float

    @property
    def flag(self) -> str:
        return SETTINGS[self.setting]


def _quantity(flag: str, key: str, text: str) -> Fraction:
    try:
        amount = parse_quantity(text)
    except QuantityError as exc:
        raise _flag_error(flag, f"{key}={text}: {exc}") from exc
    if amount < 0:
        raise _flag_error(flag, f"{key}={text}: must not be negative")
    return amount


def _count(flag: str, key: str, text: str, low: int = 0) -> int:
    """ASCII digits within Go's int64 (`shared.kube.values.whole`: not int()'s "٣", "1_000" or " 5")."""
    try:
        value = whole(text, low=-(2**63), high=2**63 - 1)
    except InvalidValueError:
        raise _flag_error(flag, f"{key}={text}: expected a whole number") from None
    if value < low:
        raise _flag_error(flag, f"{key}={text}: must be at least {low}")
    return value


def parse_add_nodes(text: str, flag: str = "--add-nodes") -> AddNodes:
    """``COUNT:SHAPE`` (module docstring); a malformed count, key or quantity names the flag and the item."""
    count_text, sep, shape = text.partition(":")
    if not sep or not shape:
        raise _flag_error(
            flag, f"{text!r}: expected COUNT:SHAPE, e.g. 16:gpu=8,cpu=64,memory=512Gi or 4:like=node-3"
        )
    count = _count(flag, "COUNT", count_text.strip(), low=1)
    if count > MAX_ADDED_NODES:
        raise _flag_error(flag, f"COUNT={count}: at most {MAX_ADDED_NODES} nodes")
    values: dict[str, object] = {"labels": {}}
    labels: dict[str, str] = {}
    for item in shape.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or not key:
            raise _flag_error(flag, f"{item!r}: expected KEY=VALUE (keys: {', '.join(SHAPE_KEYS)})")
        if key in ("label", "labels"):
            name, eq2, label_value = value.partition("=")
            if not eq2 or not name:
                raise _flag_error(flag, f"{item!r}: expected label=KEY=VALUE")
            labels[name] = label_value
            continue
        if key not in SHAPE_KEYS:
            raise _flag_error(flag, f"unknown key {key!r} (keys: {', '.join(SHAPE_KEYS)})")
        if key in values:
            raise _flag_error(flag, f"{key!r} given twice")
        match key:
            case "like" | "pool" | "prefix":
                if not value:
                    raise _flag_error(flag, f"{key}=: expected a name")
                values[key] = value
            case "gpu":
                values[key] = _count(flag, key, value)
            case "max-pods":
                values[key] = _count(flag, key, value, low=1)
            case "cpu":
                values[key] = float(_quantity(flag, key, value) * 1000)
            case "memory":
                values[key] = float(_quantity(flag, key, value))
            case "gpu-memory":
                amount = _quantity(flag, key, value)
                # A number without a unit ("80000", "100.5", "8e4") is MiB, the model's unit (and that of
                # KAI's gpu-memory annotation); a quantity with a unit ("80Gi") is converted from bytes.
                mib = amount / 2**20 if value.strip()[-1:].isalpha() else amount
                values[key] = max(1, int(mib))
    if "like" not in values and not any(k in values for k in ("gpu", "cpu", "memory")):
        raise _flag_error(
            flag, f"{text!r}: the shape names no capacity (give like=NODE or gpu=, cpu=, memory=)"
        )
    if "like" not in values and ("cpu" not in values or "memory" not in values):
        raise _flag_error(flag, f"{text!r}: a new node needs cpu= and memory= (or like=NODE)")

    def get_int(key: str) -> int | None:
        value = values.get(key)
        return value if isinstance(value, int) else None

    def get_float(key: str) -> float | None:
        value = values.get(key)
        return value if isinstance(value, float) else None

    def get_str(key: str) -> str | None:
        value = values.get(key)
        return value if isinstance(value, str) else None

    return AddNodes(
        text=text,
        count=count,
        like=get_str("like"),
        gpus=get_int("gpu"),
        cpu_millis=get_float("cpu"),
        memory_bytes=get_float("memory"),
        gpu_memory_mib=get_int("gpu-memory"),
        max_pods=get_int("max-pods"),
        pool=get_str("pool"),
        labels=labels,
        prefix=get_str("prefix") or DEFAULT_PREFIX,
    )


def parse_queue_change(setting: Literal["quota", "limit", "weight"], text: str) -> QueueChange:
    """``QUEUE:RESOURCE=VALUE`` for `setting`; a malformed value names the flag."""
    flag = SETTINGS[setting]
    queue, sep, rest = text.partition(":")
    resource, eq, value = rest.partition("=")
    if not sep or not eq or not queue or not value:
        raise _flag_error(flag, f"{text!r}: expected QUEUE:RESOURCE=VALUE, e.g. team-b:gpu=8")
    resource = resource.strip()
    if resource not in RESOURCES:
        raise _flag_error(flag, f"{text!r}: resource {resource!r}, expected one of {', '.join(RESOURCES)}")
    value = value.strip()
    amount: float
    if setting != "weight" and value in ("unlimited", "-1"):
        amount = UNLIMITED
    elif setting == "weight":
        try:  # `shared.kube.values.decimal`: not float()'s "nan", "1_0" or "٣"
            amount = decimal(value, low=-math.inf, high=math.inf)
        except InvalidValueError:
            raise _flag_error(flag, f"{text!r}: weight {value!r} is not a number") from None
        if amount < 0:
            raise _flag_error(flag, f"{text!r}: weight must be a finite number >= 0")
    else:
        quantity = _quantity(flag, resource, value)
        amount = float(quantity * 1000) if resource == "cpu" else float(quantity)
    return QueueChange(text=text, setting=setting, queue=queue.strip(), resource=resource, value=amount)  # type: ignore[arg-type]


def parse_switch(flag: str, text: str) -> bool:
    """``on`` / ``off`` (and true/false, yes/no, 1/0)."""
    lowered = text.strip().lower()
    if lowered in ("on", "true", "yes", "1"):
        return True
    if lowered in ("off", "false", "no", "0"):
        return False
    raise _flag_error(flag, f"{text!r}: expected on or off")


@dataclass(frozen=True)
class WhatIf:
    """Every change asked for; empty: replay the snapshot as it is."""

    add_nodes: tuple[AddNodes, ...] = ()
    remove_nodes: tuple[str, ...] = ()
    cordon: tuple[str, ...] = ()
    queue_changes: tuple[QueueChange, ...] = ()
    strategy: Placement | None = None
    time_based_fair_share: bool | None = None

    def describe(self) -> list[str]:
        """One line per change, as the flags gave it."""
        lines = [f"--add-nodes {a.text}" for a in self.add_nodes]
        lines += [f"--remove-node {n}" for n in self.remove_nodes]
        lines += [f"--cordon {n}" for n in self.cordon]
        lines += [f"{c.flag} {c.text}" for c in self.queue_changes]
        if self.strategy is not None:
            lines.append(f"--strategy {self.strategy}")
        if self.time_based_fair_share is not None:
            lines.append(f"--time-based-fair-share {'on' if self.time_based_fair_share else 'off'}")
        return lines

    def apply(
        self, captured: CapturedSnapshot, cluster: Snapshot, now: float
    ) -> tuple[Snapshot, tuple[ShardCapture, ...]]:
        """`cluster` (the captured scheduling view) and the captured shards with the changes made; a
        node or queue the snapshot does not hold is refused naming the flag."""
        nodes = {node.name: node for node in cluster.nodes}
        for name, flag in [(n, "--remove-node") for n in self.remove_nodes] + [
            (n, "--cordon") for n in self.cordon
        ]:
            if name not in nodes:
                raise _flag_error(flag, f"no node {name!r} in the snapshot{_some(nodes)}")
        queues = {queue.name: queue for queue in cluster.queues}
        for change in self.queue_changes:
            if change.queue not in queues:
                raise _flag_error(change.flag, f"no queue {change.queue!r} in the snapshot{_some(queues)}")
        for added in self.add_nodes:
            if added.like is not None and added.like not in nodes:
                raise _flag_error(
                    "--add-nodes", f"like={added.like}: no node {added.like!r} in the snapshot{_some(nodes)}"
                )

        pool_key = _pool_label_key(captured)
        new_nodes = [n for n in cluster.nodes if n.name not in self.remove_nodes]
        cordoned = set(self.cordon)
        new_nodes = [_cordoned(n) if n.name in cordoned else n for n in new_nodes]
        taken = {n.name for n in cluster.nodes}
        for added in self.add_nodes:
            new_nodes += _new_nodes(added, nodes, taken, pool_key)

        gone = set(self.remove_nodes)
        pods = tuple(
            msgspec.structs.replace(p, status=PodStatus.PENDING, node=None, gpu_groups=())
            if p.node in gone and p.status not in (PodStatus.SUCCEEDED, PodStatus.FAILED)
            else p
            for p in cluster.pods
        )
        new_queues = dict(queues)
        for change in self.queue_changes:
            new_queues[change.queue] = _changed_queue(new_queues[change.queue], change)
        changed = msgspec.structs.replace(
            cluster,
            nodes=tuple(sorted(new_nodes, key=lambda n: n.name)),
            pods=pods,
            queues=tuple(new_queues[q.name] for q in cluster.queues),
        )
        shards = tuple(self._shard(captured, cluster, shard, now) for shard in captured.shards)
        return changed, shards

    def _shard(
        self, captured: CapturedSnapshot, cluster: Snapshot, shard: ShardCapture, now: float
    ) -> ShardCapture:
        policy = msgspec.structs.replace(shard.policy, queue_usage=captured.queue_usage)
        if self.strategy is not None:
            policy = with_strategy(policy, self.strategy)
        if self.time_based_fair_share is False:
            policy = msgspec.structs.replace(policy, queue_usage=())
        elif self.time_based_fair_share and not policy.queue_usage:
            policy = msgspec.structs.replace(
                policy, queue_usage=usage_from_allocation(in_pool(cluster, shard.pool), now, policy)
            )
        return msgspec.structs.replace(shard, policy=policy)


def _some(names: Mapping[str, object]) -> str:
    shown = sorted(names)[:8]
    if not shown:
        return " (it has none)"
    more = f", ... ({len(names)} in all)" if len(names) > len(shown) else ""
    return f" (it has {', '.join(shown)}{more})"


def _pool_label_key(captured: CapturedSnapshot) -> str:
    for shard in captured.shards:
        if shard.record is not None:
            return shard.record.node_pool_label_key
    return NODE_POOL_LABEL


def _cordoned(node: Node) -> Node:
    if any(t.key == UNSCHEDULABLE_TAINT for t in node.taints):
        return node
    return msgspec.structs.replace(node, taints=(*node.taints, Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")))


def _new_nodes(added: AddNodes, nodes: Mapping[str, Node], taken: set[str], pool_key: str) -> list[Node]:
    base = nodes[added.like] if added.like is not None else None
    labels = dict(base.labels) if base is not None else {}
    labels.update(added.labels)
    if added.pool is not None:
        labels[pool_key] = added.pool
    out: list[Node] = []
    index = 0
    while len(out) < added.count:
        name = f"{added.prefix}-{index}"
        index += 1
        if name in taken:
            continue
        taken.add(name)
        node_labels = {**labels}
        if "kubernetes.io/hostname" in node_labels or base is None:
            node_labels["kubernetes.io/hostname"] = name
        gpus = added.gpus if added.gpus is not None else (base.gpus if base is not None else 0)
        fields = {
            "name": name,
            "cpu_millis": added.cpu_millis
            if added.cpu_millis is not None
            else base.cpu_millis
            if base
            else 0.0,
            "memory_bytes": added.memory_bytes
            if added.memory_bytes is not None
            else base.memory_bytes
            if base
            else 0.0,
            "gpus": gpus,
            "labels": node_labels,
        }
        if added.gpu_memory_mib is not None:
            fields["gpu_memory_mib"] = added.gpu_memory_mib
        elif base is None and gpus:
            fields["gpu_memory_mib"] = DEFAULT_GPU_MEMORY_MIB
        if added.max_pods is not None:
            fields["max_pods"] = added.max_pods
        if base is not None:
            node = msgspec.structs.replace(base, gpu_devices=(), numa=None, used_host_ports=(), **fields)
        else:
            node = Node(**fields)  # type: ignore[arg-type]
        out.append(node)
    return out


def _changed_queue(queue: Queue, change: QueueChange) -> Queue:
    resource: QueueResource = getattr(queue, change.resource)
    field_name = {"quota": "quota", "limit": "limit", "weight": "over_quota_weight"}[change.setting]
    updated = msgspec.structs.replace(resource, **{field_name: change.value})
    return msgspec.structs.replace(queue, **{change.resource: updated})


def with_strategy(policy: Policy, strategy: Placement) -> Policy:
    """`policy` with the placement strategy a SchedulingShard's ``placementStrategy: {gpu: S, cpu: S}``
    gives: the policy's placement switches, and in an explicit plugin list the device order plugin
    (gpupack / gpuspread), gpusharingorder (binpack only) and nodeplacement's arguments; consolidation
    runs only with binpack (KAI's operator leaves it out when a strategy is spread)."""
    device = "gpupack" if strategy == "binpack" else "gpuspread"
    plugins = policy.plugins
    if plugins is not None:
        kept: list[PluginConfig] = []
        for plugin in plugins:
            if plugin.name in ("gpupack", "gpuspread", "gpusharingorder"):
                continue
            kept.append(
                msgspec.structs.replace(
                    plugin, arguments={**plugin.arguments, "gpu": strategy, "cpu": strategy}
                )
                if plugin.name == "nodeplacement"
                else plugin
            )
        kept.append(PluginConfig(name=device, priority=DEFAULT_PRIORITIES[device]))
        if strategy == "binpack":
            kept.append(PluginConfig(name="gpusharingorder", priority=DEFAULT_PRIORITIES["gpusharingorder"]))
        plugins = tuple(sorted(kept, key=lambda p: (-(p.priority or 0), p.name)))
    actions: Sequence[str] = policy.actions
    if strategy == "spread":
        actions = [a for a in actions if a != "consolidation"]
    elif "consolidation" not in actions:
        wanted = set(actions) | {"consolidation"}
        actions = [a for a in KNOWN_ACTIONS if a in wanted] + [a for a in actions if a not in KNOWN_ACTIONS]
    return msgspec.structs.replace(
        policy,
        gpu_placement=strategy,
        cpu_placement=strategy,
        gpu_device_placement=strategy,
        plugins=plugins,
        actions=tuple(actions),
    )


def usage_from_allocation(cluster: Snapshot, now: float, policy: Policy) -> tuple[QueueUsage, ...]:
    """Each queue's share of the cluster's capacity it holds now, per resource: the usage time-based fair
    share would have recorded had the queues held the same for the whole window."""
    plan = plan_queues(cluster, now, msgspec.structs.replace(policy, queue_usage=()))
    total = plan.total

    def part(held: float, of: float) -> float:
        return min(1.0, max(0.0, held / of)) if of > 0 else 0.0

    return tuple(
        QueueUsage(
            queue=share.queue,
            gpu=part(share.allocated.gpu, total.gpu),
            cpu=part(share.allocated.cpu, total.cpu),
            memory=part(share.allocated.memory, total.memory),
        )
        for share in plan.shares
    )
