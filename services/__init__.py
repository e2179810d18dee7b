"""Kairos services: the four processes that will run the scheduler over NATS (built in issue 3).

Each subpackage is one service; services never import each other (an import-linter contract) and share
code only through ``shared``.
"""
