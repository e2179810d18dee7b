"""Live GPU use per device: decayed averages and health from the agents' telemetry, folded into `Node`.

Pure functions (no clock, no I/O): time is always a value passed in. Called by the state service, by the
Kubernetes mirror when a `GpuTelemetry` arrives (`observe`) and when it rebuilds a node (`fold`), and by
the simulated cluster (`simulated_telemetry` makes the readings from the pods placed there).

- Use and memory pressure are exponentially decayed averages with a half-life (`HALF_LIFE_S`): a sample
  `elapsed` seconds after the previous one weighs `1 - 0.5 ** (elapsed / half_life)`, so the average
  follows a change within a few half-lives whatever the agent's period, and a burst shorter than a
  period moves it little.
- Health: a device is unhealthy from the first reading with a critical XID error, uncorrected ECC errors
  or no answer from NVML, with that reason; it stays unhealthy (sticky) until `HEALTHY_PERIODS`
  consecutive readings are clean, so a device that flaps does not get work between two failures.
- Hysteresis (`needs_rewrite`): the state service rewrites a node only when a device's decayed use or
  memory moved by `REWRITE_POINTS` or more, or a device's health changed: every node write wakes every
  replica and the queue, and telemetry every few seconds must not churn the state bucket.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping

import msgspec

from shared.contracts.gpu_telemetry import DeviceTelemetry, GpuTelemetry
from shared.errors import InvalidObject
from shared.kube import values
from shared.model import Node, Pod
from shared.model.objects import DeviceUsage

__all__ = [
    "HALF_LIFE_S",
    "HEALTHY_PERIODS",
    "REWRITE_POINTS",
    "SIM_TELEMETRY_LABEL",
    "UNHEALTHY_GPUS_LABEL",
    "DeviceAverage",
    "NodeUsage",
    "decayed",
    "fold",
    "groups_of",
    "needs_rewrite",
    "observe",
    "place_on_devices",
    "settle",
    "simulated_telemetry",
    "usage_of",
]

HALF_LIFE_S = 30.0
"""Seconds after which a sample's weight in the average has halved."""
HEALTHY_PERIODS = 3
"""Clean readings in a row before a device that was unhealthy takes work again."""
REWRITE_POINTS = 10.0
"""Percentage points a device's decayed use or memory must move before its node is rewritten."""
STALE_PERIODS = 3.0
"""Telemetry older than this many of its agent's periods is ignored (the agent stopped reporting)."""
SIM_TELEMETRY_LABEL = "kairos.io/simulated-telemetry"
"""On a node of the simulated cluster: `true` makes the cluster report telemetry for its GPUs."""
UNHEALTHY_GPUS_LABEL = "kairos.io/simulated-unhealthy-gpus"
"""On a simulated node: comma-separated device indexes that report XID 79 (fallen off the bus)."""


class DeviceAverage(msgspec.Struct, frozen=True, kw_only=True):
    """What the state service remembers of one device between telemetry readings."""

    index: int
    uuid: str = ""
    utilisation_pct: float | None = None
    """Decayed utilisation; None until a reading had it."""
    memory_pct: float | None = None
    """Decayed memory used / total; None until a reading had both."""
    healthy: bool = True
    reason: str = ""
    clean_readings: int = 0
    """Clean readings in a row since the device was last unhealthy."""
    temperature_c: float | None = None
    power_w: float | None = None
    """The latest readings as they came (shown, not averaged)."""


class NodeUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One node's devices after the latest telemetry reading at `time` (the agent's clock)."""

    node: str
    time: float
    period: float
    devices: tuple[DeviceAverage, ...] = ()


def decayed(previous: float | None, sample: float | None, elapsed: float, half_life: float) -> float | None:
    """The average after `sample` arrives `elapsed` seconds after the previous one: the previous average
    weighs `0.5 ** (elapsed / half_life)`. A missing sample keeps the average; the first sample is it."""
    if sample is None:
        return previous
    if previous is None:
        return sample
    keep: float = 0.5 ** (max(elapsed, 0.0) / half_life)
    return keep * previous + (1.0 - keep) * sample


def _problem(reading: DeviceTelemetry) -> str:
    if not reading.responding:
        return f"not responding: {reading.error}" if reading.error else "not responding"
    if reading.xid_errors:
        return "XID " + ", ".join(str(code) for code in reading.xid_errors)
    if reading.ecc_uncorrected:
        return f"{reading.ecc_uncorrected} uncorrected ECC errors"
    return ""


def _memory_pct(reading: DeviceTelemetry) -> float | None:
    used, total = reading.memory_used_mib, reading.memory_total_mib
    if used is None or not total:
        return None
    return min(100.0, max(0.0, 100.0 * used / total))


def _percent(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return min(100.0, max(0.0, value))


def _next(
    before: DeviceAverage | None,
    reading: DeviceTelemetry,
    elapsed: float,
    half_life: float,
    healthy_periods: int,
) -> DeviceAverage:
    problem = _problem(reading)
    if before is None or before.uuid != reading.uuid:
        before = DeviceAverage(index=reading.index, uuid=reading.uuid)
    if problem:
        healthy, reason, clean = False, problem, 0
    elif before.healthy:
        healthy, reason, clean = True, "", before.clean_readings + 1
    else:
        clean = before.clean_readings + 1
        healthy = clean >= healthy_periods
        reason = "" if healthy else before.reason
    return DeviceAverage(
        index=reading.index,
        uuid=reading.uuid,
        utilisation_pct=decayed(
            before.utilisation_pct, _percent(reading.utilisation_pct), elapsed, half_life
        ),
        memory_pct=decayed(before.memory_pct, _memory_pct(reading), elapsed, half_life),
        healthy=healthy,
        reason=reason,
        clean_readings=clean,
        temperature_c=reading.temperature_c,
        power_w=reading.power_w,
    )


def observe(
    usage: NodeUsage | None,
    telemetry: GpuTelemetry,
    half_life: float = HALF_LIFE_S,
    healthy_periods: int = HEALTHY_PERIODS,
) -> NodeUsage | None:
    """The node's usage after `telemetry`. A reading whose `error` says NVML could not be used tells
    nothing (the usage stays); one older than the usage is dropped (messages can cross). Devices are
    matched by index and UUID: a device whose UUID changed is a new device."""
    if telemetry.error:
        return usage
    if not (math.isfinite(half_life) and half_life > 0):
        raise InvalidObject(
            "gpu usage", telemetry.node, "half_life", f"must be seconds > 0, got {half_life!r}"
        )
    if usage is not None and usage.node != telemetry.node:
        raise InvalidObject(
            "gpu telemetry",
            telemetry.node,
            "node",
            f"is the telemetry of {telemetry.node!r}, not {usage.node!r}",
        )
    if usage is not None and telemetry.time < usage.time:
        return usage
    elapsed = telemetry.time - usage.time if usage is not None else 0.0
    before = {d.index: d for d in usage.devices} if usage is not None else {}
    devices = tuple(
        _next(before.get(reading.index), reading, elapsed, half_life, healthy_periods)
        for reading in sorted(telemetry.devices, key=lambda d: d.index)
    )
    return NodeUsage(node=telemetry.node, time=telemetry.time, period=telemetry.period, devices=devices)


def is_stale(usage: NodeUsage, now: float, periods: float = STALE_PERIODS) -> bool:
    """Whether more than `periods` of the agent's periods have passed since the latest reading."""
    age = now - usage.time
    return not math.isfinite(age) or age > periods * usage.period


def usage_of(usage: NodeUsage, groups: Mapping[int, str] | None = None) -> tuple[DeviceUsage, ...]:
    """The devices as `Node.gpu_devices` holds them, rounded to a tenth of a point; `groups` maps a device
    index to the shared-GPU group on it, where the source knows it."""
    groups = groups or {}
    return tuple(
        DeviceUsage(
            index=d.index,
            uuid=d.uuid,
            utilisation_pct=round(d.utilisation_pct or 0.0, 1),
            memory_pct=round(d.memory_pct or 0.0, 1),
            healthy=d.healthy,
            reason=d.reason,
            gpu_group=groups.get(d.index, ""),
        )
        for d in usage.devices
    )


def needs_rewrite(
    written: tuple[DeviceUsage, ...], new: tuple[DeviceUsage, ...], points: float = REWRITE_POINTS
) -> bool:
    """Whether the node's devices changed enough to write the node again (see the module docstring)."""
    if len(written) != len(new):
        return True
    for old, now in zip(written, new, strict=True):
        if (old.index, old.uuid, old.healthy, old.gpu_group, old.excluded) != (
            now.index,
            now.uuid,
            now.healthy,
            now.gpu_group,
            now.excluded,
        ):
            return True
        if abs(old.utilisation_pct - now.utilisation_pct) >= points:
            return True
        if abs(old.memory_pct - now.memory_pct) >= points:
            return True
    return False


def settle(
    written: tuple[DeviceUsage, ...], fresh: tuple[DeviceUsage, ...], points: float = REWRITE_POINTS
) -> tuple[DeviceUsage, ...]:
    """What a node's `gpu_devices` should hold: `fresh` once it differs enough from what was `written`,
    else `written` unchanged (see `needs_rewrite`)."""
    return fresh if needs_rewrite(written, fresh, points) else written


def fold(node: Node, devices: tuple[DeviceUsage, ...], points: float = REWRITE_POINTS) -> Node:
    """`node` with `devices` as its measured GPUs, or `node` itself (the same object) while the change is
    below the hysteresis threshold."""
    if not needs_rewrite(node.gpu_devices, devices, points):
        return node
    return msgspec.structs.replace(node, gpu_devices=devices)


# --- the simulated cluster's telemetry -------------------------------------------------------------------
WHOLE_GPU_UTILISATION = 85.0
WHOLE_GPU_MEMORY = 70.0
NOISE_POINTS = 4.0


Occupancy = dict[int, str]
"""Simulated device index -> what holds it: `group:<id>` (a shared-GPU group) or `pod:<key>:<k>` (the k-th
device of a whole-GPU pod)."""


def place_on_devices(node: Node, pods: Iterable[Pod], previous: Mapping[int, str] | None = None) -> Occupancy:
    """Which simulated device each shared group and whole-GPU pod of the node holds. What held a device
    before (`previous`) and is still there keeps it, as a real device stays with its pod; newcomers take the
    lowest free healthy devices (a device plugin hands out no unhealthy device), groups by id then pods by
    key. Occupants beyond the node's healthy devices are left out."""
    wanted: list[str] = []
    for pod in pods:
        if pod.gpu.is_shared and pod.gpu_groups:
            wanted.extend(f"group:{g}" for g in pod.gpu_groups if f"group:{g}" not in wanted)
        elif pod.gpu.is_whole and pod.gpu.devices > 0:
            wanted.extend(f"pod:{pod.key}:{k}" for k in range(pod.gpu.devices))
    present = set(wanted)
    held = {i: o for i, o in (previous or {}).items() if o in present and 0 <= i < node.gpus}
    broken = _unhealthy_indexes(node)
    free = [i for i in range(node.gpus) if i not in held and i not in broken]
    placed = set(held.values())
    newcomers = sorted(o for o in present if o not in placed and o.startswith("group:"))
    newcomers += sorted(o for o in present if o not in placed and o.startswith("pod:"))
    held.update(zip(free, newcomers, strict=False))
    return held


def groups_of(occupancy: Mapping[int, str]) -> dict[int, str]:
    """Device index -> the shared-GPU group on it."""
    return {i: o.removeprefix("group:") for i, o in occupancy.items() if o.startswith("group:")}


def _share(pod: Pod, node: Node) -> tuple[float, float]:
    if pod.gpu.is_fraction:
        return pod.gpu.fraction, pod.gpu.fraction
    if pod.gpu.is_memory:
        part = min(1.0, pod.gpu.memory_mib / node.gpu_memory_mib) if node.gpu_memory_mib else 0.0
        return part, part
    return WHOLE_GPU_UTILISATION / 100.0, WHOLE_GPU_MEMORY / 100.0


def _unhealthy_indexes(node: Node) -> set[int]:
    raw = node.labels.get(UNHEALTHY_GPUS_LABEL, "")
    out: set[int] = set()
    for part in raw.split(","):
        try:
            out.add(values.whole(part.strip(), low=0, high=1023))
        except values.InvalidValueError:
            continue
    return out


def simulated_telemetry(
    node: Node,
    pods: Iterable[Pod],
    now: float,
    period: float,
    seed: int = 0,
    previous: Mapping[int, str] | None = None,
) -> tuple[GpuTelemetry, Occupancy]:
    """What an agent would report for a simulated node at `now`: each device used as its pods ask (a
    fraction's share, or `WHOLE_GPU_*` for a whole-GPU pod), plus noise of up to `NOISE_POINTS` seeded by
    (seed, node, reading), so the same inputs give the same telemetry. Devices listed in the node's
    `UNHEALTHY_GPUS_LABEL` report XID 79. Returns the telemetry and the devices' occupancy
    (`place_on_devices` from the `previous` one), which the caller keeps for the next reading."""
    pods = list(pods)
    occupancy = place_on_devices(node, pods, previous)
    by_occupant: dict[str, list[Pod]] = {}
    for pod in pods:
        if pod.gpu.is_shared:
            for g in pod.gpu_groups:
                by_occupant.setdefault(f"group:{g}", []).append(pod)
        elif pod.gpu.is_whole:
            for k in range(pod.gpu.devices):
                by_occupant[f"pod:{pod.key}:{k}"] = [pod]
    on = {i: by_occupant.get(o, []) for i, o in occupancy.items()}
    rng = random.Random(f"{seed}/{node.name}/{round(now / period) if period > 0 else now}")
    broken = _unhealthy_indexes(node)
    devices = []
    for index in range(node.gpus):
        compute = memory = 0.0
        for pod in on.get(index, []):
            c, m = _share(pod, node)
            compute += c
            memory += m
        noise = rng.uniform(-NOISE_POINTS, NOISE_POINTS)
        utilisation = min(100.0, max(0.0, 100.0 * compute + noise)) if compute > 0 else max(0.0, noise)
        used = min(1.0, memory) * node.gpu_memory_mib
        devices.append(
            DeviceTelemetry(
                index=index,
                uuid=f"GPU-sim-{node.name}-{index}",
                utilisation_pct=round(utilisation, 1),
                memory_used_mib=int(used),
                memory_total_mib=node.gpu_memory_mib,
                temperature_c=round(35.0 + 0.45 * utilisation, 1),
                power_w=round(70.0 + 6.3 * utilisation, 1),
                xid_errors=(79,) if index in broken else (),
            )
        )
    return GpuTelemetry(
        node=node.name, time=now, period=period, devices=tuple(devices), xid_events=True
    ), occupancy
