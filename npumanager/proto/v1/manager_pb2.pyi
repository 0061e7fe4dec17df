from npumanager.proto.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadRequest(_message.Message):
    __slots__ = ("request_id", "size", "priority", "device")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    size: int
    priority: int
    device: str
    def __init__(self, request_id: _Optional[int] = ..., size: _Optional[int] = ..., priority: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class Claim(_message.Message):
    __slots__ = ("request_id", "size", "priority", "state", "grant_id", "unload_reason", "device")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    UNLOAD_REASON_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    size: int
    priority: int
    state: str
    grant_id: str
    unload_reason: int
    device: str
    def __init__(self, request_id: _Optional[int] = ..., size: _Optional[int] = ..., priority: _Optional[int] = ..., state: _Optional[str] = ..., grant_id: _Optional[str] = ..., unload_reason: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class Reclaim(_message.Message):
    __slots__ = ("claims",)
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    claims: _containers.RepeatedCompositeFieldContainer[Claim]
    def __init__(self, claims: _Optional[_Iterable[_Union[Claim, _Mapping]]] = ...) -> None: ...

class RequestRef(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    def __init__(self, request_id: _Optional[int] = ...) -> None: ...

class CanLoad(_message.Message):
    __slots__ = ("request_id", "status", "grant_id", "lane")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: int
    grant_id: str
    lane: str
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[int] = ..., grant_id: _Optional[str] = ..., lane: _Optional[str] = ...) -> None: ...

class UnloadAsk(_message.Message):
    __slots__ = ("request_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    reason: int
    def __init__(self, request_id: _Optional[int] = ..., reason: _Optional[int] = ...) -> None: ...

class RequestComplete(_message.Message):
    __slots__ = ("request_id", "status")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    status: int
    def __init__(self, request_id: _Optional[int] = ..., status: _Optional[int] = ...) -> None: ...

class SizeWeight(_message.Message):
    __slots__ = ("size", "weight")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    size: int
    weight: int
    def __init__(self, size: _Optional[int] = ..., weight: _Optional[int] = ...) -> None: ...

class SetPolicy(_message.Message):
    __slots__ = ("policy", "max_budget", "weights", "memory_budget_bytes")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_BUDGET_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    policy: int
    max_budget: int
    weights: _containers.RepeatedCompositeFieldContainer[SizeWeight]
    memory_budget_bytes: int
    def __init__(self, policy: _Optional[int] = ..., max_budget: _Optional[int] = ..., weights: _Optional[_Iterable[_Union[SizeWeight, _Mapping]]] = ..., memory_budget_bytes: _Optional[int] = ...) -> None: ...

class SetImportance(_message.Message):
    __slots__ = ("uid", "importance")
    UID_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_FIELD_NUMBER: _ClassVar[int]
    uid: int
    importance: int
    def __init__(self, uid: _Optional[int] = ..., importance: _Optional[int] = ...) -> None: ...

class StoryRequest(_message.Message):
    __slots__ = ("uid", "request_id")
    UID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    uid: int
    request_id: int
    def __init__(self, uid: _Optional[int] = ..., request_id: _Optional[int] = ...) -> None: ...

class DecisionsSince(_message.Message):
    __slots__ = ("since", "limit")
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    since: float
    limit: int
    def __init__(self, since: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class JsonReply(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class DeviceList(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[_common_pb2.DeviceInfo]
    def __init__(self, devices: _Optional[_Iterable[_Union[_common_pb2.DeviceInfo, _Mapping]]] = ...) -> None: ...

class ThermalOverride(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: int
    def __init__(self, status: _Optional[int] = ...) -> None: ...

class ThermalReply(_message.Message):
    __slots__ = ("status", "overridden", "headroom", "details_json")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OVERRIDDEN_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    status: int
    overridden: bool
    headroom: float
    details_json: str
    def __init__(self, status: _Optional[int] = ..., overridden: _Optional[bool] = ..., headroom: _Optional[float] = ..., details_json: _Optional[str] = ...) -> None: ...

class ThreadRealtime(_message.Message):
    __slots__ = ("tid",)
    TID_FIELD_NUMBER: _ClassVar[int]
    tid: int
    def __init__(self, tid: _Optional[int] = ...) -> None: ...

class RealtimeGrant(_message.Message):
    __slots__ = ("priority", "max_cpu_ms", "window_s", "max_threads")
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_CPU_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    MAX_THREADS_FIELD_NUMBER: _ClassVar[int]
    priority: int
    max_cpu_ms: float
    window_s: float
    max_threads: int
    def __init__(self, priority: _Optional[int] = ..., max_cpu_ms: _Optional[float] = ..., window_s: _Optional[float] = ..., max_threads: _Optional[int] = ...) -> None: ...
