"""Folds a node agent's GPU inventory into the scheduler's `Node`, and says which inventories are stale.

Pure functions (no clock, no I/O), called by the state service when an inventory arrives on
`subjects.gpu_inventory(node)` and when it rebuilds a node from Kubernetes.

Who is right about what: Kubernetes allocatable is what the kubelet advertises from the device plugin, and
only that can be bound, so the agent never raises a count above it. The agent knows health and memory, so
it lowers the count to the devices that are healthy and sets the per-device memory:

- `gpus = min(allocatable, healthy units)`, where a unit is what the device plugin hands out as one
  `nvidia.com/gpu` under the node's MIG strategy: a healthy GPU (no strategy, or `none`); a healthy GPU
  without MIG (`mixed`, whose MIG devices are `nvidia.com/mig-*` resources); a healthy GPU without MIG or a
  healthy MIG device of a healthy GPU (`single`).
- `gpu_memory_mib` = the smallest healthy unit's memory (a fractional or memory request must fit on any
  device), capped by what the node's GFD label (`nvidia.com/gpu.memory`) says: the agent lowers the
  memory, never raises it. Without the label (`gpu_memory_synced` False) the agent's measurement is the
  only one and is taken; `gpu_memory_synced = True` once the agent has reported it.
- `mig_enabled` = any device has MIG mode on now.
- each `nvidia.com/mig-<profile>` scalar = `min(allocatable, healthy MIG devices of that profile on healthy
  GPUs)`; left as Kubernetes says when a healthy MIG device has a profile the agent could not name.

No inventory, or one whose `error` says NVML could not be used, tells nothing about the devices: the node
stays as Kubernetes describes it. A stale inventory (`is_stale`) should be treated as no inventory; so is
one dated more than `MAX_CLOCK_SKEW` ahead of the reader, or whose period is not seconds up to
`MAX_PERIOD` (either would otherwise stay fresh for ever).

`mark_excluded` tells the live telemetry's devices (`Node.gpu_devices`) which of them the inventory already
took out of `gpus`, so that the core's unhealthy-device filter does not take them out twice.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

import msgspec

from shared.contracts.inventory import MAX_CLOCK_SKEW, MAX_PERIOD, GpuDevice, GpuInventory, MigDevice
from shared.errors import InvalidObject
from shared.model import Node
from shared.model.objects import DeviceUsage

__all__ = ["STALE_PERIODS", "is_stale", "mark_excluded", "merge_inventory", "stale_nodes"]

STALE_PERIODS = 3.0
"""An inventory is stale once this many of its agent's periods have passed without a newer one."""

_MIG_RESOURCE = "mig-"


def _units(devices: tuple[GpuDevice, ...], strategy: str | None) -> list[GpuDevice | MigDevice]:
    healthy = [d for d in devices if d.healthy]
    if strategy == "mixed":
        return [d for d in healthy if not d.mig_enabled]
    if strategy == "single":
        units: list[GpuDevice | MigDevice] = []
        for device in healthy:
            if device.mig_enabled:
                units.extend(m for m in device.mig_devices if m.healthy)
            else:
                units.append(device)
        return units
    return list(healthy)


def _mig_scalars(node: Node, devices: tuple[GpuDevice, ...]) -> dict[str, float]:
    migs = [m for d in devices if d.healthy and d.mig_enabled for m in d.mig_devices if m.healthy]
    if any(not m.profile for m in migs):
        return node.scalars
    counts = Counter(m.profile for m in migs)
    return {
        name: min(value, float(counts[name.rsplit(_MIG_RESOURCE, 1)[-1]])) if _MIG_RESOURCE in name else value
        for name, value in node.scalars.items()
    }


def merge_inventory(node: Node, inventory: GpuInventory | None) -> Node:
    """`node` (as Kubernetes describes it) corrected by its agent's `inventory`; see the module docstring."""
    if inventory is None or inventory.error:
        return node
    if inventory.node != node.name:
        raise InvalidObject(
            "gpu inventory",
            inventory.node,
            "node",
            f"is the inventory of {inventory.node!r}, not {node.name!r}",
        )
    units = _units(inventory.devices, node.mig_strategy)
    memories = [unit.memory_mib for unit in units if unit.memory_mib > 0]
    memory = node.gpu_memory_mib
    if memories:
        # The label (synced) caps what the agent measured; without one the measurement is all there is.
        memory = min(memory, *memories) if node.gpu_memory_synced else min(memories)
    return msgspec.structs.replace(
        node,
        gpus=min(node.gpus, len(units)),
        gpu_memory_mib=memory,
        gpu_memory_synced=True if memories else node.gpu_memory_synced,
        mig_enabled=any(d.mig_enabled for d in inventory.devices),
        scalars=_mig_scalars(node, inventory.devices),
    )


def is_stale(inventory: GpuInventory, now: float, periods: float = STALE_PERIODS) -> bool:
    """Whether more than `periods` of the agent's periods have passed since `inventory.time`.

    `now` is on the same clock as the agent's (wall clock, seconds since the epoch); an inventory up to
    `MAX_CLOCK_SKEW` from the future is not stale (clock skew), one further ahead is, and so is one whose
    period is not seconds in (0, `MAX_PERIOD`].
    """
    age = now - inventory.time
    period = inventory.period
    if not (math.isfinite(age) and math.isfinite(period) and 0 < period <= MAX_PERIOD):
        return True
    return age < -MAX_CLOCK_SKEW or age > periods * period


def stale_nodes(
    inventories: Mapping[str, GpuInventory], now: float, periods: float = STALE_PERIODS
) -> list[str]:
    """The nodes (keys of `inventories`, each node's latest inventory) whose inventory is stale, sorted."""
    return sorted(node for node, inventory in inventories.items() if is_stale(inventory, now, periods))


def mark_excluded(
    devices: tuple[DeviceUsage, ...], inventory: GpuInventory | None
) -> tuple[DeviceUsage, ...]:
    """`devices` with `excluded` set on those the (fresh) `inventory` reports unhealthy, matched by UUID
    (by index when either side lacks one): `merge_inventory` already left them out of the node's `gpus`."""
    if inventory is None or inventory.error or not devices:
        return devices
    sick = {d.uuid or f"#{d.index}" for d in inventory.devices if not d.healthy}
    if not sick:
        return devices
    return tuple(
        msgspec.structs.replace(d, excluded=True) if (d.uuid or f"#{d.index}") in sick else d for d in devices
    )
