"""The in-process simulator: the core deciding over the state service's simulated cluster, without NATS
(`simulator`), and the scripted demo on it (`demo`).

Used by `kairos demo` and the core's property specs; the same core runs here as in the services, and the
same pod lifecycle as the state service's in-memory cluster (`services.state.sources.sim_source`). The synthetic
clusters and workloads come from `shared.model.builders`.
"""
