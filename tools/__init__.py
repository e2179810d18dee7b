"""Kairos's developer and operator tools: everything that runs, tests or measures the scheduler without
being part of it.

The runtime (``shared``, the library every service imports, and ``services``, the processes a deployment
runs) never imports this package; an import-linter contract says so. The tools import the runtime.
"""
