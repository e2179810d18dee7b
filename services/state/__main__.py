"""`python -m services.state`: run the state service (what `kairos up` and `kairos serve state` start)."""

from __future__ import annotations

import sys

from services.state.service import body
from shared.bus.service import main

if __name__ == "__main__":
    sys.exit(main("state", body, sys.argv[1:]))
