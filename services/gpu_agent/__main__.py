"""`python -m services.gpu_agent --set node=NAME [--set period=SECONDS] [--allow-no-gpu]`: run the GPU agent
of one node (node defaults to env NODE_NAME; flags: `--help`; see `services.gpu_agent.service`)."""

from __future__ import annotations

import sys

from services.gpu_agent.service import run

if __name__ == "__main__":
    sys.exit(run())
