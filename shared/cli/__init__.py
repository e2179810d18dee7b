"""The ``kairos`` command-line tool; its entry point is ``shared.cli.main:main``."""
