"""A lease holder's deadline and the terms it learns outside the lease key (`shared.bus.lease`), over the
in-memory bucket with JetStream KV's TTL of `tests.unit.test_lease_logic`. The write fence
(`shared.bus.fence`) refuses every write once the deadline has passed, and raises its fence only above every
term it has seen."""

from __future__ import annotations

from shared.bus.lease import RENEW_INTERVAL_S, SAFETY_MARGIN_S
from shared.contracts import subjects as s
from tests.unit.test_lease_logic import Clock, FakeBucket, keeper


async def test_the_deadline_is_the_last_good_renewal_plus_the_ttl_less_the_margin() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a = keeper(bucket, "a")
    await a.step()
    assert a.deadline() == 100.0 + s.LEASE_TTL_S - SAFETY_MARGIN_S
    clock.t += RENEW_INTERVAL_S
    await a.step()
    assert a.deadline() == 100.0 + RENEW_INTERVAL_S + s.LEASE_TTL_S - SAFETY_MARGIN_S
    bucket.fail = True  # a failed renewal moves nothing
    clock.t += RENEW_INTERVAL_S
    await a.step()
    assert a.deadline() == 100.0 + RENEW_INTERVAL_S + s.LEASE_TTL_S - SAFETY_MARGIN_S


async def test_a_holder_resumed_after_a_pause_is_past_its_deadline_before_it_steps_again() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    a = keeper(bucket, "a")
    await a.step()
    clock.t += s.LEASE_TTL_S + 1.0  # SIGSTOP, SIGCONT: the monotonic clock ran on
    # Still leading by its last step, but not valid: a write checked now is refused unsent.
    assert a.leading
    assert clock() >= a.deadline()
    assert not a.valid()


async def test_a_contender_that_learnt_a_term_acquires_above_it() -> None:
    clock = Clock()
    bucket = FakeBucket(clock)
    b = keeper(bucket, "b")
    # The lease key expired before b ever saw it; the fence says term 4 was raised.
    b.learn_term(4)
    b.learn_term(2)  # an older term teaches nothing
    assert await b.step() is True
    assert b.term == 5
