"""Fixtures of the demo and contention tests."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from npumanager.demo.contention_memory import descendants

#: The fixture below: call it for the pids the test left running.
LeftBehind = Callable[[], list[int]]


@pytest.fixture
def left_behind() -> LeftBehind:
    """This test process's descendants that were not there when the test started: what
    the test's run started and left running. Older ones are not the run's: the forkserver
    and resource tracker that multiprocessing keeps for the life of a process once a test
    of the same xdist worker used them (tests/cache), which made every "nothing left"
    check here fail when those tests ran first on the worker."""
    before = set(descendants(os.getpid()))
    return lambda: [pid for pid in descendants(os.getpid()) if pid not in before]
