"""Every Kairos process runs on uvloop's loop (`shared.event_loop`): the services' runner, kubesim and the
benchmark's driver get it from there."""

from __future__ import annotations

import asyncio

import uvloop

from shared import event_loop


async def _loop_and_sum(a: int, b: int) -> tuple[asyncio.AbstractEventLoop, int]:
    await asyncio.sleep(0)
    return asyncio.get_running_loop(), a + b


def test_run_runs_the_coroutine_on_uvloop_and_returns_its_result() -> None:
    loop, total = event_loop.run(_loop_and_sum(2, 3))
    assert isinstance(loop, uvloop.Loop)
    assert total == 5
    assert loop.is_closed()


def test_a_new_loop_is_uvloop_s_and_runs_what_it_is_given() -> None:
    loop = event_loop.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
        assert loop.run_until_complete(_loop_and_sum(1, 1))[1] == 2
    finally:
        loop.close()


def test_the_service_runner_and_kubesim_take_their_loop_from_it() -> None:
    from shared.bus import service
    from tools.kubesim import __main__ as kubesim_main

    assert service.event_loop is event_loop
    assert kubesim_main.event_loop is event_loop
