"""The suite-wide check of tests/conftest.py fails a test that leaves a non-daemon thread or an
asyncio task running, and passes one that stops what it starts: run on a small test file in
a pytest subprocess that uses our conftest."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]

CONFTEST = """
import threading

from tests.conftest import _no_leftover_tasks, no_leftover_threads_or_tasks

STOP = threading.Event()


def pytest_unconfigure(config):
    STOP.set()  # let the leaked thread end so the subprocess can exit
"""

TESTS = """
import asyncio
import threading

from conftest import STOP


def test_leaks_a_thread():
    threading.Thread(target=STOP.wait, name="leaky-thread").start()


def test_stops_its_thread():
    done = threading.Event()
    thread = threading.Thread(target=done.wait, name="tidy-thread")
    thread.start()
    done.set()


async def test_leaks_a_task():
    asyncio.create_task(asyncio.Event().wait(), name="leaky-task")


async def test_cancels_its_task():
    task = asyncio.create_task(asyncio.Event().wait(), name="tidy-task")
    task.cancel()
"""


@pytest.mark.timeout(120)
def test_a_test_leaving_a_thread_or_task_running_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("COLUMNS", "400")  # the summary lines whole, not cut to the terminal
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_inner=TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-o", "asyncio_mode=auto", "-W", "ignore", "-q", "-rE"
    )
    result.assert_outcomes(passed=4, errors=2)
    result.stdout.re_match_lines(
        [
            r"ERROR .*test_leaks_a_thread - Failed: "
            r"non-daemon threads left running: \['leaky-thread'\]",
            r"ERROR .*test_leaks_a_task - Failed: asyncio tasks left running: \['leaky-task ",
        ]
    )
