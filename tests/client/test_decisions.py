"""npud's decision log read from a time on (`decisions`, admin), and `npu trace`'s use of
it: a request that begins and ends between two of the recorder's polls is in the trace."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from npumanager import ModelLoadRequest, NpuManager
from npumanager.client import ModelLoadRequestCallback
from npumanager.constants import LoadStatus
from npumanager.service.decisions import DecisionLog
from npumanager.trace.recorder import TraceRecorder
from tests.client.conftest import DaemonThread


def test_the_log_from_a_time_on_pages_and_says_when_it_lost_entries() -> None:
    log = DecisionLog(4)
    for i in range(3):
        log.record((float(i), f"s{i}", (1, i), "requested", {}))
    got, lost = log.since(1.0, 10)
    assert [d.at for d in got] == [1.0, 2.0] and not lost
    got, lost = log.since(0.0, 1)
    assert [d.at for d in got] == [0.0] and not lost
    for i in range(3, 6):  # the log holds 4: entries 0 and 1 fall off
        log.record((float(i), f"s{i}", (1, i), "requested", {}))
    got, lost = log.since(0.5, 10)
    assert [d.at for d in got] == [2.0, 3.0, 4.0, 5.0] and lost
    assert not log.since(2.0, 10)[1]


class Granted(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.granted = threading.Event()
        self.listener: Any = None

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            self.granted.set()


def test_a_request_between_two_polls_is_in_the_trace(npud: DaemonThread) -> None:
    rt = npud.runtime_dir
    # Polls far apart: the recorder polls at start and at stop, never in between.
    rec = TraceRecorder(rt, interval=3600.0, steps_interval=3600.0).start()
    with NpuManager(rt) as mgr:
        before = time.monotonic()
        cb = Granted()
        req = ModelLoadRequest(41)
        mgr.request_can_load_model(req, cb)
        assert cb.granted.wait(10)
        cb.listener.notify_model_loaded(req)
        cb.listener.notify_model_unloaded(req)  # the request ends COMPLETE
        page = mgr.decisions(before)
    # npud's answer: this request's decisions, in order, nothing from before `before`.
    uid = os.getuid()
    whats = [d["what"] for d in page["decisions"] if d["key"] == [uid, 41]]
    assert whats[0] == "requested" and "granted" in whats and len(whats) >= 3
    assert all(d["at"] >= before for d in page["decisions"])
    assert page["truncated"] is False and page["lost"] is False
    out = rec.stop()
    # No poll saw the request live; its story is in the recording all the same.
    assert [d["what"] for d in out.stories[f"{uid}:41"]] == whats
