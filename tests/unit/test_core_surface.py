"""The core's public surface: every module of shared.core is either public (named in the package's
docstring) or private (in the import-linter contract that keeps it inside the core), never both, never
neither; and the values the wire and the binder read load none of the core's machinery."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import shared.core

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {
    "scheduler",
    "result",
    "queue_plan",
    "quota_gate",
    "policy",
    "stamps",
    "fair_share",
    "node_pool",
    "usage",
    "recheck",
    "dra_cel",
    "bind_backoff",
    "selectors",
    "plugins",
    "builtin_plugins",
}


def _top_level_modules() -> set[str]:
    return {m.name for m in pkgutil.iter_modules(shared.core.__path__)}


def _protected() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (contract,) = (c for c in config["tool"]["importlinter"]["contracts"] if c.get("id") == "core-private")
    assert contract["type"] == "protected"
    assert contract["allowed_importers"] == ["shared.core"]
    return {name.removeprefix("shared.core.") for name in contract["protected_modules"]}


def test_every_core_module_is_public_or_private() -> None:
    private = _protected()
    assert not PUBLIC & private
    assert _top_level_modules() == PUBLIC | private


def test_the_package_docstring_names_each_public_module() -> None:
    doc = shared.core.__doc__ or ""
    assert all(f"- `{name}`" in doc for name in PUBLIC)


def test_the_result_values_load_none_of_the_cores_machinery() -> None:
    code = (
        "import sys; import shared.contracts.messages, shared.core.result; "
        "print(sorted(m for m in sys.modules if m.startswith('shared.core') or m == 'numpy'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    # The shard config on the wire reads KAI's plugin priorities: a table, not machinery.
    loaded = [
        "shared.core",
        "shared.core.node_pool",
        "shared.core.plugins",
        "shared.core.plugins.priorities",
        "shared.core.policy",
        "shared.core.result",
        "shared.core.usage",
    ]
    assert out.stdout.strip() == str(loaded)
