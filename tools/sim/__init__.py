"""The in-process simulator: a loop that applies the core's decisions to a synthetic cluster
(`simulator`), and the scripted demo on it (`demo`).

Used by `kairos demo` and the property tests; the same core runs here as in the services. The synthetic
clusters and workloads come from `shared.model.builders`.
"""
