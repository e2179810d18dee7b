"""The placement service, built in issue 3: it will run the scheduling actions of the pure core (allocate,
consolidation, reclaim, preempt, stale gang eviction) on a snapshot and publish the resulting binds and
evictions over NATS. Nothing is implemented here yet.
"""
