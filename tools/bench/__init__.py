"""Kairos's benchmarks: the suite behind `kairos bench` (`make bench`, `make bench-quick`), and three
standalone benchmarks run as programs.

The suite: scheduler_perf-style workloads (`workloads`, pure data), run on the pure core in this process
(`inprocess`) and through the whole stack over NATS against the simulated Kubernetes API server (`bus`),
measured the same way (`measure`), with per-process CPU and peak RSS (`procstats`), the state replica's
memory target (`memory`), the JSON report and its plot (`report`), and the plan that ties them together
(`suite`). Called by `tools.cli.bench` and the smoke test in tests/e2e. matplotlib is imported only
inside the plotting function.

The standalone ones (`python -m tools.bench.<name>`): `core` (`make bench-core`: allocation throughput, a
reclaim decision and `fair_share` on the pure core) and `tracing_overhead` (`make bench-tracing`:
scheduling throughput over the bus with tracing off and on, and the tracing code's own cost).
"""
