"""The controllers the state service's Kubernetes owner runs (`services.state.sources.kube_source.KubeOwner`),
each woken after a flush of the mirror (`services.state.mirror`) or by its own informer or stream.

- `podgrouper`: the pod-grouper loop (a PodGroup for every pod of ours that has none), over `grouping`
  (KAI's pure grouping decision, one module per owner kind).
- `gate_keepers`: the gate keepers that lift the `kairos.io/after` and `kairos.io/admission` scheduling
  gates (the patches are `services.state.webhook.gate_patches`').
- `podwork`: the pod-work loop the pod-grouper and the gate keepers share.
- `writeback`: Kairos's events written back as Kubernetes Events and statuses.
- `problem_report`: Events and conditions for the objects the mirror holds back.
- `shard_watch`: every SchedulingShard into KV as its `ShardRecord` (or a Warning Event and condition naming
  the field), over `shards` (reading them, pure), `shard_notes` (what a shard asks that Kairos leaves out)
  and `shard_coverage` (what no shard schedules).
- `scale_adjuster`: the node-scale-adjuster loop, over `scaling_pods` (KAI's rules, pure).
"""
