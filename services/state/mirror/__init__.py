"""The Kubernetes mirror: the objects the state service's Kubernetes source sees, as the model objects KV
holds. Pure: no I/O, no clock (the import-linter contract keeps this whole folder so).

Fed and drained by `services.state.sources.kube_source` (informer lists and watch events in, the flush's
`Change`s out); read by the controllers (`services.state.controllers`) and the webhook's PodGroup lookup.

- `cache`: the `Mirror` itself: the raw objects, their cached translations, the hold-back of objects whose
  references do not resolve, and the flush that turns changes into `Change`s.
- `object_mirror`, `volume_mirror`, `dra_mirror`: the storage and DRA objects, one shape for both.
- `stages`: the stage verdicts podgroups are held back by (`kairos.io/after`), over `dependencies` (the
  annotation's syntax and the pure evaluation of the dependency graph).
- `gpu_overlay`: the node agents' inventory and telemetry laid over each node, over `gpu_inventory` (the
  inventory merge) and `gpu_usage` (decayed telemetry, health; the simulated telemetry too);
  `numa_overlay`: the NodeResourceTopology objects laid over their nodes.
- `foreign`: what pods Kairos does not schedule hold on each node, taken off its capacity.
- `problems`: what users see of a held-back object (the problem, its reason, the condition patches).
"""
