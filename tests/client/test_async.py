"""AsyncNpuManager and reserve() leases against an in-process npud."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from npumanager import (
    AsyncNpuManager,
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    ModelSize,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.errors import InvalidArgument, RequestEnded, ServiceUnavailable
from npumanager.service.state import RequestState

from .conftest import DaemonThread, ended, in_state

BIG = ModelSize.GREATER_THAN_2G


def test_reserve_grants_reports_loaded_and_unloads_on_exit(npud: DaemonThread,
                                                           runtime_dir: Path) -> None:
    async def main() -> tuple[Any, ...]:
        async with await AsyncNpuManager.connect(runtime_dir) as mgr:
            req = ModelLoadRequest(1, BIG)
            async with mgr.reserve(req) as lease:
                inside = await mgr.dump()
                grant = lease.grant_id
                assert lease.listener is not None and lease.listener.grant_id == grant
            after = await mgr.dump()
            return inside, grant, after, lease.status

    inside, grant, after, status = asyncio.run(main())
    [r] = inside["requests"]
    assert r["state"] == "loaded" and grant and r["grant"] == grant[:8]
    assert after["requests"] == [] and status == RequestStatus.COMPLETE


def test_lease_hears_unload_requests_and_leaving_reports_unloaded(npud: DaemonThread,
                                                                   runtime_dir: Path) -> None:
    async def main() -> tuple[Any, ...]:
        async with await AsyncNpuManager.connect(runtime_dir) as mgr:
            req = ModelLoadRequest(1, BIG, ModelPriority.BACKGROUND)
            async with mgr.reserve(req) as lease:
                # At SEVERE a background holder is asked to leave (reason THERMAL).
                await mgr.override_thermal_status(ThermalStatus.SEVERE)
                reason = await asyncio.wait_for(lease.unload_requested(), 5)
            await mgr.reset_thermal_status()
            return reason, lease.status, (await mgr.dump())["requests"]

    reason, status, requests = asyncio.run(main())
    assert reason == UnloadReason.THERMAL
    assert status == RequestStatus.COMPLETE and requests == []


def test_reserve_raises_request_ended_when_cancelled_before_grant(npud: DaemonThread,
                                                                  runtime_dir: Path) -> None:
    async def main() -> None:
        mgr = await AsyncNpuManager.connect(runtime_dir)
        async with mgr, mgr.reserve(ModelLoadRequest(1, BIG)):
            waiter = asyncio.ensure_future(mgr.reserve(ModelLoadRequest(2, BIG)).__aenter__())
            await npud.wait_for_async(in_state(mgr.uid, 2, RequestState.QUEUED), "2 queued")
            assert not waiter.done()  # queued behind request 1
            await mgr.cancel_model_load(ModelLoadRequest(2, BIG))
            with pytest.raises(RequestEnded) as err:
                await waiter
            assert err.value.status == RequestStatus.CANCELLED

    asyncio.run(main())


def test_a_timeout_on_the_wait_cancels_the_request(npud: DaemonThread, runtime_dir: Path) -> None:
    async def main() -> list[Any]:
        mgr = await AsyncNpuManager.connect(runtime_dir)
        async with mgr, mgr.reserve(ModelLoadRequest(1, BIG)):
            timeouts: list[asyncio.Timeout] = []

            async def wait_with_a_timeout() -> None:
                async with asyncio.timeout(None) as tm:
                    timeouts.append(tm)
                    async with mgr.reserve(ModelLoadRequest(2, BIG)):
                        pass

            waiter = asyncio.ensure_future(wait_with_a_timeout())
            await npud.wait_for_async(in_state(mgr.uid, 2, RequestState.QUEUED), "2 queued")
            timeouts[0].reschedule(asyncio.get_running_loop().time())  # it expires now
            with pytest.raises(TimeoutError):
                await waiter
            # Leaving the wait cancelled the request at npud before it re-raised.
            return [r["request_id"] for r in (await mgr.dump())["requests"]]

    assert asyncio.run(main()) == [1]


def test_interrupting_the_request_call_cancels_it_at_npud(npud: DaemonThread,
                                                         runtime_dir: Path) -> None:
    cb = ModelLoadRequestCallback()

    async def main() -> int:
        mgr = await AsyncNpuManager.connect(runtime_dir)
        async with mgr:
            call = asyncio.ensure_future(mgr.request_can_load_model(ModelLoadRequest(1), cb))
            await asyncio.sleep(0)  # one step: the request is on its way, its reply is not
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            await npud.wait_for_async(ended(mgr.uid, 1, "cancelled"), "request 1 cancelled")
            # The client forgot it (no "already live" here); npud remembers the id was used.
            with pytest.raises(InvalidArgument, match="already submitted"):
                await mgr.request_can_load_model(ModelLoadRequest(1), cb)
            return len((await mgr.dump())["requests"])

    assert asyncio.run(main()) == 0


def test_async_callbacks_coroutines_and_lost_connection(runtime_dir: Path) -> None:
    d = DaemonThread(runtime_dir)
    events: list[tuple[str, int, Any]] = []

    async def main() -> None:
        loaded, ended = asyncio.Event(), asyncio.Event()

        class Cb(ModelLoadRequestCallback):
            async def on_can_load_model(self, request: ModelLoadRequest,  # type: ignore[override]
                                        status: LoadStatus, listener: Any) -> None:
                events.append(("can", request.id, status))
                if status == LoadStatus.CAN_LOAD_NOW:
                    await listener.notify_model_loaded(request)
                    loaded.set()

            def on_model_load_request_complete(self, request: ModelLoadRequest,
                                               status: RequestStatus) -> None:
                events.append(("complete", request.id, status))
                ended.set()

        mgr = await AsyncNpuManager.connect(runtime_dir)
        try:
            listener = await mgr.request_can_load_model(ModelLoadRequest(1), Cb())
            with pytest.raises(InvalidArgument):
                await listener.notify_model_loaded(ModelLoadRequest(9))
            await asyncio.wait_for(loaded.wait(), 5)
            assert (await mgr.dump())["requests"][0]["state"] == "loaded"
            await asyncio.to_thread(d.stop)
            await asyncio.wait_for(ended.wait(), 5)
            with pytest.raises(ServiceUnavailable):
                await mgr.dump()
            with pytest.raises(ServiceUnavailable):
                await mgr.request_can_load_model(ModelLoadRequest(2), Cb())
        finally:
            await mgr.close()

    try:
        asyncio.run(main())
    finally:
        d.stop()
    assert events == [("can", 1, LoadStatus.CAN_LOAD_NOW), ("complete", 1, RequestStatus.CANCELLED)]


def test_async_callbacks_go_to_the_given_executor_and_a_refusal_runs_them_on_the_loop(
        npud: DaemonThread, runtime_dir: Path) -> None:
    threads: list[str] = []

    class Cb(ModelLoadRequestCallback):
        def __init__(self) -> None:
            self.done = threading.Event()

        def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                              listener: Any) -> None:
            threads.append(threading.current_thread().name)

        def on_model_load_request_complete(self, request: ModelLoadRequest,
                                           status: RequestStatus) -> None:
            threads.append(threading.current_thread().name)
            self.done.set()

    def refuse(fn: Any) -> None:
        raise RuntimeError("executor shut down")

    async def main() -> None:
        with ThreadPoolExecutor(1, thread_name_prefix="app-exec") as pool:
            async with await AsyncNpuManager.connect(runtime_dir) as mgr:
                for rid, executor in ((1, pool), (2, refuse)):
                    cb = Cb()
                    listener = await mgr.request_can_load_model(ModelLoadRequest(rid), cb,
                                                                executor)
                    await listener.notify_model_unloaded(ModelLoadRequest(rid))
                    assert await asyncio.to_thread(cb.done.wait, 5)

    asyncio.run(main())
    loop_thread = threading.current_thread().name
    assert [t.startswith("app-exec") for t in threads[:2]] == [True, True]
    assert threads[2:] == [loop_thread, loop_thread]
