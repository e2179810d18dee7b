"""`python -m services.binder`: run one binder replica (flags and environment as in `shared.bus.service`)."""

from __future__ import annotations

import sys

from services.binder.service import SERVICE, run
from shared.bus.service import main

if __name__ == "__main__":
    sys.exit(main(SERVICE, run))
