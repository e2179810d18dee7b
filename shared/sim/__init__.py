"""The in-process simulator: synthetic clusters and workloads, and a loop that applies decisions.

Used by `kairos demo` (`make run`), the core benchmark and the property tests; the same core runs here
as in the services.
"""
