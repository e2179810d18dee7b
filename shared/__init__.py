"""Kairos shared code: the data model, the pure scheduling core, the conformance runner and the CLI."""
