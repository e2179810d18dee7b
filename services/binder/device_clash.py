"""A DRA device two claims would hold: the conflict the binders' ledger refuses, for a node's devices
(`services.binder.ledger.device_clash`) and for a cluster-wide pool's (`services.binder.pool_ledger`).

Its text names the device, the claim and pod that asked for it and the pod and claim that hold it, so the
rejected proposal's reason says who was first."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DeviceClash"]


@dataclass(frozen=True)
class DeviceClash:
    """A device a proposal's pod would hold for one claim while another pod holds it for another."""

    device: tuple[str, str, str]
    """Driver, pool, device."""
    pod: str
    claim: str
    holder: str
    """The pod that holds it already."""
    held_for: str
    """The claim it holds it for."""
    cluster_wide: bool = False
    """The device is a cluster-wide pool's (held in the pool's entry, not a node's)."""

    def __str__(self) -> str:
        driver, pool, device = self.device
        where = " (a cluster-wide pool's)" if self.cluster_wide else ""
        return (
            f"device {driver}/{pool}/{device}{where} for claim {self.claim} of pod {self.pod} is held by pod "
            f"{self.holder} for claim {self.held_for}"
        )
