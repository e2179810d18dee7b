"""The benchmark suite behind `kairos bench` (`make bench`, `make bench-quick`).

scheduler_perf-style workloads (`workloads`, pure data), run on the pure core in this process
(`inprocess`) and through the whole stack over NATS against the simulated Kubernetes API server (`bus`),
measured the same way (`measure`), with per-process CPU and peak RSS (`procstats`), the state replica's
memory target (`memory`), the JSON report and its plot (`report`), and the plan that ties them together
(`suite`). Called by `tools.cli.bench` and the smoke test in tests/e2e. matplotlib is imported only
inside the plotting function.
"""
