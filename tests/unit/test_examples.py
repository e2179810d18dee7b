"""The files the README points users at stay valid."""

from __future__ import annotations

from pathlib import Path

from shared.clusterfile import load_cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_work_example_loads() -> None:
    objects = load_cluster(EXAMPLES / "work.yaml")
    assert [q.name for q in objects.queues] == ["vision"]
    assert len(objects.pods) == 4
