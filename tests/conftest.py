"""Project-wide test fixtures, and the hypothesis profile every property runs under (no deadline).

Every async test is checked for leaked asyncio tasks: a task the test (or one of its function-scoped
fixtures) started and left pending fails the test. Without this check the leak would go unnoticed, since
pytest-asyncio's runner silently cancels whatever is left when it closes the loop.
"""

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings

from tools.stack.nats_server import NatsServer, start_nats_server

# Properties are judged by what they find, never by how long an example took: on a loaded 2-core
# machine (CI beside other jobs) hypothesis's 200 ms deadline and its too-slow health check failed
# specs whose code was right. A spec that sets its own settings still overrides these.
settings.register_profile("kairos", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("kairos")

# How long a task that was cancelled but not awaited gets to finish before it counts as a leak.
_CANCEL_GRACE_SECONDS = 1.0

_LOOP_SCOPES = ("function", "class", "module", "package", "session")


def _make_task_leak_guard(loop_scope: str) -> Callable[[], AsyncIterator[None]]:
    async def guard() -> AsyncIterator[None]:
        before = asyncio.all_tasks()
        yield
        candidates = asyncio.all_tasks() - before - {asyncio.current_task()}
        # A task the test cancelled without awaiting is on its way out: let it finish.
        cancelled = {task for task in candidates if task.cancelling()}
        if cancelled:
            await asyncio.wait(cancelled, timeout=_CANCEL_GRACE_SECONDS)
        leaked = {task for task in candidates if not task.done()}
        if not leaked:
            return
        descriptions = sorted(repr(task) for task in leaked)
        for task in leaked:
            task.cancel()
        await asyncio.gather(*leaked, return_exceptions=True)
        pytest.fail(
            f"the test left {len(leaked)} asyncio task(s) pending:\n" + "\n".join(descriptions),
            pytrace=False,
        )

    guard.__name__ = f"_task_leak_guard_{loop_scope}"
    return guard


# One guard per loop scope, so that the guard runs in the same event loop as the test it checks.
for _scope in _LOOP_SCOPES:
    globals()[f"_task_leak_guard_{_scope}"] = pytest_asyncio.fixture(loop_scope=_scope)(
        _make_task_leak_guard(_scope)
    )


@pytest.fixture(autouse=True)
def _no_leaked_tasks(request: pytest.FixtureRequest) -> None:
    """Fail an async test that leaves asyncio tasks pending; a no-op for sync tests."""
    item = request.node
    if isinstance(item, pytest.Function) and pytest_asyncio.is_async_test(item):
        marker = item.get_closest_marker("asyncio")
        loop_scope = (
            (marker.kwargs.get("loop_scope") if marker is not None else None)
            or request.config.getini("asyncio_default_test_loop_scope")
            or "function"
        )
        # Requested here, first of the test's fixtures, so that its teardown check runs last: after the
        # test's other function-scoped fixtures have stopped what they started.
        request.getfixturevalue(f"_task_leak_guard_{loop_scope}")


@pytest.fixture(autouse=True, scope="session")
def _one_default_event_loop() -> Iterator[None]:
    """Own the thread's default event loop for the whole session and close it at the end.

    pytest-asyncio asks for the current loop between tests; with none set, Python 3.11 creates one that
    nobody closes, and its garbage collection fails whichever test happens to be running then.
    """
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield
    asyncio.set_event_loop(None)
    loop.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow run first, in their collection order, then the rest in theirs. `make test`
    runs the suite in two worker processes (pytest-xdist), which take tests from this order as they free
    up: a three-minute test reached last ran alone while the other worker had nothing left to do."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A real nats-server (JetStream, a free port, state under the test's tmp_path) for one test."""
    server = start_nats_server(tmp_path / "nats-state")
    try:
        yield server
    finally:
        server.stop()
