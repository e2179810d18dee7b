"""KAI's ``elastic``: jobs below their gang size first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shared.core.builtin._arguments import constant
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginSpec
from shared.core.tasks import (
    min_available_state,
)

if TYPE_CHECKING:
    from shared.core.plugins.points import OrderKey
    from shared.core.session import Session
    from shared.core.tasks import JobState

__all__ = ["SPEC"]


class ElasticOrder:
    """KAI elastic: jobs below their gang size first, then those exactly at it, then those above."""

    def job_key(self, job: JobState) -> OrderKey:
        return (min_available_state(job),)


SPEC: PluginSpec[Session] = PluginSpec("elastic", constant(Plugin(job_order=ElasticOrder())), KAI["elastic"])
