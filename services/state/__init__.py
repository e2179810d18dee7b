"""The state service: owns the cluster source and materialises it into JetStream KV `kairos_state`.

One replica owns the source, the simulated cluster (`--set source=sim`, the default: it answers
`cluster.apply`, `cluster.bind` and `cluster.evict`) or a Kubernetes cluster (`--set source=kube`, elected
with a lease), writes every change to KV and keeps the binders' ledger in `kairos_ledger` true to the
cluster; any number of read replicas (`--set source=none`) answer `state.snapshot` from their own
`StateReplica`.

The shell and the sources:

- `service`: the NATS shell (options, requests, timers, snapshot answers, shutdown).
- `__main__`: `python -m services.state`, what `kairos up` and `kairos serve state` run.
- `sim_source`: the simulated cluster (`SimulatedCluster`, the demo cluster); no I/O.
- `kube_source`: the Kubernetes source (informers in, KV out; its election, and the owner that runs the
  controllers below).
- `kv_objects`: what KV holds (`Obj`, `Change`, keys and records), shared by both sources and the writer.
- `kv_writer`: the KV materialiser's writer (state bucket writes, ledger clean-up).

The Kubernetes mirror, pure (no I/O, no clock):

- `mirror`: the raw objects, their cached translations, the hold-back of objects whose references do not
  resolve, and the flush that turns changes into `Change`s.
- `stages`: the stage verdicts the mirror holds podgroups back by (`kairos.io/after`), over
  `dependencies` (the annotation's syntax and the pure evaluation of the dependency graph).
- `gpu_overlay`: the node agents' inventory and telemetry laid over each node, over `gpu_inventory` (the
  inventory merge) and `gpu_usage` (decayed telemetry, health, hysteresis; the simulated telemetry too).
- `foreign`: what pods Kairos does not schedule hold on each node, taken off its capacity.
- `problems`: what users see of a held-back object (the problem, its reason, the condition patches).

The controllers, run by the Kubernetes owner after each flush:

- `podgrouper`: the pod-grouper loop (a PodGroup for every pod of ours that has none), over `grouping`
  (KAI's pure grouping decision).
- `gate_keepers`: the gate keepers that lift the `kairos.io/after` and `kairos.io/admission` scheduling
  gates, over `gate_patches` (who gets a gate, the patches that set and lift one).
- `podwork`: the pod-work loop the pod-grouper and the gate keepers share.
- `writeback`: Kairos's events written back as Kubernetes Events and statuses.
- `problem_report`: Events and conditions for the objects the mirror holds back.
- `shard_watch`: the SchedulingShard this shard serves, into KV as its `ShardRecord` (or a Warning Event
  and condition naming the field), over `shards` (reading it, pure).

And on every replica with `webhook_port`: `webhook`, the mutating admission webhook (GPU-sharing
environment, scheduling gates), over `admission_review` (the AdmissionReview protocol, sans-I/O).
"""
