"""The scheduling core: pure decisions over a snapshot (fair share, session, actions, plugins).

No I/O, no clock, no asyncio: time comes in as an argument, and what the core decides comes out as values.

Public modules (what code outside shared.core may import):

- `scheduler`: `schedule(snapshot, now, policy, focus=None, *, around_action=None, want_view=False,
  node_details=(), registry=None)` runs one cycle and returns a `CycleResult`; `ActionHook` is the type of
  `around_action`. Called by the placement worker, the simulator, the in-process benchmark and the
  conformance runner.
- `result`: the values of a `CycleResult`: `BindProposal`s of `Binding`s (each pod's key, name, node,
  shared devices, CPU, memory and the GPUs it holds in its queue's quota), `EvictionOrder`s,
  `PipelinedPod`s, `PendingExplanation`s, the stale, last-start and last-eviction stamps, a `PodGroupStatus` per
  podgroup (with `NodeRefusals` on request), the `Committed` counts, and the `SessionView` on request.
  The wire contract (`shared.contracts.messages`) carries these structs as they are.
- `queue_plan`: `plan_queues(snapshot, now, policy) -> QueuePlan`: every queue's `QueueShare` (fair
  share, allocation, request, deserved quota as `Resources`), the pending podgroups in the job order
  allocate starts with, whether stale-gang eviction is due, the podgroups a queue total bounds, and the
  quota gate's verdicts. Called by the queue dispatcher and `kairos status`.
- `quota_gate`: `quota_verdicts(snapshot, now, policy)` and `QuotaVerdict` (which gated pods their queues
  have room for); part of the queue plan.
- `policy`: `Policy`, the knobs of a cycle (with `PluginConfig`, one entry of its plugin list), and
  `KNOWN_ACTIONS`.
- `plugins`: the extension points (`plugins.points`, one `typing.Protocol` each), the registry value
  (`plugins.registry`: `Plugin`, `PluginSpec`, `Registry`, `PluginConfigError`), the session's chains
  (`plugins.chain.resolve`), the one runtime that runs them (`plugins.runtime`: `Runtime`, and
  `points.Status`, what a plugin's answer or failure becomes) and the read-only view plugins are typed
  against (`plugins.view.CycleView`). Third-party plugins implement these.
- `builtin_plugins`: `DEFAULT_REGISTRY` (`Registry(builtin.SPECS)`: one module per built-in plugin under
  the private `builtin` package), KAI's plugins wrapping the core's filters, scores and orders;
  the shells extend it with the plugins they load (`shared.plugin_loader`) and pass it to `schedule`.
- `stamps`: `merged_stamps`, `latest` and `KEEP`, how the stale, last-start and last-eviction stamps of
  parallel proposals merge (the binder and the state service).
- `fair_share`: `compute_fair_shares`, KAI's fair-share division on its own (the fair-share benchmark).
- `node_pool`: `NodePool` and `in_pool(snapshot, pool)`, the part of a snapshot one shard schedules (the
  state replica's `shard_snapshot`).
- `recheck`: `refusals(snapshot, placements, now, policy, registry=None)`: placements decided on an
  older state put again through the allocation's node pre-filters, filters and resource fit on the
  snapshot given (the pods that no longer pass, with the first reason). Called by the binder's resource-fit
  conflict mode.
- `usage`: time-based fair share: the `UsageLedger` of what each queue held over time (`sample`,
  `record_interval`) and `usage_fractions`, its decayed, windowed usage as a fraction of the cluster's
  capacity (`Policy.queue_usage`). Kept by the queue leader.
- `selectors`: Kubernetes' label-selector, node-selector-term, affinity-term and toleration matching
  (`node_term_matches`, `label_selector_matches`, ...), the one reading of its operators; also used by the
  binder's volume wait.
- `dra_cel`: CEL over DRA devices (Kubernetes' DRA CEL environment, each expression compiled once and
  cached): `check(expression)` raises `CelError` for one that does not compile, which translation
  (`shared.kube.dra`) calls so a bad selector is refused where it enters; the core's allocator evaluates
  them with `matches`.
- `bind_backoff`: kube-scheduler's back-off after a refused bind (`backoff`, `retry_at`, `message`), and
  `recorded`, the next `BindFailure` record the binder keeps per podgroup; the session holds a podgroup
  inside its back-off.

Everything else is private to the core, and an import-linter `protected` contract keeps it so (unit specs
under tests/ may still look inside): the session and its statements (`session`, `opening`, `statement`, `cycle`),
the actions and what they share (`actions`, `allocation`, `solver`, `minruntime`, `reclaimable`), node
filters and scores (`predicates`, `scoring`, `fractional_gpus`, `topology`, `spread`, `volumes`, `dra`,
`dra_accounting`), ordering and queue accounting
(`ordering`, `proportion`), and the session's state (`tasks`, `cluster`). An `acyclic_siblings` contract
keeps the core's modules free of import circles.
"""
