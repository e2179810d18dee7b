"""The five actions, run in KAI's order each cycle: allocate, consolidation, reclaim, preempt,
stale-gang eviction. Each takes the session and changes it only through statements."""
