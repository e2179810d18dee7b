"""Reclaim: not implemented yet."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.core.session import Session


def run(ssn: Session) -> None:
    return None
