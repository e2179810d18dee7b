"""A SchedulingShard with KAI v0.16-v0.17 fields Kairos does not apply (scenarioSearchBudgets, goMemLimitRatio)
on the simulated API server: it is in force (its placement strategy reaches the shard's record), it gets one
Warning Event SettingsNotApplied naming both fields and FullyApplied=False, and once the fields are taken out,
FullyApplied=True. Real nats-server and `tools.kubesim`, the state service's Kubernetes owner."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from shared.bus.connection import Bus
from shared.kubeapi.client import Kube
from tests.integration.test_invalid_objects import events, eventually
from tests.integration.test_scheduling_shard_kube import shard, state_owner

pytestmark = pytest.mark.integration

GROUP = ("kai.scheduler", "v1", "schedulingshards")


async def fully_applied(kube: Kube) -> dict[str, Any] | None:
    raw = await kube.call("get shard", kube.custom.get_cluster_custom_object, *GROUP, "default")
    got = raw if isinstance(raw, dict) else json.loads(raw)
    conditions = got.get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == "FullyApplied"), None)


async def test_fields_kairos_does_not_apply_are_told_once_and_the_rest_is_in_force(
    bus: Bus, tmp_path: Path
) -> None:
    async with state_owner(bus, tmp_path) as (replica, kube):
        spec = {
            "placementStrategy": {"gpu": "spread"},
            "goMemLimitRatio": 0.8,
            "scenarioSearchBudgets": {
                "maxJobSearchDuration": "4m",
                "maxGeneratorSearchDuration": {"Greedy": "1s"},
            },
        }
        await kube.call("create shard", kube.custom.create_cluster_custom_object, *GROUP, shard(spec))

        async def in_force() -> bool:
            record = replica.shard("default")
            return record is not None and record.config.gpu_placement == "spread"

        await eventually("the shard's record in force", in_force)

        async def told() -> list[dict[str, Any]]:
            return [e for e in await events(kube) if e.get("reason") == "SettingsNotApplied"]

        [event] = await eventually("a SettingsNotApplied Warning on the SchedulingShard", told)
        assert event["type"] == "Warning"
        assert event["involvedObject"]["kind"] == "SchedulingShard"
        assert "spec.goMemLimitRatio" in event["message"]
        assert "spec.scenarioSearchBudgets.maxGeneratorSearchDuration.Greedy" in event["message"]

        async def noted() -> dict[str, Any] | None:
            got = await fully_applied(kube)
            return got if got is not None and got["status"] == "False" else None

        condition = await eventually("FullyApplied=False", noted)
        assert condition["message"] == event["message"]
        await asyncio.sleep(0.5)  # the status patch comes back as a change: it must not be told again
        assert len(await told()) == 1

        await kube.call(
            "take the fields out",
            kube.custom.patch_cluster_custom_object,
            *GROUP,
            "default",
            {"spec": {"goMemLimitRatio": None, "scenarioSearchBudgets": None}},
            _content_type="application/merge-patch+json",
        )

        async def applied() -> dict[str, Any] | None:
            got = await fully_applied(kube)
            return got if got is not None and got["status"] == "True" else None

        await eventually("FullyApplied=True", applied)
        assert len(await told()) == 1
