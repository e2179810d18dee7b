"""The write-back against the simulated API server: an event message delivered again writes no second Event
(`services.state.controllers.writeback`, the first piece of the state partitions' "nothing written twice")."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.state.controllers.writeback import DURABLE, WriteBack, WriteBackOptions, stored_nanos
from services.state.mirror.cache import Mirror
from shared.bus.connection import Bus
from shared.bus.middleware import Counters
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.contracts.events import EVENT_ENCODER, PodBound
from shared.kubeapi.client import Kube, connect
from tests.integration.kubectl_helpers import running_kubesim
from tests.integration.test_state_fencing import until
from tools.stack.nats_server import NatsServer

STORED = 1_764_921_600_123_456_789


def delivery(stored: int, delivered: int = 1) -> Any:
    """A JetStream delivery of a message stored at `stored` ns, as the consumer sees it."""
    return SimpleNamespace(reply=f"$JS.ACK.KAIROS_EVENTS.state-writeback.{delivered}.41.7.{stored}.0")


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        pytest.param(f"$JS.ACK.S.c.1.41.7.{STORED}.0", STORED, id="the short ack subject"),
        pytest.param(f"$JS.ACK.dom.hash.S.c.1.41.7.{STORED}.0.rnd", STORED, id="with domain and account"),
        pytest.param("_INBOX.abc", None, id="not a JetStream delivery"),
        pytest.param("$JS.ACK.S.c.1.41.7.soon.0", None, id="no time in it"),
        pytest.param(None, None, id="no reply subject"),
    ],
)
def test_a_messages_stored_time_is_read_from_its_ack_subject(reply: str | None, expected: int | None) -> None:
    assert stored_nanos(SimpleNamespace(reply=reply)) == expected


async def _scheduled_events(kube: Kube) -> list[str]:
    body = json.loads(await kube.call("list events", kube.core.list_namespaced_event, "default"))
    return sorted(item["metadata"]["name"] for item in body["items"] if item.get("reason") == "Scheduled")


async def test_a_redelivered_pod_bound_message_writes_its_scheduled_event_once(tmp_path: Path) -> None:
    async with running_kubesim(tmp_path) as _sim:
        kube = await connect(str(tmp_path / "kubeconfig"))
        try:
            counters = Counters()
            writeback = WriteBack(
                cast(ServiceContext, SimpleNamespace(counters=counters)),
                kube,
                Mirror(scheduler_name="kai-scheduler"),
                WriteBackOptions(),
            )
            event = PodBound(time=1.0, namespace="default", pod="p-0", podgroup="pg", queue="q", node="n")
            await writeback._on_event(event, delivery(STORED))
            await writeback._on_event(event, delivery(STORED, delivered=2))  # its ack was lost
            await writeback._on_event(event, delivery(STORED + 1_000))  # another message: another Event
            assert await _scheduled_events(kube) == [f"p-0.{STORED:x}", f"p-0.{STORED + 1_000:x}"]
            assert counters["kube_events"] == 2
            assert counters["kube_events_already_written"] == 1
        finally:
            await kube.close()


async def test_a_fetched_batch_is_written_back_and_every_event_of_it_acknowledged(
    tmp_path: Path, nats_server: NatsServer, bus: Bus
) -> None:
    # The acks of a batch leave together once all of it is written (`WriteBack._run`): none may be lost.
    pods = [f"p-{i}" for i in range(10)]
    async with running_kubesim(tmp_path) as _sim:
        kube = await connect(str(tmp_path / "kubeconfig"))
        writeback = WriteBack(
            ServiceContext("state", ServiceConfig(replica="state-0"), bus),
            kube,
            Mirror(scheduler_name="kai-scheduler"),
            WriteBackOptions(batch=4),
        )
        try:
            await writeback.start()
            for pod in pods:
                event = PodBound(time=1.0, namespace="default", pod=pod, podgroup="pg", queue="q", node="n")
                await bus.js.publish(s.event("pod-bound", f"default/{pod}"), EVENT_ENCODER.encode(event))

            async def done() -> bool:
                info = await bus.js.consumer_info(s.EVENTS_STREAM, DURABLE)
                events = {name.split(".")[0] for name in await _scheduled_events(kube)}
                return events == set(pods) and (info.num_pending, info.num_ack_pending) == (0, 0)

            await until("every event written back and acknowledged", done)
            assert writeback.ctx.counters["kube_events"] == len(pods)
        finally:
            await writeback.stop()
            await kube.close()
