"""Push decoding against a real npud: every wire value maps to its enum member.

npud's pushes carry enum values as numbers; the SDK maps them back through a
table built once (an Enum call costs ~0.7 µs a push). Zero is a real value
(PREEMPTED, CAN_LOAD_NOW), so a lookup that treats a falsy member as a miss
falls back to the Enum call for the commonest unload reason."""

from __future__ import annotations

import asyncio
import enum
import threading
from pathlib import Path
from typing import Any

import pytest

from npumanager import (
    AsyncNpuManager,
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    NpuManager,
    RequestStatus,
    UnloadReason,
)
from npumanager.service import events as ev

from .conftest import DaemonThread

PUSH_ENUMS = (LoadStatus, UnloadReason, RequestStatus)


class Rec(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.ended = threading.Event()

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        self.events.append(("can", status))

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        self.events.append(("unload", reason))

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        self.events.append(("complete", status))
        self.ended.set()


def _push_every_reason(d: DaemonThread, request_id: int) -> None:
    """npud asks the one client to unload for every reason, then cancels the request."""
    assert d.loop is not None and d.daemon is not None
    daemon = d.daemon
    done = threading.Event()

    def push() -> None:
        [cid] = daemon.conns
        daemon.execute([ev.AskUnload(cid, 0, request_id, r) for r in UnloadReason])
        daemon.execute([ev.SendComplete(cid, 0, request_id, RequestStatus.CANCELLED)])
        done.set()

    d.loop.call_soon_threadsafe(push)
    assert done.wait(5)


@pytest.fixture
def enum_calls(npud: DaemonThread, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Enum constructions of the push enums outside npud's own thread (the client's)."""
    calls: list[Any] = []
    real = enum.EnumType.__call__

    def counting(cls: Any, *args: Any, **kw: Any) -> Any:
        if cls in PUSH_ENUMS and threading.current_thread() is not npud.thread:
            calls.append((cls.__name__, args))
        return real(cls, *args, **kw)

    monkeypatch.setattr(enum.EnumType, "__call__", counting)
    return calls


def test_blocking_client_decodes_every_push_value_through_the_table(
        npud: DaemonThread, runtime_dir: Path, enum_calls: list[Any]) -> None:
    cb = Rec()
    with NpuManager(runtime_dir) as mgr:
        mgr.request_can_load_model(ModelLoadRequest(1), cb)
        _push_every_reason(npud, 1)
        assert cb.ended.wait(5)
    assert cb.events == [("can", LoadStatus.CAN_LOAD_NOW),
                         *(("unload", r) for r in UnloadReason),
                         ("complete", RequestStatus.CANCELLED)]
    assert enum_calls == []


def test_async_client_decodes_every_push_value_through_the_table(
        npud: DaemonThread, runtime_dir: Path, enum_calls: list[Any]) -> None:
    cb = Rec()

    async def main() -> None:
        async with await AsyncNpuManager.connect(runtime_dir) as mgr:
            await mgr.request_can_load_model(ModelLoadRequest(1), cb)
            await asyncio.get_running_loop().run_in_executor(None, _push_every_reason, npud, 1)
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                None, cb.ended.wait, 5), 6)

    asyncio.run(main())
    assert cb.events == [("can", LoadStatus.CAN_LOAD_NOW),
                         *(("unload", r) for r in UnloadReason),
                         ("complete", RequestStatus.CANCELLED)]
    assert enum_calls == []
