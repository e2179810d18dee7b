"""How kubesim writes a watch: the events of a busy moment go to each watcher together (one chunk of the
stream, not one per event), in resourceVersion order, and every watcher of an object gets the same events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.kubectl_helpers import running_kubesim
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
WRITES = 20


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with running_kubesim(tmp_path) as server:
        yield server


async def _chunks(response: aiohttp.ClientResponse, events: int) -> list[list[Obj]]:
    """The watch's HTTP chunks, each as the events it holds, until `events` have arrived."""
    chunks: list[list[Obj]] = []
    pending = b""
    async with asyncio.timeout(10):
        while sum(len(c) for c in chunks) < events:
            data, end_of_chunk = await response.content.readchunk()
            pending += data
            if end_of_chunk:
                chunks.append([json.loads(line) for line in pending.splitlines() if line])
                pending = b""
    return chunks


def _configmap(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": name}}


async def test_the_events_of_a_busy_moment_go_out_together_in_order_and_the_same_for_each_watcher(
    sim: KubeSim,
) -> None:
    rt = sim.cluster.lookup("", "v1", "configmaps")
    url = f"{sim.url}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0"
    async with (
        aiohttp.ClientSession() as session,
        session.get(url) as first,
        session.get(url) as second,
    ):
        await asyncio.sleep(0.05)  # both watches registered
        for i in range(WRITES):
            sim.cluster.create(rt, "default", _configmap(f"c{i:02d}"))
            await asyncio.sleep(0)  # each write in its own turn of the loop, as requests come
        got = [await _chunks(response, WRITES) for response in (first, second)]

    for chunks in got:
        events = [event for chunk in chunks for event in chunk]
        assert [e["object"]["metadata"]["name"] for e in events] == [f"c{i:02d}" for i in range(WRITES)]
        versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
        assert versions == sorted(versions)
        assert {e["type"] for e in events} == {"ADDED"}
        # Written in a moment: the watch sent them in fewer chunks than events (one per event before).
        assert len(chunks) < WRITES
    assert [e for c in got[0] for e in c] == [e for c in got[1] for e in c]
