"""The queue service: one active dispatcher per shard, elected by a lease with a fencing term.

The leader keeps a replica of the cluster state, publishes each queue's fair share (`queue-fair-share`
events) and dispatches the pending podgroups to the placement workers as work items stamped with the state
and ledger revisions and its lease term; it answers `admin.<shard>.cycle` requests. Standbys keep a warm
replica and take over within a few seconds of the leader's death. Modules: `lease` (the lease state
machine), `dispatcher` (the cycle: pure planning and the in-flight bookkeeping), `service` (the shell).
"""
