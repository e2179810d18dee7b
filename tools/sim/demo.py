"""`kairos demo` (`make run`): a scripted scenario through the simulator, shown as tables.

Two teams share a 4-node, 32-GPU cluster: `research` runs 8-GPU training gangs, `product` serves
fractional-GPU inference. Watch fair share, reclaim and gang scheduling decide, cycle by cycle.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from shared.core.policy import Policy
from shared.model import Queue, QueueResource
from shared.model.builders import gang, gpu_nodes
from tools.sim.simulator import Simulator

UNBOUNDED = QueueResource(quota=-1, over_quota_weight=1, limit=-1)


def _queues() -> list[Queue]:
    def team(name: str, index: int) -> Queue:
        gpu = QueueResource(quota=16, over_quota_weight=1)
        return Queue(name=name, parent="org", creation_index=index, gpu=gpu, cpu=UNBOUNDED, memory=UNBOUNDED)

    return [
        Queue(name="org", gpu=UNBOUNDED, cpu=UNBOUNDED, memory=UNBOUNDED),
        team("research", 0),
        team("product", 1),
    ]


def main() -> int:
    console = Console()
    sim = Simulator(gpu_nodes(4, gpus=8), _queues(), Policy(staleness_grace_period=0.0))
    for i in range(4):
        pg, pods = gang(f"train-{i}", "research", 8, 1.0, priority=50, created=float(i))
        sim.submit(pg, pods, run_time=600.0)
    plan = {
        3: [("infer", 6, 0.5, 125)],
        6: [("train-late", 8, 1.0, 50)],
    }
    for cycle in range(10):
        now = cycle * 60.0
        for name, size, gpus, prio in plan.get(cycle, []):
            queue = "product" if name.startswith("infer") else "research"
            pg, pods = gang(name, queue, size, gpus, priority=prio, created=now)
            sim.submit(pg, pods, run_time=900.0)
        result = sim.step(now)
        table = Table(title=f"cycle {cycle} (t={now:.0f}s)")
        for col in ("podgroup", "queue", "running", "pending", "nodes"):
            table.add_column(col)
        for key, pg in sim.podgroups.items():
            pods = [p for p in sim.pods.values() if p.podgroup == key]
            running = [p for p in pods if p.status.value == "Running"]
            pending = [p for p in pods if p.status.value == "Pending"]
            nodes = sorted({p.node for p in running if p.node})
            table.add_row(key, pg.queue, str(len(running)), str(len(pending)), ",".join(nodes))
        console.print(table)
        for ev in result.evictions:
            console.print(f"  evicted {ev.pod} from {ev.node}: {ev.message}")
        for p in result.pending:
            console.print(f"  pending {p.podgroup}: {p.message.strip().splitlines()[-1]}")
    return 0
