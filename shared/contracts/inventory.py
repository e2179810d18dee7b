"""The GPU inventory a node agent publishes: its devices, their health, memory and MIG layout (internal).

Sent by `services.gpu_agent` (one replica per node, a DaemonSet) on `subjects.gpu_inventory(node)` at start,
every `period` seconds and whenever someone asks on `subjects.gpu_inventory_request(node)` (the reply is
the same message). Read by the state service, which folds it into its `Node` with
`services.state.mirror.gpu_inventory.merge_inventory`. Internal, so msgpack, versioned and evolved by the rules of
`shared.contracts.messages` (new fields get a default, a field never changes type or meaning, tags are
fixed); `INVENTORIES.decode` raises `MalformedMessage` naming the subject.

What a reader trusts (docs/security.md, "Trust boundaries"): a report counts only on its own node's subject
(the subject is what NATS permissions tie to an agent's user), only when it is dated no more than
`MAX_CLOCK_SKEW` seconds ahead of the reader's clock, and only with a `period` of at most `MAX_PERIOD`
seconds; the same holds for `shared.contracts.gpu_telemetry`.
"""

from __future__ import annotations

import msgspec

from shared.contracts.messages import VERSION, Codec

__all__ = ["INVENTORIES", "MAX_CLOCK_SKEW", "MAX_PERIOD", "GpuDevice", "GpuInventory", "MigDevice"]

MAX_CLOCK_SKEW = 10.0
"""Seconds a report's `time` may be ahead of its reader's clock (the agents' and the state service's nodes
keep time with NTP); one dated further ahead is refused, so that it cannot stay fresh for ever."""
MAX_PERIOD = 600.0
"""The longest `period` a reader honours, in seconds: a report stays fresh for a few periods, so an
unbounded period would keep it fresh for ever. The agent refuses to start with a longer one."""


class MigDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One MIG device (a compute instance inside a GPU instance) of a MIG-enabled GPU."""

    index: int
    """The MIG device's slot on its parent GPU (NVML's MIG device index)."""
    uuid: str = ""
    profile: str = ""
    """The profile as the device plugin names its resource (`1g.10gb`, `1c.2g.20gb`); empty when NVML did not
    say enough to name it, and then `note` says why and `memory_mib`/slices carry what NVML did report."""
    memory_mib: int = 0
    gpu_slices: int = 0
    """GPU-instance slices (the `1` of `1g.10gb`)."""
    compute_slices: int = 0
    """Compute-instance slices; differs from `gpu_slices` only for a compute instance smaller than its GPU
    instance."""
    gpu_instance: int | None = None
    compute_instance: int | None = None
    healthy: bool = True
    error: str = ""
    """Why the device is unhealthy: the NVML call that failed and its error."""
    note: str = ""


class GpuDevice(msgspec.Struct, frozen=True, kw_only=True):
    """One physical GPU as NVML sees it.

    `healthy` is False when a query the agent needs (handle, UUID, name, memory, MIG layout) failed, when NVML
    reports a failed row remapping, or when uncorrected ECC errors occurred since the driver loaded: such a
    device needs a reset before work can trust it. Pending page retirement or row remapping takes effect on
    the next reset and the device keeps working until then, so it is listed in `warnings` only. A health
    counter that NVML does not have for this device (older or consumer GPUs) is None.
    """

    index: int
    uuid: str = ""
    name: str = ""
    memory_mib: int = 0
    mig_enabled: bool = False
    """MIG mode now (NVML's current mode)."""
    mig_pending: bool = False
    """MIG mode after the next GPU reset (NVML's pending mode)."""
    mig_devices: tuple[MigDevice, ...] = ()
    healthy: bool = True
    error: str = ""
    """Why the device is unhealthy (the failing NVML call and its error, or the health counter)."""
    warnings: tuple[str, ...] = ()
    ecc_uncorrected_volatile: int | None = None
    """Uncorrected ECC errors since the driver loaded."""
    retired_pages_pending: bool | None = None
    """Pages are waiting to be retired at the next reset (GPUs before Ampere)."""
    remapped_rows_pending: bool | None = None
    """Rows are waiting to be remapped at the next reset (Ampere and later)."""
    remapped_rows_failed: bool | None = None
    """A row remapping failed: the device's memory is not trustworthy."""


class GpuInventory(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="gpu-inventory"):
    """Everything one node's agent knows about its GPUs at `time`.

    With `error` set, NVML could not be used on the node (no driver, no library, ...) and `devices` is empty
    because the agent could not look, not because there are no GPUs.
    """

    v: int = VERSION
    node: str
    time: float
    """The agent's wall clock (seconds since the epoch) when it read the devices."""
    period: float
    """Seconds between the agent's publications: a reader calls the inventory stale after a few periods."""
    devices: tuple[GpuDevice, ...] = ()
    driver_version: str = ""
    cuda_driver_version: str = ""
    """The newest CUDA version the driver supports, `major.minor`."""
    error: str = ""


INVENTORIES: Codec[GpuInventory] = Codec(GpuInventory)
