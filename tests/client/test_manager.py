"""NpuManager against an in-process npud: executors, ordering, re-entrancy, listeners,
lost connections."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
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
    UnloadReason,
)
from npumanager.errors import InvalidArgument, ServiceUnavailable, UnknownRequest

from .conftest import DaemonThread, ended


class Rec(ModelLoadRequestCallback):
    """Records (event, id, value, thread name); reports loaded/unloaded when told to."""

    def __init__(self, *, load: bool = True, unload_on_grant: bool = False) -> None:
        self.events: list[tuple[str, int, Any]] = []
        self.threads: set[str] = set()
        self.load = load
        self.unload_on_grant = unload_on_grant
        self.ended = threading.Event()

    def _note(self, *e: Any) -> None:
        self.events.append(e)  # type: ignore[arg-type]
        self.threads.add(threading.current_thread().name)

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        self._note("can", request.id, status)
        if status == LoadStatus.CAN_LOAD_NOW:
            # Calling back into the manager from a callback must not deadlock.
            if self.load:
                listener.notify_model_loaded(request)
            if self.unload_on_grant:
                listener.notify_model_unloaded(request)

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        self._note("unload", request.id, reason)

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        self._note("complete", request.id, status)
        self.ended.set()


def test_lifecycle_on_the_dispatch_thread_with_reentrant_calls(npud: DaemonThread,
                                                               runtime_dir: Path) -> None:
    cb = Rec(unload_on_grant=True)
    with NpuManager.connect(runtime_dir) as mgr:
        assert mgr.admin and mgr.uid >= 0
        listener = mgr.request_can_load_model(ModelLoadRequest(1), cb)
        assert cb.ended.wait(5)
        assert listener.grant_id and len(listener.grant_id) >= 16
    assert [e[0] for e in cb.events] == ["can", "complete"]
    assert cb.events[1][2] == RequestStatus.COMPLETE
    assert cb.threads == {"npu-callbacks"} and threading.current_thread().name not in cb.threads


@pytest.mark.parametrize("kind", ["executor", "callable"])
def test_callbacks_go_to_the_given_executor(npud: DaemonThread, runtime_dir: Path,
                                            kind: str) -> None:
    cb = Rec(unload_on_grant=True)
    ran: list[int] = []
    with ThreadPoolExecutor(1, thread_name_prefix="app-exec") as pool, \
            NpuManager(runtime_dir) as mgr:
        def execute(fn: Any) -> None:  # Android's Executor.execute
            ran.append(1)
            pool.submit(fn)

        executor: Any = pool if kind == "executor" else execute
        mgr.request_can_load_model(ModelLoadRequest(1), cb, executor)
        assert cb.ended.wait(5)
    assert all(t.startswith("app-exec") for t in cb.threads)
    assert [e[0] for e in cb.events] == ["can", "complete"]
    if kind == "callable":
        assert len(ran) == 2


def test_callbacks_arrive_in_order(npud: DaemonThread, runtime_dir: Path) -> None:
    cb = Rec(load=False)
    with NpuManager(runtime_dir) as mgr:
        for i in range(1, 31):
            mgr.request_can_load_model(ModelLoadRequest(i, ModelSize.BETWEEN_1GB_AND_2GB), cb)
        for i in range(1, 31):
            mgr.cancel_model_load(ModelLoadRequest(i))
        done = threading.Event()
        mgr.request_can_load_model(ModelLoadRequest(99), cb, lambda fn: (fn(), done.set()))
        assert done.wait(5)
    # Budget 4 at weight 2: two granted, the rest queued, in submission order.
    firsts = [e for e in cb.events if e[0] == "can"][:30]
    assert [e[1] for e in firsts] == list(range(1, 31))
    assert [e[2] for e in firsts[:2]] == [LoadStatus.CAN_LOAD_NOW] * 2
    assert all(e[2] == LoadStatus.NOT_PRIORITIZED for e in firsts[2:])
    completes = [e[1] for e in cb.events if e[0] == "complete"]
    assert completes == list(range(1, 31))


def test_listener_is_valid_only_for_its_request(npud: DaemonThread, runtime_dir: Path) -> None:
    with NpuManager(runtime_dir) as mgr:
        listener = mgr.request_can_load_model(ModelLoadRequest(1), Rec(load=False))
        with pytest.raises(InvalidArgument, match="belongs to request 1"):
            listener.notify_model_loaded(ModelLoadRequest(2))
        with pytest.raises(InvalidArgument):
            mgr.request_can_load_model(ModelLoadRequest(1), Rec())  # live on this connection
        with pytest.raises(UnknownRequest):
            mgr.cancel_model_load(ModelLoadRequest(42))
        listener.notify_model_loaded(ModelLoadRequest(1))
        assert mgr.dump()["requests"][0]["state"] == "loaded"


def test_lost_connection_ends_live_requests_cancelled_and_calls_fail(
        runtime_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = DaemonThread(runtime_dir)
    cb = Rec()
    try:
        with NpuManager(runtime_dir) as mgr:
            mgr.request_can_load_model(ModelLoadRequest(1, ModelSize.GREATER_THAN_2G), cb)
            mgr.request_can_load_model(ModelLoadRequest(2, ModelSize.GREATER_THAN_2G), cb)
            d.stop()
            assert cb.ended.wait(5)
            with pytest.raises(ServiceUnavailable):
                mgr.dump()
            with pytest.raises(ServiceUnavailable):
                mgr.request_can_load_model(ModelLoadRequest(3), cb)
            assert not mgr.connected
    finally:
        d.stop()
    completes = sorted((e[1], e[2]) for e in cb.events if e[0] == "complete")
    assert completes == [(1, RequestStatus.CANCELLED), (2, RequestStatus.CANCELLED)]
    assert "ends CANCELLED" in caplog.text


def test_close_drops_requests_without_callbacks(npud: DaemonThread, runtime_dir: Path) -> None:
    cb = Rec()
    with NpuManager(runtime_dir) as admin:
        mgr = NpuManager(runtime_dir)
        mgr.request_can_load_model(ModelLoadRequest(1), cb)
        mgr.close()
        mgr.close()  # idempotent
        npud.wait_for(ended(mgr.uid, 1, "dropped (client gone)"), "request 1 dropped")
        assert admin.dump()["requests"] == []
    assert [e[0] for e in cb.events] in (["can"], [])
