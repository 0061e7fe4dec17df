"""AsyncNpuManager and reserve() leases against an in-process npud."""

from __future__ import annotations

import asyncio
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

from .conftest import DaemonThread

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
            await asyncio.sleep(0.05)
            assert not waiter.done()  # queued behind request 1
            await mgr.cancel_model_load(ModelLoadRequest(2, BIG))
            with pytest.raises(RequestEnded) as err:
                await waiter
            assert err.value.status == RequestStatus.CANCELLED

    asyncio.run(main())


def test_cancelling_the_wait_cancels_the_request(npud: DaemonThread, runtime_dir: Path) -> None:
    async def main() -> list[Any]:
        mgr = await AsyncNpuManager.connect(runtime_dir)
        async with mgr, mgr.reserve(ModelLoadRequest(1, BIG)):
            with pytest.raises(asyncio.TimeoutError):
                async with asyncio.timeout(0.05), mgr.reserve(ModelLoadRequest(2, BIG)):
                    pass
            await asyncio.sleep(0.02)
            return [r["request_id"] for r in (await mgr.dump())["requests"]]

    assert asyncio.run(main()) == [1]


def test_async_callbacks_coroutines_and_lost_connection(runtime_dir: Path) -> None:
    d = DaemonThread(runtime_dir)
    events: list[tuple[str, int, Any]] = []

    class Cb(ModelLoadRequestCallback):
        async def on_can_load_model(self, request: ModelLoadRequest,  # type: ignore[override]
                                    status: LoadStatus, listener: Any) -> None:
            events.append(("can", request.id, status))
            if status == LoadStatus.CAN_LOAD_NOW:
                await listener.notify_model_loaded(request)

        def on_model_load_request_complete(self, request: ModelLoadRequest,
                                           status: RequestStatus) -> None:
            events.append(("complete", request.id, status))

    async def main() -> None:
        mgr = await AsyncNpuManager.connect(runtime_dir)
        try:
            listener = await mgr.request_can_load_model(ModelLoadRequest(1), Cb())
            with pytest.raises(InvalidArgument):
                await listener.notify_model_loaded(ModelLoadRequest(9))
            for _ in range(100):
                if (await mgr.dump())["requests"][0]["state"] == "loaded":
                    break
                await asyncio.sleep(0.005)
            await asyncio.get_running_loop().run_in_executor(None, d.stop)
            for _ in range(100):
                if len(events) == 2:
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(ServiceUnavailable):
                await mgr.dump()
        finally:
            await mgr.close()

    try:
        asyncio.run(main())
    finally:
        d.stop()
    assert events == [("can", 1, LoadStatus.CAN_LOAD_NOW), ("complete", 1, RequestStatus.CANCELLED)]
