"""End-to-end fixtures: an OTLP/HTTP receiver the services export their traces to (tests/otlp_receiver.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.otlp_receiver import OtlpReceiver, otlp_receiver


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    """A running OTLP/HTTP receiver; `otlp.environment()` points a service's exporter at it."""
    with otlp_receiver() as receiver:
        yield receiver
