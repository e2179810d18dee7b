"""Fixtures of the tests that need a real NVIDIA GPU (marked `gpu`): a real nats-server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.stack.nats_server import NatsServer, start_nats_server


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = start_nats_server(tmp_path / "nats-state")
    try:
        yield server
    finally:
        server.stop()
