"""`python -m services.placement`: run one placement worker (flags: `--help`; options:
`--set wait_timeout=5`, `--set fence=true`, see `services.placement.service.PlacementSettings`)."""

from __future__ import annotations

import sys

from services.placement.service import SERVICE, body
from shared.bus.service import main

if __name__ == "__main__":
    sys.exit(main(SERVICE, body))
