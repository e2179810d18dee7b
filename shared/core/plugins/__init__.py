"""The core's plugin machinery: extension points, the registry value, and the chains a session runs.

Public (the shells and third-party plugins may import it):

- `points`: one `typing.Protocol` per extension point, each with its contract (`NodeFilter`,
  `NodePreFilter`, `NodeScore`, `GpuDeviceOrder`, `JobOrder`, `TaskOrder`, `PodSetOrder`, `QueueOrder`, `QuotaCheck`,
  `VictimFilter`);
- `registry`: `Plugin` (what one plugin contributes), `PluginSpec` (name, factory, default priority,
  arguments), `Registry` (a frozen name -> spec mapping that refuses duplicates), `PluginConfigError`;
- `view`: `CycleView` (and `NodeView`, `ClusterView`, `TaskView`), the typed, read-only view of the cycle a
  plugin outside the core types its session argument as;
- `chain`: `resolve(policy, registry) -> Chains`, once per session;
- `runtime`: `Runtime`, which runs every chain of a session (`Session.plugins`) and turns a plugin's
  exception into a `points.Status` with `Code.ERROR` and the plugin's name, so a broken plugin fails the
  pod it was evaluating, never the cycle.

KAI's plugins, wrapping the core's own filters, scores and orders, are `shared.core.builtin_plugins`.
This package imports nothing above the session's state (tasks, cluster, proportion, policy), so every
core module may read the chains.
"""
