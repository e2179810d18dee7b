"""Start-up configuration of the simulated API server: the command line and the files it names.

`parse_args(argv)` turns the flags of `python -m tools.kubesim` into a `KubeSimConfig`;
`initial_nodes(config)` reads the cluster file (`shared.clusterfile.load_cluster`) or generates nodes;
`read_manifests(path)` reads the YAML documents of a file or of every `*.yaml`/`*.yml`/`*.json` file of a
directory but its kustomization file (the CRDs to preload). Errors are `InvalidObject` (a file and a field) or `ConfigError`, which
`tools.kubesim.__main__` prints as one line before exiting with status 2. The only I/O is reading those
files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec
import yaml

from shared.clusterfile import load_cluster
from shared.errors import ConfigError, InvalidObject
from shared.model import Node
from tools.kubesim.cluster import SimOptions
from tools.kubesim.nodes import generated_nodes

__all__ = ["KubeSimConfig", "initial_nodes", "parse_args", "read_manifests"]

Obj = dict[str, Any]
# A directory of manifests may also be a kustomization; its kustomization file is not a manifest.
_KUSTOMIZATION_FILES = frozenset(("kustomization.yaml", "kustomization.yml", "Kustomization"))


class KubeSimConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything `python -m tools.kubesim` is told on its command line."""

    host: str = "127.0.0.1"
    """Loopback by default: the server accepts unauthenticated requests, so it must not be reachable from
    other machines unless asked (`--host 0.0.0.0` in a container)."""
    port: int = 0
    """0 picks a free port; the ready line and the kubeconfig say which."""
    cluster: str | None = None
    """A cluster YAML (shared.clusterfile) whose nodes become the simulated nodes."""
    nodes: int = 4
    """Generated nodes when no cluster file is given: a few, so that a bare start has somewhere to run
    pods (`--nodes 0` for none)."""
    gpus_per_node: int = 8
    crds: tuple[str, ...] = ()
    """Files or directories of CustomResourceDefinitions (or other manifests) created at start."""
    kubeconfig_out: str | None = None
    kubeconfig_server: str | None = None
    """The server URL written into the kubeconfig, when clients reach the server under another name
    (a container's service name); default: the URL the server prints."""
    bookmark_seconds: float = 10.0
    """Interval of BOOKMARK events on watches that allow them; frequent enough for informers to resume
    close to the present, rare enough to be noise-free."""
    options: SimOptions = SimOptions()
    faults: str | None = None
    """A fault plan file (`tools.kubesim.faults.FaultPlan`, JSON or YAML) in force from the start."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.kubesim",
        description="The simulated Kubernetes API server (plain HTTP, no authentication).",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default 0: a free one)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--cluster", metavar="FILE", help="cluster YAML whose nodes are simulated")
    source.add_argument("--nodes", type=int, default=4, metavar="N", help="generate N nodes (default 4)")
    p.add_argument(
        "--gpus-per-node", type=int, default=8, metavar="G", help="GPUs of each generated node (default 8)"
    )
    p.add_argument(
        "--crds",
        action="append",
        default=[],
        metavar="DIR",
        help="create the manifests of DIR (or a file) at start",
    )
    p.add_argument("--kubeconfig-out", metavar="FILE", help="write a kubeconfig for this server to FILE")
    p.add_argument("--kubeconfig-server", metavar="URL", help="server URL to write into the kubeconfig")
    p.add_argument(
        "--run-delay", type=float, default=0.5, metavar="S", help="seconds from binding to Running"
    )
    p.add_argument("--watch-history", type=int, default=5000, metavar="N", help="changes kept per resource")
    p.add_argument(
        "--bookmark-seconds", type=float, default=10.0, metavar="S", help="watch bookmark interval"
    )
    p.add_argument("--no-default-scheduler", action="store_true", help="leave default-scheduler pods pending")
    p.add_argument("--seed", type=int, default=None, help="seed for generated names and uids")
    p.add_argument("--faults", metavar="FILE", help="fault plan in force from the start (JSON or YAML)")
    return p


def parse_args(argv: list[str]) -> KubeSimConfig:
    """The configuration the flags describe; bad values raise `ConfigError` (argparse exits on syntax)."""
    args = _parser().parse_args(argv)
    if args.nodes < 0 or args.gpus_per_node < 0:
        raise ConfigError("--nodes and --gpus-per-node must be >= 0")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.bookmark_seconds <= 0:
        raise ConfigError("--bookmark-seconds must be > 0")
    options = SimOptions(
        run_delay=args.run_delay,
        watch_history=args.watch_history,
        default_scheduler=not args.no_default_scheduler,
        seed=args.seed,
    )
    return KubeSimConfig(
        host=args.host,
        port=args.port,
        cluster=args.cluster,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        crds=tuple(args.crds),
        kubeconfig_out=args.kubeconfig_out,
        kubeconfig_server=args.kubeconfig_server,
        bookmark_seconds=args.bookmark_seconds,
        options=options,
        faults=args.faults,
    )


def initial_nodes(config: KubeSimConfig) -> list[Node]:
    """The model nodes to simulate: the cluster file's (queues, podgroups and pods in it are ignored)
    or `config.nodes` generated ones."""
    if config.cluster:
        return list(load_cluster(config.cluster).nodes)
    return generated_nodes(config.nodes, config.gpus_per_node)


def read_manifests(path: str | Path) -> list[Obj]:
    """The YAML documents of a file, or of every manifest file of a directory in name order."""
    root = Path(path)
    if root.is_dir():
        files = sorted(
            p
            for p in root.iterdir()
            if p.suffix in {".yaml", ".yml", ".json"} and p.is_file() and p.name not in _KUSTOMIZATION_FILES
        )
    elif root.is_file():
        files = [root]
    else:
        raise InvalidObject("manifests", str(root), "", "no such file or directory")
    docs: list[Obj] = []
    for file in files:
        try:
            loaded = list(yaml.safe_load_all(file.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise InvalidObject("manifest", str(file), "", " ".join(str(exc).split())) from exc
        for i, doc in enumerate(loaded):
            if doc is None:
                continue
            if not isinstance(doc, dict):
                raise InvalidObject("manifest", str(file), f"document {i}", "not a mapping")
            items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else None
            if isinstance(items, list):
                docs.extend(item for item in items if isinstance(item, dict))
            else:
                docs.append(doc)
    return docs
