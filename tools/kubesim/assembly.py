"""The simulated cluster put together: the cluster, then its controllers, each given the cluster, then the
cluster given its controllers and started.

Called by the server (`tools.kubesim.server.KubeSim`) and by whatever drives a cluster without the server
(tests, `tools.bench`): `build_cluster` returns a started cluster. `tools.kubesim.cluster` and
`tools.kubesim.controllers` call each other (the cluster runs its controllers in ``settle``, the controllers
create and read objects through the cluster) but neither imports the other: this module is the one place
that knows both.
"""

from __future__ import annotations

from collections.abc import Callable

from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.controllers import Controllers
from tools.kubesim.default_storage_class import RetroactiveDefault
from tools.kubesim.dra import DraController
from tools.kubesim.ephemeral_volumes import EphemeralVolumes
from tools.kubesim.storage import StorageController

__all__ = ["build_cluster", "controllers_of"]


def controllers_of(cluster: Cluster) -> Controllers:
    """The workload controllers of `cluster`, with its volume, DRA, default-class and ephemeral-volume
    controllers; each listens to the cluster's store from now on."""
    return Controllers(
        cluster,
        storage=StorageController(cluster),
        dra=DraController(cluster),
        default_class=RetroactiveDefault(cluster),
        ephemeral=EphemeralVolumes(cluster),
    )


def build_cluster(options: SimOptions | None = None, *, clock: Callable[[], float]) -> Cluster:
    """A started cluster (`Cluster.start`): its controllers, default namespaces, priority classes and
    CRDs, settled. `clock` is its time in seconds since the epoch."""
    cluster = Cluster(options, clock=clock)
    cluster.start(controllers_of(cluster))
    return cluster
