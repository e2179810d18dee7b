"""The task-leak guard of tests/conftest.py fails async tests that leave tasks pending, and only those."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

INI = """
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
asyncio_default_test_loop_scope = function
"""

TESTS = """
import asyncio

import pytest
import pytest_asyncio


async def test_leaks_a_task():
    asyncio.create_task(asyncio.sleep(100))


async def test_awaits_its_task():
    await asyncio.create_task(asyncio.sleep(0))


async def test_cancels_without_awaiting():
    asyncio.create_task(asyncio.sleep(100)).cancel()


def test_sync():
    pass


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def server():
    task = asyncio.create_task(asyncio.sleep(100))
    yield task
    task.cancel()


@pytest.mark.asyncio(loop_scope="module")
async def test_uses_a_module_scoped_task(server):
    assert not server.done()


@pytest.mark.asyncio(loop_scope="module")
async def test_leaks_in_a_module_loop(server):
    asyncio.create_task(asyncio.sleep(100))
"""


def test_guard_flags_only_leaking_tests(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini(INI)
    pytester.makepyfile(test_guarded=TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=6, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_a_task*",
            "the test left 1 asyncio task(s) pending:",
            "*ERROR at teardown of test_leaks_in_a_module_loop*",
            "the test left 1 asyncio task(s) pending:",
        ]
    )
