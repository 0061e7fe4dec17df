"""The demo's ``signals_held``: a Ctrl-C while an app is being forked and recorded is
taken after that, whichever thread of the demo the kernel delivered it to (seen beside a
busy loop: a Ctrl-C delivered to an app's event reader thread raised KeyboardInterrupt in
the main thread inside the block, before the app was on the list, and the app outlived
the demo)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from npumanager.demo.process import signals_held


def test_a_ctrl_c_delivered_to_another_thread_is_taken_after_the_block() -> None:
    go, sent = threading.Event(), threading.Event()

    def other_thread() -> None:  # started before the block: SIGINT is not masked here
        go.wait(30)
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()

    t = threading.Thread(target=other_thread)
    t.start()
    recorded = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            go.set()
            assert sent.wait(30)
            t.join(30)
            for i in range(10000):  # the main thread's eval loop checks for signals here
                recorded.append(i)
        pytest.fail("the Ctrl-C was lost")  # pragma: no cover
    assert len(recorded) == 10000, "KeyboardInterrupt inside the block: the app is unrecorded"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_nothing_pending_changes_nothing() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with signals_held():
        pass
    assert signal.getsignal(signal.SIGTERM) is before
