"""The ``kairos`` command-line tool; its entry point is ``tools.cli.main:run``."""
