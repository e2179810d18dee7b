"""An example Kairos scheduler plugin: a node score preferring nodes that carry a label.

Installed, it registers itself under the ``kairos.plugins`` entry-point group (see pyproject.toml); the
placement worker loads it at start-up (`shared.plugin_loader.load_registry`). A policy enables it like
any plugin: ``Policy(plugins=(..., PluginConfig(name="labelscore", arguments={"label": "tier=fast"})))``.

Arguments: ``label`` (``key`` or ``key=value``; required) and ``weight`` (added to a matching node's score;
default 100000, above every KAI score, so it decides among the nodes that fit).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from shared.core.plugins.points import NodeScore
from shared.core.plugins.registry import Plugin, PluginConfigError, PluginSpec
from shared.core.plugins.view import CycleView, TaskView
from shared.core.policy import Argument, Policy

NAME = "labelscore"


class LabelScore:
    """`NodeScore`: `weight` for each node whose labels match, 0 elsewhere. The factory builds one per
    session (`shared.core.plugins.chain.resolve`), so the scores are computed once and kept. It reads the
    cycle through `CycleView` (the nodes in score order and their labels), never the core's session."""

    def __init__(self, key: str, value: str | None, weight: float) -> None:
        self.key = key
        self.value = value
        self.weight = weight
        self._scores: npt.NDArray[np.float64] | None = None

    def score(
        self, ssn: CycleView, task: TaskView, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        if self._scores is None:
            nodes = ssn.cluster.order
            self._scores = np.array([self._matches(n.labels) * self.weight for n in nodes], dtype=np.float64)
        return self._scores

    def _matches(self, labels: Mapping[str, str]) -> bool:
        if self.key not in labels:
            return False
        return self.value is None or labels[self.key] == self.value


def factory(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[CycleView]:
    label = arguments.get("label")
    if not isinstance(label, str) or not label:
        raise PluginConfigError(NAME, "a label key or key=value is required", "label")
    key, sep, value = label.partition("=")
    weight = arguments.get("weight", 100000.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float | str):
        raise PluginConfigError(NAME, f"{weight!r} is not a number", "weight")
    return Plugin(node_score=LabelScore(key, value if sep else None, float(weight)))


SPEC: PluginSpec[CycleView] = PluginSpec(NAME, factory, 150, ("label", "weight"), enabled_by_default=False)

_: NodeScore[CycleView] = LabelScore("k", None, 1.0)
