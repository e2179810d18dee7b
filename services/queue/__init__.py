"""The queue service: one active dispatcher per shard, elected by a lease with a fencing term.

The leader keeps a replica of the cluster state, publishes each queue's fair share (`queue-fair-share`
events) and dispatches the pending podgroups to the placement workers as work items stamped with the state
and ledger revisions and its lease term; it answers `admin.<shard>.cycle` requests. Standbys keep a warm
replica and take over within a few seconds of the leader's death. Modules, the shell down to the pure
decisions: `service` (the body), `shards` (one lease and dispatcher per served shard), `dispatcher` (the
leader's loop: I/O only), `planning` (a cycle's plan), `batching` (its work items), `window` (the in-flight
window and back-off), `settings` (the options), `usage` and `usage_layout` (the usage ledger in KV).
"""
