"""The state service: owns the cluster source and materialises it into JetStream KV `kairos_state`.

One replica (`--set source=sim`, the default) owns the simulated cluster, answers `cluster.apply`,
`cluster.bind` and `cluster.evict`, writes every change to KV and keeps the binders' ledger in
`kairos_ledger` true to the cluster; any number of read replicas (`--set source=none`) answer
`state.snapshot` from their own `StateReplica`. Modules: `sim_source` (the simulated cluster, no I/O),
`writer` (KV writes and ledger clean-up), `service` (the NATS shell: options, requests, timers, shutdown),
`__main__` (`python -m services.state`, what `kairos up` and `kairos serve state` run).
"""
