"""The admission webhook asks the Kubernetes source's mirror about a pod's PodGroup before the API: a PodGroup
the mirror knows is absent or present costs no read; only when the mirror cannot tell (a standby, a source
not listed yet) is the API read, as before."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.state.mirror.raw_objects import PODGROUPS
from services.state.sources.kube_source import KubeElection
from services.state.webhook import podgroup_lookup
from services.state.webhook.podgroup_lookup import ABSENT, UNKNOWN, Known
from services.state.webhook.webhook import AdmissionServer, WebhookOptions
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext
from shared.kube import wire
from shared.kube.scheduling_gates import GATE
from shared.kubeapi.client import Kube
from tests.integration.test_webhook_owner_reads import Api, api, creation

pytestmark = pytest.mark.integration
__all__ = ["api"]  # the fixture, used by name

PODGROUP_PATH = "/apis/scheduling.run.ai/v2alpha2/namespaces/default/podgroups/pg"


@pytest.mark.parametrize(
    ("known", "gated", "reads"),
    [
        (ABSENT, False, 0),
        ({"kairos.io/after": "prep"}, True, 0),
        ({"other": "x"}, False, 0),
        (UNKNOWN, False, 1),
    ],
    ids=["absent-no-read", "mirrored-after-gates-without-a-read", "mirrored-plain", "unknown-reads-the-api"],
)
async def test_the_pod_s_podgroup_is_read_from_the_api_only_when_the_mirror_cannot_tell(
    api: tuple[Api, Kube], bus: Bus, known: Known, gated: bool, reads: int
) -> None:
    answers, kube = api
    options = WebhookOptions(port=0, podgroups=lambda _namespace, _name: known)
    server = AdmissionServer(ServiceContext("state", ServiceConfig(), bus), kube, options)
    try:
        patch, warning = await server.decide(creation("p", podgroup="pg"))
    finally:
        await server.stop()
    assert warning == ""
    assert (patch is not None and any(GATE in str(op.get("value")) for op in patch)) == gated
    assert answers.reads[PODGROUP_PATH] == reads


def _election(owner: Any) -> KubeElection:
    return cast(KubeElection, SimpleNamespace(owner=owner))


def _source(synced: bool, podgroups: dict[str, wire.PodGroup]) -> Any:
    informer = SimpleNamespace(what=PODGROUPS, synced=SimpleNamespace(is_set=lambda: synced))
    mirror = SimpleNamespace(raw=SimpleNamespace(podgroups=podgroups))
    return SimpleNamespace(source=SimpleNamespace(informers=[informer], mirror=mirror))


def test_the_mirror_answers_only_on_the_replica_leading_a_listed_source() -> None:
    group = wire.PodGroup(metadata=wire.ObjectMeta(name="pg", namespace="ns", annotations={"a": "b"}))
    assert podgroup_lookup.from_election(_election(None))("ns", "pg") == UNKNOWN
    assert podgroup_lookup.from_election(_election(SimpleNamespace(source=None)))("ns", "pg") == UNKNOWN
    assert podgroup_lookup.from_election(_election(_source(False, {})))("ns", "pg") == UNKNOWN
    listed = podgroup_lookup.from_election(_election(_source(True, {"ns/pg": group})))
    assert listed("ns", "pg") == {"a": "b"}
    assert listed("ns", "other") == ABSENT
