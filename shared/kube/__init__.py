"""Kubernetes objects as Kairos reads and writes them, translated to and from the model; pure, no I/O.

- `wire`: msgspec Structs for the JSON Kairos reads (pods, nodes, priority classes, queues, podgroups,
  topologies, scheduling shards, workload owners) and their decoders, whose errors name the object and
  the field.
- `quantity`: resource quantities and Go durations, parsed exactly.
- `translate`: wire objects to `shared.model` (KAI's rules and units), and the JSON written back (events,
  podgroup and queue status patches, the GPU-group annotation).
- `keys`: the label, annotation and resource names involved.
- `gpu_sharing`: KAI's GPU sharing (fractions, GPU groups, reservation pods) as the webhook, translation
  and the binder read it.
- `scheduling_gates`: Kairos's scheduling gates' names and the webhook registration that sets them.
- `kai_plugins`: KAI's scheduler plugins (names, default priorities, arguments) as switches of the core's
  `Policy`, shared by the SchedulingShard and the conformance runner's plugin tiers.
- `scheduling_shard`: a SchedulingShard (kai.scheduler/v1) as one shard's configuration, merged with KAI's
  defaults, and the `Policy` its cycles run with; what it cannot honour yet is reported, not dropped.

The I/O side (kubernetes-asyncio clients, informers, API calls) is `shared.kubeapi`.
"""
