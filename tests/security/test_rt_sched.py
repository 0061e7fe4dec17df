"""hal/rt_sched.py under a real unprivileged uid: the kernel's rules npud's grant rests on.
An unprivileged thread may not enter SCHED_FIFO (RLIMIT_RTPRIO is 0 here), may always leave
it, and may touch no other uid's thread either way."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from npumanager.hal import rt_sched as rt
from npumanager.testing import procs
from tests.hal.test_rt_sched import Parked, needs_fifo
from tests.security.harness import ATTACKER, needs_root

pytestmark = [needs_root, needs_fifo, pytest.mark.fifo]


def _enter_then_leave() -> tuple[int, rt.ThreadSched | None, bool, str, rt.ThreadSched | None,
                                 bool, rt.ThreadSched | None]:
    """In a child forked from a FIFO thread: what the unprivileged uid may do to itself."""
    inherited = rt.sched_of(0)
    up = rt.set_fifo(0, 2)  # higher than inherited: needs CAP_SYS_NICE
    down = rt.set_other(0)
    after = rt.sched_of(0)
    again = rt.set_fifo(0, 1)
    return (os.getuid(), inherited, up.ok, up.why, after, again.ok or down.ok is False,
            rt.sched_of(0))


def test_an_unprivileged_thread_leaves_fifo_but_may_not_enter_it() -> None:
    got: list[Any] = []

    def from_fifo() -> None:
        # Without reset-on-fork, so the forked child starts at FIFO 1 as root would leave it.
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        try:
            got.append(procs.run_as(ATTACKER, None, _enter_then_leave))
        finally:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

    t = threading.Thread(target=from_fifo)
    t.start()
    t.join(30)
    uid, inherited, up_ok, up_why, after, again_ok, last = got[0]
    assert uid == ATTACKER
    assert inherited == rt.ThreadSched(os.SCHED_FIFO, 1, False)
    assert not up_ok and "not permitted" in up_why
    assert after == rt.ThreadSched(os.SCHED_OTHER, 0, False)
    assert not again_ok
    assert last == rt.ThreadSched(os.SCHED_OTHER, 0, False)


def _touch(tid: int) -> tuple[bool, str, bool, str]:
    up, down = rt.set_fifo(tid, 1), rt.set_other(tid)
    return up.ok, up.why, down.ok, down.why


def test_an_unprivileged_uid_may_not_touch_another_uids_thread() -> None:
    p = Parked()
    try:
        assert rt.set_fifo(p.tid, 1).ok
        up_ok, up_why, down_ok, down_why = procs.run_as(ATTACKER, None, _touch, p.tid)
        assert not up_ok and "not permitted" in up_why
        assert not down_ok and "not permitted" in down_why
        assert rt.sched_of(p.tid) == rt.ThreadSched(os.SCHED_FIFO, 1, True)
        assert rt.owner_of(p.tid) == rt.ThreadOwner(os.getpid(), 0)
    finally:
        rt.set_other(p.tid)
        p.end()
