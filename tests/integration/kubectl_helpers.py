"""Test helpers for the simulated API server: start one in-process, run the real kubectl against it.

`running_kubesim(tmp_path, ...)` is an async context manager yielding a started `KubeSim` with generated
GPU nodes, Kairos's CRDs (and any `manifests`) loaded and a kubeconfig at `tmp_path / "kubeconfig"`; `kubectl(kubeconfig, *args)`
runs /usr/bin/kubectl as an asyncio subprocess with KUBECONFIG, its cache and HOME inside the test's
temporary directory (never ~/.kube), and returns (exit status, stdout, stderr). Used by
tests/integration/test_kubesim_*.py.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tools.kubesim.cluster import SimOptions
from tools.kubesim.nodes import generated_nodes
from tools.kubesim.server import KubeSim

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "crds"
KUBECTL = "/usr/bin/kubectl"


@asynccontextmanager
async def running_kubesim(
    tmp_path: Path,
    *,
    nodes: int = 2,
    gpus_per_node: int = 8,
    options: SimOptions | None = None,
    bookmark_seconds: float = 10.0,
    manifests: tuple[Path, ...] = (),
) -> AsyncIterator[KubeSim]:
    sim = KubeSim(options or SimOptions(run_delay=0.0, seed=11), bookmark_seconds=bookmark_seconds)
    sim.add_nodes(generated_nodes(nodes, gpus_per_node))
    sim.load_manifests(CRDS)
    for path in manifests:
        sim.load_manifests(path)
    await sim.start()
    sim.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield sim
    finally:
        await sim.stop()


async def kubectl(
    kubeconfig: Path, *args: str, stdin: str | None = None, timeout: float = 60
) -> tuple[int, str, str]:
    """Run the real kubectl against `kubeconfig`; (exit status, stdout, stderr)."""
    home = kubeconfig.parent
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "KUBECONFIG": str(kubeconfig),
        "KUBECACHEDIR": str(home / "kube-cache"),
        "HOME": str(home),
    }
    process = await asyncio.create_subprocess_exec(
        KUBECTL,
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await process.communicate(stdin.encode() if stdin is not None else None)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()
