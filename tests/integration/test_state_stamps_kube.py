"""A binder's podgroup stamps stored as KAI keeps them, on kubesim (`services.state.sources.kube_source.KubeOwner`):
the last start and the stale-since time as annotations on each PodGroup a stamps message names, the
podgroups of one message patched side by side, one that does not exist skipped without stopping the others."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.state.sources.kube_source import KubeOwner
from shared.contracts import subjects as s
from shared.contracts.messages import PodGroupStamps, encode
from shared.kube import keys
from shared.kube.quantity import rfc3339
from shared.kubeapi.paths import object_path
from tests.integration.test_state_fencing import (  # noqa: F401 -- `world` is a fixture
    OPTIONS,
    World,
    create_pod,
    until,
    world,
)

pytestmark = pytest.mark.integration

GROUPS = [f"job-{i}" for i in range(20)]


async def annotations(world: World, name: str) -> dict[str, str]:  # noqa: F811 -- `world` is an argument here
    path = object_path(keys.PODGROUP_API_VERSION, "PodGroup", "default", f"pg-{name}")
    body = json.loads(await world.kube.request(f"get podgroup pg-{name}", "GET", path))
    found: dict[str, str] = body["metadata"].get("annotations") or {}
    return found


async def test_a_binders_stamps_become_annotations_on_every_podgroup_it_names(
    world: World,  # noqa: F811 -- the fixture imported above
) -> None:
    replica = await world.replica("state-a")
    lease = await replica.take_lease(asyncio.get_running_loop().time)
    owner = KubeOwner(replica.ctx, replica.replica, world.kubeconfig, OPTIONS, lease=lease)
    await owner.start()
    world.stack.push_async_callback(owner.stop)
    for name in GROUPS:
        await create_pod(world.kube, name)

    async def all_in_kv() -> bool:
        return all(s.podgroup_key("default", f"pg-{name}") in world.observer.records for name in GROUPS)

    await until("every podgroup in KV", all_in_kv)
    started = {f"default/pg-{name}": 1_767_323_045.0 + i for i, name in enumerate(GROUPS)}
    stamps = PodGroupStamps(
        shard=s.DEFAULT_SHARD,
        last_start={**started, "default/pg-missing": 1.0},
        stale_since={"default/pg-job-0": 1_767_323_000.0},
    )
    await world.bus.nc.publish(s.stamps(s.DEFAULT_SHARD), encode(stamps))

    async def stamped() -> bool:
        for i, name in enumerate(GROUPS):
            if (await annotations(world, name)).get(keys.LAST_START_ANNOTATION) != rfc3339(
                1_767_323_045.0 + i
            ):
                return False
        return True

    await until("every podgroup stamped with its last start", stamped)
    assert (await annotations(world, "job-0"))[keys.STALE_SINCE_ANNOTATION] == rfc3339(1_767_323_000.0)
    assert keys.STALE_SINCE_ANNOTATION not in await annotations(world, "job-1")
    assert replica.ctx.counters["podgroup_stamps"] == len(GROUPS)
