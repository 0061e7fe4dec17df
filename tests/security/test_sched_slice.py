"""Per-task slices under a real unprivileged uid (hal/sched_slice.py): an app may shorten
its own threads' slices (the SDK's ``model.burst(slice_us=...)`` does that for the app's
calling thread), and may not touch another uid's threads."""

from __future__ import annotations

import os
import threading

import pytest

from npumanager.hal import sched_slice as ss
from npumanager.testing import procs
from tests.security.harness import ATTACKER, needs_root

pytestmark = [needs_root,
              pytest.mark.skipif(not ss.slice_ns(), reason="no per-task slice (Linux < 6.12)")]


def _own_thread() -> tuple[int, bool, int | None, str]:
    got = ss.set_slice(100)
    return os.getuid(), got.ok, ss.slice_ns(), got.why


def _someone_elses(tid: int) -> tuple[bool, str]:
    got = ss.set_slice(100, tid)
    return got.ok, got.why


def test_an_unprivileged_uid_shortens_its_own_threads_slice() -> None:
    uid, ok, now, why = procs.run_as(ATTACKER, None, _own_thread)
    assert uid == ATTACKER
    assert ok, why
    assert now == 100_000


def test_an_unprivileged_uid_may_not_set_another_uids_thread() -> None:
    tid: list[int] = []
    ready, stop = threading.Event(), threading.Event()

    def park() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait(30)

    t = threading.Thread(target=park)
    t.start()
    try:
        ready.wait(10)
        before = ss.slice_ns(tid[0])
        ok, why = procs.run_as(ATTACKER, None, _someone_elses, tid[0])
        assert not ok and "Operation not permitted" in why
        assert ss.slice_ns(tid[0]) == before
    finally:
        stop.set()
        t.join(10)
