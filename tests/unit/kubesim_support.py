"""What the simulated cluster's unit tests share: a clock they move by hand, a two-node cluster, and letting
time pass with every timer fired on the way (`advance`)."""

from __future__ import annotations

from tools.kubesim.assembly import build_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.nodes import generated_nodes, node_object

START = 1_800_000_000.0


class Clock:
    """The cluster's clock; tests set `now` to fire timers."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def two_node_cluster(clock: Clock, options: SimOptions) -> Cluster:
    """Two generated 8-GPU nodes, settled."""
    c = build_cluster(options, clock=clock)
    for node in generated_nodes(2, 8):
        c.add_node(node_object(node))
    c.settle()
    return c


def advance(cluster: Cluster, clock: Clock, seconds: float) -> None:
    """Let `seconds` pass, firing every timer on the way as the server's event loop would."""
    end = clock.now + seconds
    while (deadline := cluster.next_deadline()) is not None and deadline <= end:
        clock.now = max(clock.now, deadline)
        cluster.settle()
    clock.now = end
    cluster.settle()
