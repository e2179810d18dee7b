"""The placement service: workers that run the scheduling core on their own replica of the cluster.

Each replica pulls work items from the shard's work stream (one durable consumer shared by all replicas,
so each item goes to one worker), runs the core's actions on a snapshot at least as new as the item's
revisions, and publishes a proposal (binds, evictions, pipelined pods, explanations, the ledger revisions
it relied on) for the binders. Modules: `worker` (session -> proposal, the item handler), `service` (the
shell: consumer loop, settings).
"""
