"""How the simulated cluster is put together (`tools.kubesim.assembly`): the cluster, then its controllers
given the cluster, then the cluster given its controllers; `tools.kubesim.cluster` and
`tools.kubesim.controllers` call each other without importing each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools.kubesim import cluster as cluster_module
from tools.kubesim import controllers as controllers_module
from tools.kubesim.assembly import build_cluster
from tools.kubesim.cluster import DEFAULT_NAMESPACES, Cluster
from tools.kubesim.controllers import Controllers


def imported_modules(module_file: str) -> set[str]:
    """Every module a file imports, at any level (module, function, TYPE_CHECKING)."""
    tree = ast.parse(Path(module_file).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        (cluster_module.__file__, "tools.kubesim.controllers"),
        (controllers_module.__file__, "tools.kubesim.cluster"),
    ],
    ids=["the cluster imports no controllers", "the controllers import no cluster"],
)
def test_the_cluster_and_its_controllers_do_not_import_each_other(importer: str, imported: str) -> None:
    assert imported not in imported_modules(importer)


def test_a_built_cluster_holds_the_controllers_built_for_it_and_its_start_up_objects() -> None:
    cluster = build_cluster(clock=lambda: 1_800_000_000.0)

    assert isinstance(cluster.controllers, Controllers)
    assert cluster.controllers.cluster is cluster
    assert {ns["metadata"]["name"] for ns in cluster.objects("namespaces")} >= set(DEFAULT_NAMESPACES)


def test_a_cluster_not_yet_started_holds_no_objects() -> None:
    cluster = Cluster(clock=lambda: 1_800_000_000.0)

    assert cluster.objects("namespaces") == []
