"""``npu_requests_dropped_total`` scraped from a real npud: load requests npud refuses before
deciding anything (a payload that does not parse, a device it does not have, over the
per-uid limit) and a waiting request whose client left are each counted once by reason, and
npud keeps serving the same client afterwards."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelSize,
    NpuManager,
    RequestStatus,
)
from npumanager.errors import InvalidArgument, LimitExceeded
from npumanager.paths import manager_socket
from npumanager.proto.v1.manager_pb2 import LoadRequest
from npumanager.service.metrics import DROPPED
from npumanager.testing.daemon import DaemonProcess
from npumanager.wire.client import SyncRpcClient
from tests.ops.test_metrics import scrape, value

pytestmark = pytest.mark.slow

BIG = ModelSize.GREATER_THAN_2G  # the whole default budget
DEVICE = "none"  # npud without drivers labels its request counts so


class Answers(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.statuses: list[Any] = []
        self.ended: list[Any] = []
        self.event = threading.Event()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        self.statuses.append(status)
        self.event.set()

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        self.ended.append(status)
        self.event.set()


def wait_for(what: Any, timeout: float = 60.0) -> None:
    """Until ``what()`` holds (a generous bound: a loaded machine is slow, never wrong)."""
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, {"manager": {"max_requests_per_uid": 2}}, env=env,
                       ready_timeout=60, extra_args=["--metrics", "127.0.0.1:0"]) as d:
        yield d


def dropped(npud: DaemonProcess) -> dict[str, float]:
    samples = scrape(npud)
    return {r: value(samples, "npu_requests_dropped_total", device=DEVICE, reason=r)
            for r in DROPPED}


def test_refused_and_abandoned_requests_are_counted(npud: DaemonProcess) -> None:
    rt = npud.runtime_dir
    assert dropped(npud) == dict.fromkeys(DROPPED, 0.0)  # every reason starts at zero
    with NpuManager(rt) as a:
        holder = Answers()
        a.request_can_load_model(ModelLoadRequest(1, BIG), holder)
        wait_for(lambda: LoadStatus.CAN_LOAD_NOW in holder.statuses)

        raw = SyncRpcClient(str(manager_socket(rt)), "manager")
        try:
            with pytest.raises(InvalidArgument):
                raw.call("request", b"\xff\xff\xff\xff")  # not a LoadRequest
            with pytest.raises(InvalidArgument):
                raw.call("request", LoadRequest(request_id=9, device="no-such-device"))
        finally:
            raw.close()

        b = NpuManager(rt)
        waiter = Answers()
        b.request_can_load_model(ModelLoadRequest(2, BIG), waiter)  # waits behind 1
        wait_for(lambda: bool(waiter.statuses))
        assert LoadStatus.CAN_LOAD_NOW not in waiter.statuses
        with pytest.raises(LimitExceeded):  # this uid has 2 live requests, its limit
            a.request_can_load_model(ModelLoadRequest(3, BIG), Answers())
        b.close()  # the waiting request's client leaves before npud decided its end

        want = {"malformed": 1.0, "invalid": 1.0, "over_limit": 1.0, "client_gone": 1.0,
                "error": 0.0}
        wait_for(lambda: dropped(npud) == want)

        # npud keeps serving the same client: a new request waits, its cancel is counted
        # as completed (cancelled), and nothing more is dropped.
        later = Answers()
        a.request_can_load_model(ModelLoadRequest(4, BIG), later)
        wait_for(lambda: bool(later.statuses))
        a.cancel_model_load(ModelLoadRequest(4, BIG))
        wait_for(lambda: RequestStatus.CANCELLED in later.ended)
        samples = scrape(npud)
        assert value(samples, "npu_requests_completed_total", device=DEVICE,
                     status="cancelled") == 1.0
        assert dropped(npud) == want
