"""Kairos services: the processes a deployment runs, the four scheduler services (state, queue,
placement, binder) talking over NATS and the GPU node agent (``gpu_agent``).

Each subpackage is one service; services never import each other (an import-linter contract) and share
code only through ``shared``. What runs and tests them (the simulated API server among it) is in ``tools``.
"""
