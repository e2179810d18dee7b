"""What the built-in plugins' factories share: the factory of a plugin with nothing to configure, and a
numeric argument read with an error naming the plugin and the argument."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from shared.core.plugins.registry import PluginConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from shared.core.plugins.registry import Plugin, PluginFactory
    from shared.core.policy import Argument, Policy

__all__ = ["constant", "number"]

S = TypeVar("S")


def constant(plugin: Plugin[S]) -> PluginFactory[S]:
    """The factory of a plugin that takes no arguments and reads no policy field."""

    def factory(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[S]:
        return plugin

    return factory


def number(plugin: str, key: str, raw: Argument) -> float:
    """`raw` as a float; `PluginConfigError` naming the plugin and the argument when it is not a number."""
    if isinstance(raw, bool):
        raise PluginConfigError(plugin, f"{raw!r} is not a number", key)
    try:
        return float(raw)
    except (ValueError, OverflowError):  # OverflowError: an int past the floats (10**400)
        raise PluginConfigError(plugin, f"{raw!r} is not a number", key) from None
