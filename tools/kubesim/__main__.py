"""`python -m tools.kubesim`: run the simulated Kubernetes API server until SIGTERM or SIGINT.

Prints exactly one line, `kubesim ready <url>`, once it serves (what `kairos up` and the tests wait for),
writes a kubeconfig when `--kubeconfig-out` asks, and exits 0 on SIGTERM/SIGINT. A bad cluster file, CRD
directory or flag is one line on stderr (naming the file and field) and exit status 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys

from shared import event_loop
from shared.errors import KairosError
from shared.gc_settings import tune as tune_gc
from tools.kubesim.config import KubeSimConfig, initial_nodes, parse_args
from tools.kubesim.faults import read_plan_file
from tools.kubesim.server import KubeSim


async def serve(config: KubeSimConfig) -> None:
    """Build the cluster the configuration describes, serve it, and return after SIGTERM/SIGINT."""
    plan = read_plan_file(config.faults) if config.faults else None
    sim = KubeSim(config.options, bookmark_seconds=config.bookmark_seconds, faults=plan)
    sim.add_nodes(initial_nodes(config))
    for path in config.crds:
        sim.load_manifests(path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    url = await sim.start(config.host, config.port)
    try:
        if config.kubeconfig_out:
            sim.write_kubeconfig(config.kubeconfig_out, server=config.kubeconfig_server)
        print(f"kubesim ready {url}", flush=True)
        await stop.wait()
    finally:
        await sim.stop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    tune_gc()
    try:
        config = parse_args(argv)
        event_loop.run(serve(config))
    except KairosError as exc:
        print(f"kubesim: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:
        print(f"kubesim: cannot serve: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main(sys.argv[1:]))
