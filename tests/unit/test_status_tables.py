"""Specs for `kairos status`'s tables (tools.cli.cluster_cmds.status_tables)."""

from __future__ import annotations

import io

from rich.console import Console

from shared.contracts.messages import SnapshotReply
from shared.model import Node
from shared.model.objects import DeviceUsage
from tools.cli.cluster_cmds import status_tables


def _render(tables: list[object]) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    for table in tables:
        console.print(table)
    return console.export_text()


def test_measured_gpu_devices_are_listed_with_their_use_and_health() -> None:
    node = Node(
        name="node-b",
        cpu_millis=8000,
        memory_bytes=64e9,
        gpus=4,
        gpu_devices=(
            DeviceUsage(index=0, utilisation_pct=49.24, memory_pct=50.0, gpu_group="g-0"),
            DeviceUsage(index=3, healthy=False, reason="XID 79"),
        ),
    )
    text = _render(status_tables(SnapshotReply(revision=7, ledger_revision=0, nodes=(node,))))
    assert "GPU devices measured (2" in text
    lines = [line for line in text.splitlines() if "node-b" in line]
    assert any("49.2" in line and "50.0" in line and "healthy" in line and "g-0" in line for line in lines)
    assert any("unhealthy: XID 79" in line for line in lines)


def test_no_device_table_without_measurements() -> None:
    node = Node(name="plain", cpu_millis=8000, memory_bytes=64e9, gpus=8)
    text = _render(status_tables(SnapshotReply(revision=1, ledger_revision=0, nodes=(node,))))
    assert "GPU devices measured" not in text
