"""The scheduling core: pure decisions over a snapshot (fair share, session, actions, plugins).

No I/O, no clock, no asyncio: `shared.core.scheduler.schedule(snapshot, now, policy)` is the entry point
for the conformance runner, the in-process simulator and (later) the placement service.
"""
