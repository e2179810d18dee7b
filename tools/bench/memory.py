"""The state replica's memory target: one `StateReplica` holding 10k nodes and 100k pods under 1 GiB RSS.

`measure_replica(nodes, pods)` starts a nats-server of its own, writes that many records into the state
bucket as the state service would (nodes; pods as the Kubernetes source makes them, running, in gangs of 8
with their podgroups), then starts a fresh process (`python -m tools.bench.memory URL COUNT`) that holds
only a `StateReplica`: it reads the bucket through its KV watch and reports its RSS before (baseline:
interpreter, imports, connection) and after the replica caught up. Called by `tools.bench.suite`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from shared.bus.connection import connect
from shared.bus.replica import StateReplica
from shared.contracts import subjects as s
from shared.contracts.messages import NodeRecord, PodGroupRecord, PodRecord, encode
from shared.errors import TemporaryError
from shared.model import GpuRequest, Pod, PodGroup, PodSet, PodStatus, SubGroupSet
from shared.model.builders import gpu_nodes
from tools.bench.procstats import peak_rss_mib, rss_mib
from tools.bench.report import MemoryResult
from tools.stack.nats_server import start_nats_server

__all__ = ["measure_replica"]

GANG = 8
PARALLEL_PUTS = 512
NAMESPACE = "default"


def _records(nodes: int, pods: int) -> list[tuple[str, bytes]]:
    """The state bucket's keys and values for `nodes` nodes and `pods` running pods (with podgroups)."""
    node_list = gpu_nodes(nodes)
    out = [(s.node_key(n.name), encode(NodeRecord(node=n))) for n in node_list]
    for g in range((pods + GANG - 1) // GANG):
        name = f"train-{g:06d}"
        size = min(GANG, pods - g * GANG)
        pg = PodGroup(
            name=name,
            namespace=NAMESPACE,
            uid=f"{NAMESPACE}/{name}",
            queue=f"team-{g % 50}",
            priority=50,
            creation_time=1.7e9 + g,
            last_start_time=1.7e9 + g,
            root=SubGroupSet(name="root", pod_sets=(PodSet("default", size),)),
        )
        out.append((s.podgroup_key(NAMESPACE, name), encode(PodGroupRecord(podgroup=pg))))
        for i in range(size):
            index = g * GANG + i
            pod = Pod(
                name=f"{name}-{i}",
                namespace=NAMESPACE,
                uid=str(uuid.UUID(int=index)),
                podgroup=pg.uid,
                status=PodStatus.RUNNING,
                node=node_list[index % nodes].name,
                cpu_millis=4000.0,
                memory_bytes=32.0 * 2**30,
                gpu=GpuRequest(devices=1),
                labels={"kai.scheduler/queue": pg.queue, "app": name, "batch.kubernetes.io/job-name": name},
                creation_time=1.7e9 + g,
            )
            out.append((s.pod_key(NAMESPACE, pod.name), encode(PodRecord(pod=pod))))
    return out


async def _write(url: str, records: list[tuple[str, bytes]]) -> None:
    bus = await connect(url, "kairos-bench-memory-writer")
    try:
        for start in range(0, len(records), PARALLEL_PUTS):
            chunk = records[start : start + PARALLEL_PUTS]
            await asyncio.gather(*(bus.state.put(k, v) for k, v in chunk))
    finally:
        await bus.close()


def measure_replica(nodes: int, pods: int, timeout: float = 600.0) -> MemoryResult:
    """RSS of a StateReplica process holding `nodes` nodes and `pods` pods (see the module docstring)."""
    state_dir = Path(tempfile.mkdtemp(prefix="kairos-bench-memory-"))
    server = start_nats_server(state_dir)
    try:
        records = _records(nodes, pods)
        asyncio.run(_write(server.url, records))
        del records
        done = subprocess.run(
            [sys.executable, "-m", "tools.bench.memory", server.url, str(nodes + pods)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise TemporaryError(f"the replica process failed: {done.stderr.strip()[-500:]}")
        data = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        server.stop()
        shutil.rmtree(state_dir, ignore_errors=True)
    return MemoryResult(
        nodes=nodes,
        pods=pods,
        rss_mib=data["rss_mib"],
        baseline_rss_mib=data["baseline_rss_mib"],
        peak_rss_mib=data["peak_rss_mib"],
        load_s=data["load_s"],
        note=f"plus {(pods + GANG - 1) // GANG:,} podgroups of {GANG} pods; one StateReplica alone in its process",
    )


async def _hold(url: str, expected: int) -> dict[str, float]:
    """In the measured process: connect, note the baseline, start the replica, wait for every record."""
    import os

    pid = os.getpid()
    bus = await connect(url, "kairos-bench-memory-replica")
    baseline = rss_mib(pid)
    started = time.perf_counter()
    replica = StateReplica(bus)
    try:
        # `start` returns once the watch has delivered every record the bucket held.
        await replica.start(timeout=600.0)
        load = time.perf_counter() - started
        held = sum(1 for r in replica.records.values() if isinstance(r, (NodeRecord, PodRecord)))
        if held < expected:
            raise TemporaryError(f"the replica holds {held} nodes and pods, expected {expected}")
        return {
            "baseline_rss_mib": round(baseline, 1),
            "rss_mib": round(rss_mib(pid), 1),
            "peak_rss_mib": round(peak_rss_mib(pid), 1),
            "load_s": round(load, 2),
        }
    finally:
        await replica.stop()
        await bus.close()


if __name__ == "__main__":
    result = asyncio.run(_hold(sys.argv[1], int(sys.argv[2])))
    print(json.dumps(result), flush=True)
