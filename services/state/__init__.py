"""The state service: owns the cluster source and materialises it into JetStream KV `kairos_state`.

One replica owns the source, the simulated cluster (`--set source=sim`, the default: it answers
`cluster.apply`, `cluster.bind` and `cluster.evict`) or a Kubernetes cluster (`--set source=kube`, elected
with a lease), writes every change to KV and keeps the binders' ledger in `kairos_ledger` true to the
cluster; any number of read replicas (`--set source=none`) answer `state.snapshot` from their own
`StateReplica`.

At the top, the shell:

- `service`: the NATS shell (options, requests, timers, snapshot answers, shutdown).
- `__main__`: `python -m services.state`, what `kairos up` and `kairos serve state` run.
- `snapshot_http`: `GET /get-snapshot` on the health port.
- `replies`: how core NATS messages are answered (decode or count, reply, drop after SIGTERM).

And four folders, each with its own docstring:

- `sources`: where the cluster comes from and how it reaches KV: the simulated cluster, the Kubernetes
  source (informers, election, the owner that runs the controllers), its partitions, the KV writer and the
  vocabulary both sources share (`kv_objects`).
- `mirror`: the Kubernetes mirror, pure (no I/O, no clock): the raw objects, their cached translations,
  the hold-back of objects whose references do not resolve, the stages, the GPU and NUMA overlays, the
  foreign pods, the problems, and the flush that turns changes into `Change`s.
- `controllers`: what the Kubernetes owner runs after each flush: the pod-grouper (over `grouping`, one
  module per owner kind), the gate keepers, the pod-work loop they share, the write-back, the problem
  report, the shard watch and the node-scale-adjuster.
- `webhook`: the admission webhooks every replica with `webhook_port` serves (pods: GPU-sharing
  environment, scheduling gates, device access; queues: KAI's queue validation).
"""
