"""Opening a session: the policy's plugin chains resolved against a registry, then the session built on them.

`open_session(snapshot, now, policy, focus, registry, accounting_only=...)` is the one way the core opens a session: the cycle
runner (`shared.core.cycle`), the queue plan (`shared.core.queue_plan`) and the quota gate
(`shared.core.quota_gate`) call it. `registry=None` means KAI's plugins
(`shared.core.builtin_plugins.DEFAULT_REGISTRY`). Raises `PluginConfigError` for a plugin list the registry
cannot run.
"""

from __future__ import annotations

from shared.core.builtin_plugins import DEFAULT_REGISTRY, SessionRegistry
from shared.core.plugins.chain import resolve
from shared.core.policy import Policy
from shared.core.session import Session
from shared.model import Snapshot

__all__ = ["open_session"]


def open_session(
    snapshot: Snapshot,
    now: float,
    policy: Policy,
    focus: frozenset[str] | None = None,
    registry: SessionRegistry | None = None,
    *,
    accounting_only: bool = False,
) -> Session:
    chains = resolve(policy, DEFAULT_REGISTRY if registry is None else registry)
    return Session(snapshot, now, policy, chains, focus, accounting_only=accounting_only)
