"""The manager's calls as wire messages and reply decoders, shared by both client APIs.

Each function returns a :class:`Call`: the method name, the request message
and how to turn the reply payload into what the API returns. The blocking and
the async manager differ only in how they send it (``_do``), so the protobuf
side of every call is written once, here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Generic, NamedTuple, TypeVar

from google.protobuf.message import Message

from npumanager.constants import ThermalStatus
from npumanager.errors import InvalidArgument
from npumanager.proto.v1.manager_pb2 import (
    DecisionsSince,
    DeviceList,
    JsonReply,
    LoadRequest,
    RealtimeGrant,
    RequestRef,
    SetImportance,
    StoryRequest,
    ThermalOverride,
    ThermalReply,
    ThreadRealtime,
)
from npumanager.proto.v1.wire_pb2 import Empty

from .request import (
    DeviceSummary,
    ModelLoadRequest,
    RealtimeInfo,
    ThermalInfo,
    policy_message,
)

T = TypeVar("T")


class Call(NamedTuple, Generic[T]):
    method: str
    message: Message
    decode: Callable[[bytes], T]  # the reply payload to what the API returns


def _nothing(payload: bytes) -> None:
    return None


def _json(payload: bytes) -> Any:
    return json.loads(JsonReply.FromString(payload).json)


def _thermal(payload: bytes) -> ThermalInfo:
    return ThermalInfo.from_proto(ThermalReply.FromString(payload))


def _devices(payload: bytes) -> list[DeviceSummary]:
    return [DeviceSummary.from_proto(d) for d in DeviceList.FromString(payload).devices]


def request(req: ModelLoadRequest) -> Call[None]:
    return Call("request", LoadRequest(request_id=req.id, size=int(req.size),
                                       priority=int(req.priority), device=req.device or ""),
                _nothing)


def request_ref(method: str, request_id: int) -> Call[None]:
    """``cancel``, ``loaded`` or ``unloaded`` for one of this connection's requests."""
    return Call(method, RequestRef(request_id=request_id), _nothing)


def set_policy(policy: int, bundle: Mapping[str, Any] | None) -> Call[None]:
    return Call("set_policy", policy_message(policy, bundle), _nothing)


def set_importance(uid: int, importance: int) -> Call[None]:
    return Call("set_importance", SetImportance(uid=uid, importance=int(importance)), _nothing)


def dump() -> Call[dict[str, Any]]:
    return Call("dump", Empty(), _json)


def story(uid: int, request_id: int) -> Call[list[dict[str, Any]]]:
    return Call("story", StoryRequest(uid=uid, request_id=request_id), _json)


def decisions(since: float, limit: int = 0) -> Call[dict[str, Any]]:
    return Call("decisions", DecisionsSince(since=since, limit=limit), _json)


def devices() -> Call[list[DeviceSummary]]:
    return Call("list_devices", Empty(), _devices)


def thermal_status() -> Call[ThermalInfo]:
    return Call("thermal_status", Empty(), _thermal)


def thermal_override(status: ThermalStatus | int) -> Call[ThermalInfo]:
    return Call("thermal_override", ThermalOverride(status=int(status)), _thermal)


def thermal_reset() -> Call[ThermalInfo]:
    return Call("thermal_reset", Empty(), _thermal)


def _realtime(payload: bytes) -> RealtimeInfo:
    return RealtimeInfo.from_proto(RealtimeGrant.FromString(payload))


def set_thread_realtime(tid: int) -> Call[RealtimeInfo]:
    """One of the caller's own threads to SCHED_FIFO (service/rt_apps.py)."""
    if isinstance(tid, bool) or not isinstance(tid, int) or not 0 < tid < 1 << 32:
        raise InvalidArgument(f"a thread id is a whole number > 0, not {tid!r}")
    return Call("set_thread_realtime", ThreadRealtime(tid=tid), _realtime)
