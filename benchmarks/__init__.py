"""Kairos performance benchmarks (run as `python -m benchmarks.<name>`)."""
