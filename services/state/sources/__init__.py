"""The state service's sources: where the cluster comes from, and how its changes reach KV.

Chosen by `services.state.service` from the option `source`; the one replica that owns the source writes
every change it returns through `kv_writer`.

- `source`: the `Source` protocol both owners are (the binders' stamps, `kairos explain`'s "why") and
  `SourceAnswers`, their one pair of subscriptions.
- `sim_source`: the simulated cluster (`source=sim`, the default; `SimulatedCluster`, the demo cluster); no
  I/O. `tools.sim` runs it too. `sim_owner`: its owner (requests, timers, writes; a `Source`).
- `kube_source`: the Kubernetes source (`source=kube`): informers in, the mirror (`services.state.mirror`),
  KV out; its election, and the owner that runs the controllers (`services.state.controllers`). Beside its
  own informers: `dra_watch`, `volume_watch`, `numa_watch`. Its owner (`KubeOwner`) is a `Source`.
- `partitions`, `partition_owners`, `partitioned_source`, `partitioned_writer`: `partitions=N`, the
  per-pod work divided over the live replicas (the table, the leases, the source, the fenced writes).
- `kv_objects`: what KV holds (`Obj`, `Change`, keys and records), shared by both sources, the mirror and
  the writer; `kv_writer`: the state bucket's writes and the ledger clean-up.
"""
