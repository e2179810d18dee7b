"""A simulated API server in-process with the nodes a test names, and the real kubernetes-asyncio client on
it: what the integration tests of Kairos's Kubernetes clients (the binder's, the informer, the state
service's source) stand on.

`kubesim(tmp_path, nodes, ...)` is an async context manager yielding a started `KubeSim` holding `nodes`
(and Kairos's CRDs when `crds`), its kubeconfig written to `tmp_path / "kubeconfig"`; `kube_client(tmp_path)`
yields a client connected through that kubeconfig. Both stop what they started on exit; the fixtures `sim`
and `kube` (`tests/integration/conftest.py`) are them with the test module's `NODES`. `create` and `read`
send one object to a path and read one back, as JSON. (The kubectl tests start theirs with generated
nodes: `tests.integration.kubectl_helpers.running_kubesim`.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from shared.kubeapi.client import Kube, connect
from shared.model import Node
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
KUBECONFIG = "kubeconfig"


@asynccontextmanager
async def kubesim(
    tmp_path: Path, nodes: Iterable[Node] = (), *, options: SimOptions | None = None, crds: bool = False
) -> AsyncIterator[KubeSim]:
    """A started `KubeSim` (pods run at once, seed 7 unless `options` say otherwise)."""
    server = KubeSim(options or SimOptions(run_delay=0.0, seed=7))
    if crds:
        server.load_manifests(CRDS)
    server.add_nodes(nodes)
    await server.start()
    server.write_kubeconfig(tmp_path / KUBECONFIG)
    try:
        yield server
    finally:
        await server.stop()


@asynccontextmanager
async def kube_client(tmp_path: Path) -> AsyncIterator[Kube]:
    """The real client on the server `kubesim(tmp_path, ...)` started."""
    client = await connect(str(tmp_path / KUBECONFIG))
    try:
        yield client
    finally:
        await client.close()


async def create(kube: Kube, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    """POST `obj` to `path` (a collection); the object the server made."""
    return json.loads(await kube.request(f"create {path}", "POST", path, obj))  # type: ignore[no-any-return]


async def read(kube: Kube, path: str) -> dict[str, Any]:
    """GET `path` (one object, or a list)."""
    return json.loads(await kube.request(f"read {path}", "GET", path))  # type: ignore[no-any-return]
