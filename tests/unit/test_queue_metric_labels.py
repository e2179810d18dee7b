"""Queue metrics carry KAI v0.17's three queue labels: `queue_metadata_name` (the Queue object's name),
`queue_display_name` (its spec.displayName, empty when unset) and `queue_name` (on the scheduler's
fair-share series the display name when set, else the object's name; on the queue controller's series the
object's name), so a KAI user's v0.17 dashboards and joins keep working."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.bus.middleware import Counters
from shared.contracts.events import QueueFairShare
from shared.kube import translate, wire
from shared.telemetry.metrics import QueueMetrics, ServiceMetrics, queue_labels

SCHEDULER_SERIES = (
    "kai_queue_fair_share_gpu",
    "kai_queue_fair_share_cpu_cores",
    "kai_queue_fair_share_memory_gb",
)
CONTROLLER_SERIES = (
    "kai_queue_info",
    "kai_queue_deserved_gpus",
    "kai_queue_quota_cpu_cores",
    "kai_queue_quota_memory_bytes",
    "kai_queue_allocated_gpus",
    "kai_queue_allocated_cpu_cores",
    "kai_queue_allocated_memory_bytes",
    "kairos_queue_requested_gpus",
    "kairos_queue_requested_cpu_cores",
    "kairos_queue_requested_memory_bytes",
)


def scraped_labels(display_names: dict[str, str] | None) -> dict[str, list[dict[str, str]]]:
    metrics = ServiceMetrics()
    metrics.attach("queue", "q-0", None, Counters(), lambda: True)
    zero = {"gpu": 1.0, "cpu": 1000.0, "memory": 1e9}
    share = QueueFairShare(
        time=0.0,
        queue="research-team-a",
        parent=None,
        fair_share=zero,
        allocated=zero,
        requested=zero,
        deserved=zero,
    )
    QueueMetrics(metrics).observe_plan([share], pending=0, display_names=display_names)
    body, _ = metrics.expose()
    return {
        family.name: [sample.labels for sample in family.samples]
        for family in text_string_to_metric_families(body.decode())
    }


@pytest.mark.parametrize(
    ("display_names", "scheduler_queue_name", "display_name"),
    [
        pytest.param(
            {"research-team-a": "Research Team A"},
            "Research Team A",
            "Research Team A",
            id="display name set",
        ),
        pytest.param({}, "research-team-a", "", id="display name unset"),
        pytest.param(None, "research-team-a", "", id="no display names given"),
    ],
)
def test_every_queue_series_carries_the_metadata_name_and_the_display_name(
    display_names: dict[str, str] | None, scheduler_queue_name: str, display_name: str
) -> None:
    families = scraped_labels(display_names)
    for family in SCHEDULER_SERIES:
        assert families[family] == [
            {
                "queue_name": scheduler_queue_name,
                "queue_metadata_name": "research-team-a",
                "queue_display_name": display_name,
            }
        ], family
    for family in CONTROLLER_SERIES:
        assert families[family] == [
            {
                "queue_name": "research-team-a",
                "queue_metadata_name": "research-team-a",
                "queue_display_name": display_name,
            }
        ], family


@pytest.mark.parametrize(
    ("name", "display_name", "scheduler", "expected"),
    [
        ("a", "A team", True, ("A team", "a", "A team")),
        ("a", "", True, ("a", "a", "")),
        ("a", "A team", False, ("a", "a", "A team")),
        ("a", "", False, ("a", "a", "")),
    ],
)
def test_queue_name_is_the_display_name_only_on_the_schedulers_series(
    name: str, display_name: str, scheduler: bool, expected: tuple[str, str, str]
) -> None:
    assert queue_labels(name, display_name, scheduler=scheduler) == expected


@pytest.mark.parametrize(
    ("spec", "shown"), [({"displayName": "Research Team A"}, "Research Team A"), ({}, "")]
)
def test_the_queue_leader_gets_each_queues_display_name_from_its_spec(
    spec: dict[str, str], shown: str
) -> None:
    queue = wire.convert(
        wire.Queue,
        {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": "research-team-a"},
            "spec": spec,
        },
    )
    assert translate.queue_of(queue, creation_index=0).display_name == shown
