"""`python -m services.queue`: run one queue replica (flags: `--help`; options: `--set batch=all|N`,
`--set period=1.0`, `--set cycles=auto|admin`, see `services.queue.settings.QueueSettings`)."""

from __future__ import annotations

import sys

from services.queue.service import SERVICE, body
from shared.bus.service import main

if __name__ == "__main__":
    sys.exit(main(SERVICE, body))
