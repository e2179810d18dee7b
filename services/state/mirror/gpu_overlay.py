"""The node agents' view of each node's GPUs, laid over what Kubernetes advertises.

Owned by the mirror (`services.state.mirror.cache.Mirror`): the Kubernetes source hands it every inventory
(`kairos.gpu.inventory.<node>`) and telemetry reading (`kairos.gpu.telemetry.<node>`) a node agent sends,
and the mirror asks it for each node it rebuilds. While an agent's latest inventory is fresh it corrects the
node's GPU count and memory (`fresh_inventory`, merged by `services.state.mirror.gpu_inventory.merge_inventory`:
unhealthy devices are not handed out, memory per device is measured); while its telemetry is fresh each
device carries its decayed use and health (`devices`, from `services.state.mirror.gpu_usage`), rewritten only when
a device moved by `REWRITE_POINTS` or its health changed, so telemetry every few seconds does not churn KV.
An agent not heard from for three of its periods no longer counts. Pure: no I/O; `now` (epoch seconds, the
agents' clock) is an argument.

Before a report reaches the overlay, the Kubernetes source asks `refusal` whether to believe it: an agent
speaks only for the node its subject names (the subject is what NATS lets the agent's user publish on),
only about now (`MAX_CLOCK_SKEW`) and with a period of at most `MAX_PERIOD`; docs/security.md, "Trust
boundaries".
"""

from __future__ import annotations

import math

from services.state.mirror.gpu_inventory import is_stale, mark_excluded
from services.state.mirror.gpu_usage import NodeUsage, needs_rewrite, observe, settle, usage_of
from services.state.mirror.gpu_usage import is_stale as usage_is_stale
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import GpuTelemetry
from shared.contracts.inventory import MAX_CLOCK_SKEW, MAX_PERIOD, GpuInventory
from shared.model.objects import DeviceUsage


def refusal(subject: str, report: GpuInventory | GpuTelemetry, now: float) -> str | None:
    """Why a node agent's `report`, received on `subject`, must not be used (None: use it). Refused: a report
    whose node is not the one its subject names (an agent may speak only for its own node), one dated more
    than `MAX_CLOCK_SKEW` seconds ahead of `now` or not dated at all, and one whose period is not seconds in
    (0, `MAX_PERIOD`]."""
    own = s.gpu_inventory(report.node) if isinstance(report, GpuInventory) else s.gpu_telemetry(report.node)
    if subject != own:
        return (
            f"published on {subject}, not on the subject of node {report.node!r} ({own}): "
            "an agent speaks only for its own node"
        )
    if not math.isfinite(report.time):
        return f"time {report.time!r}: not a time"
    if report.time - now > MAX_CLOCK_SKEW:
        return (
            f"dated {report.time - now:.0f} s ahead of this clock (at most {MAX_CLOCK_SKEW:.0f} s of clock skew "
            "is allowed): check the node's time synchronisation"
        )
    if not (math.isfinite(report.period) and 0 < report.period <= MAX_PERIOD):
        return f"period {report.period!r}: expected seconds in (0, {MAX_PERIOD:.0f}]"
    return None


class GpuOverlay:
    """Each node's latest inventory and decayed telemetry, by node name."""

    def __init__(self) -> None:
        self.inventories: dict[str, GpuInventory] = {}
        """Node name -> the GPU agent's latest inventory."""
        self.usage: dict[str, NodeUsage] = {}
        """Node name -> its devices' decayed use and health from the agent's telemetry."""

    def reporting(self) -> bool:
        """Some agent has reported (its node may need a look once the report goes stale)."""
        return bool(self.inventories or self.usage)

    def inventory(self, inventory: GpuInventory) -> None:
        """A node agent's inventory arrived (the latest replaces the one before)."""
        self.inventories[inventory.node] = inventory

    def telemetry(self, telemetry: GpuTelemetry, written: tuple[DeviceUsage, ...] | None) -> bool:
        """A node agent's telemetry arrived: folded into the decayed averages. True when the node should be
        looked at again: KV holds it (`written`, its devices there) and a device moved enough to rewrite."""
        usage = observe(self.usage.get(telemetry.node), telemetry)
        if usage is None:
            return False
        self.usage[telemetry.node] = usage
        return written is not None and needs_rewrite(written, usage_of(usage))

    def fresh_inventory(self, node: str, now: float) -> GpuInventory | None:
        """The node's latest inventory while it is fresh, else None."""
        inventory = self.inventories.get(node)
        if inventory is not None and is_stale(inventory, now):
            return None
        return inventory

    def devices(
        self, node: str, inventory: GpuInventory | None, written: tuple[DeviceUsage, ...], now: float
    ) -> tuple[DeviceUsage, ...]:
        """The node's `gpu_devices`: the fresh telemetry (none when stale), those `inventory` took out of the
        count marked excluded, and `written` (what KV holds) kept unless something moved enough."""
        usage = self.usage.get(node)
        fresh = usage_of(usage) if usage is not None and not usage_is_stale(usage, now) else ()
        return settle(written, mark_excluded(fresh, inventory))
