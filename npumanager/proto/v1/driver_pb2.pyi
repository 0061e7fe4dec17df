from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SchedulingConfigMsg(_message.Message):
    __slots__ = ("uid", "app_priority", "min_priority", "max_priority", "has_direct_access", "can_attribute_other_uid")
    UID_FIELD_NUMBER: _ClassVar[int]
    APP_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MIN_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    HAS_DIRECT_ACCESS_FIELD_NUMBER: _ClassVar[int]
    CAN_ATTRIBUTE_OTHER_UID_FIELD_NUMBER: _ClassVar[int]
    uid: int
    app_priority: int
    min_priority: int
    max_priority: int
    has_direct_access: bool
    can_attribute_other_uid: bool
    def __init__(self, uid: _Optional[int] = ..., app_priority: _Optional[int] = ..., min_priority: _Optional[int] = ..., max_priority: _Optional[int] = ..., has_direct_access: _Optional[bool] = ..., can_attribute_other_uid: _Optional[bool] = ...) -> None: ...

class SchedulingConfigs(_message.Message):
    __slots__ = ("configs",)
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    configs: _containers.RepeatedCompositeFieldContainer[SchedulingConfigMsg]
    def __init__(self, configs: _Optional[_Iterable[_Union[SchedulingConfigMsg, _Mapping]]] = ...) -> None: ...

class SetCallback(_message.Message):
    __slots__ = ("clear", "debounce_ms")
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_MS_FIELD_NUMBER: _ClassVar[int]
    clear: bool
    debounce_ms: int
    def __init__(self, clear: _Optional[bool] = ..., debounce_ms: _Optional[int] = ...) -> None: ...

class WorkInfoMsg(_message.Message):
    __slots__ = ("id", "group_id", "uid", "debug_pid", "original_uid", "has_feature_id", "debug_feature_id", "job_priority", "effective_priority", "timestamp_ms", "device_number")
    ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    DEBUG_PID_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_UID_FIELD_NUMBER: _ClassVar[int]
    HAS_FEATURE_ID_FIELD_NUMBER: _ClassVar[int]
    DEBUG_FEATURE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NUMBER_FIELD_NUMBER: _ClassVar[int]
    id: int
    group_id: bytes
    uid: int
    debug_pid: int
    original_uid: int
    has_feature_id: bool
    debug_feature_id: int
    job_priority: int
    effective_priority: int
    timestamp_ms: int
    device_number: int
    def __init__(self, id: _Optional[int] = ..., group_id: _Optional[bytes] = ..., uid: _Optional[int] = ..., debug_pid: _Optional[int] = ..., original_uid: _Optional[int] = ..., has_feature_id: _Optional[bool] = ..., debug_feature_id: _Optional[int] = ..., job_priority: _Optional[int] = ..., effective_priority: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., device_number: _Optional[int] = ...) -> None: ...

class WorkEvent(_message.Message):
    __slots__ = ("info", "reason")
    INFO_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    info: WorkInfoMsg
    reason: int
    def __init__(self, info: _Optional[_Union[WorkInfoMsg, _Mapping]] = ..., reason: _Optional[int] = ...) -> None: ...

class AttachManager(_message.Message):
    __slots__ = ("enforce_admission",)
    ENFORCE_ADMISSION_FIELD_NUMBER: _ClassVar[int]
    enforce_admission: bool
    def __init__(self, enforce_admission: _Optional[bool] = ...) -> None: ...

class HeldGrant(_message.Message):
    __slots__ = ("grant_id", "uid", "request_id", "memory_bytes", "models")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    uid: int
    request_id: int
    memory_bytes: int
    models: int
    def __init__(self, grant_id: _Optional[str] = ..., uid: _Optional[int] = ..., request_id: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., models: _Optional[int] = ...) -> None: ...

class HeldGrants(_message.Message):
    __slots__ = ("grants", "host_entry_json")
    GRANTS_FIELD_NUMBER: _ClassVar[int]
    HOST_ENTRY_JSON_FIELD_NUMBER: _ClassVar[int]
    grants: _containers.RepeatedCompositeFieldContainer[HeldGrant]
    host_entry_json: str
    def __init__(self, grants: _Optional[_Iterable[_Union[HeldGrant, _Mapping]]] = ..., host_entry_json: _Optional[str] = ...) -> None: ...

class GrantIssued(_message.Message):
    __slots__ = ("uid", "request_id", "grant_id")
    UID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    uid: int
    request_id: int
    grant_id: str
    def __init__(self, uid: _Optional[int] = ..., request_id: _Optional[int] = ..., grant_id: _Optional[str] = ...) -> None: ...

class GrantEnded(_message.Message):
    __slots__ = ("grant_id", "revoked", "ack")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    revoked: bool
    ack: bool
    def __init__(self, grant_id: _Optional[str] = ..., revoked: _Optional[bool] = ..., ack: _Optional[bool] = ...) -> None: ...

class GrantMoved(_message.Message):
    __slots__ = ("grant_id", "lane")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    lane: str
    def __init__(self, grant_id: _Optional[str] = ..., lane: _Optional[str] = ...) -> None: ...

class ModelMemory(_message.Message):
    __slots__ = ("grant_id", "nbytes", "freed")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    FREED_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    nbytes: int
    freed: bool
    def __init__(self, grant_id: _Optional[str] = ..., nbytes: _Optional[int] = ..., freed: _Optional[bool] = ...) -> None: ...

class ThermalStatusMsg(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: int
    def __init__(self, status: _Optional[int] = ...) -> None: ...

class Temperature(_message.Message):
    __slots__ = ("celsius", "utilization")
    CELSIUS_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    celsius: float
    utilization: float
    def __init__(self, celsius: _Optional[float] = ..., utilization: _Optional[float] = ...) -> None: ...

class Capabilities(_message.Message):
    __slots__ = ("name", "version", "backend", "channels", "memory_bytes", "model_cache_files", "data_cache_files", "hal_version", "inline_limit", "enforce_admission")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MODEL_CACHE_FILES_FIELD_NUMBER: _ClassVar[int]
    DATA_CACHE_FILES_FIELD_NUMBER: _ClassVar[int]
    HAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    INLINE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    ENFORCE_ADMISSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    backend: str
    channels: int
    memory_bytes: int
    model_cache_files: int
    data_cache_files: int
    hal_version: int
    inline_limit: int
    enforce_admission: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., backend: _Optional[str] = ..., channels: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., model_cache_files: _Optional[int] = ..., data_cache_files: _Optional[int] = ..., hal_version: _Optional[int] = ..., inline_limit: _Optional[int] = ..., enforce_admission: _Optional[bool] = ...) -> None: ...

class CacheFilesNeeded(_message.Message):
    __slots__ = ("n_model", "n_data")
    N_MODEL_FIELD_NUMBER: _ClassVar[int]
    N_DATA_FIELD_NUMBER: _ClassVar[int]
    n_model: int
    n_data: int
    def __init__(self, n_model: _Optional[int] = ..., n_data: _Optional[int] = ...) -> None: ...

class ValueType(_message.Message):
    __slots__ = ("kind", "dtype", "has_shape", "dims", "dim_params", "elem")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TENSOR: _ClassVar[ValueType.Kind]
        SEQUENCE: _ClassVar[ValueType.Kind]
        MAP: _ClassVar[ValueType.Kind]
        OPTIONAL: _ClassVar[ValueType.Kind]
    TENSOR: ValueType.Kind
    SEQUENCE: ValueType.Kind
    MAP: ValueType.Kind
    OPTIONAL: ValueType.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    HAS_SHAPE_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    DIM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    ELEM_FIELD_NUMBER: _ClassVar[int]
    kind: ValueType.Kind
    dtype: str
    has_shape: bool
    dims: _containers.RepeatedScalarFieldContainer[int]
    dim_params: _containers.RepeatedScalarFieldContainer[str]
    elem: ValueType
    def __init__(self, kind: _Optional[_Union[ValueType.Kind, str]] = ..., dtype: _Optional[str] = ..., has_shape: _Optional[bool] = ..., dims: _Optional[_Iterable[int]] = ..., dim_params: _Optional[_Iterable[str]] = ..., elem: _Optional[_Union[ValueType, _Mapping]] = ...) -> None: ...

class TensorSpec(_message.Message):
    __slots__ = ("name", "dtype", "shape", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    type: ValueType
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., type: _Optional[_Union[ValueType, _Mapping]] = ...) -> None: ...

class PrepareModel(_message.Message):
    __slots__ = ("onnx", "onnx_in_memfd", "onnx_size", "grant_id", "preference", "priority", "token", "n_model_cache", "n_data_cache", "external_locations")
    ONNX_FIELD_NUMBER: _ClassVar[int]
    ONNX_IN_MEMFD_FIELD_NUMBER: _ClassVar[int]
    ONNX_SIZE_FIELD_NUMBER: _ClassVar[int]
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    N_MODEL_CACHE_FIELD_NUMBER: _ClassVar[int]
    N_DATA_CACHE_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    onnx: bytes
    onnx_in_memfd: bool
    onnx_size: int
    grant_id: str
    preference: int
    priority: int
    token: bytes
    n_model_cache: int
    n_data_cache: int
    external_locations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, onnx: _Optional[bytes] = ..., onnx_in_memfd: _Optional[bool] = ..., onnx_size: _Optional[int] = ..., grant_id: _Optional[str] = ..., preference: _Optional[int] = ..., priority: _Optional[int] = ..., token: _Optional[bytes] = ..., n_model_cache: _Optional[int] = ..., n_data_cache: _Optional[int] = ..., external_locations: _Optional[_Iterable[str]] = ...) -> None: ...

class PrepareModelFromCache(_message.Message):
    __slots__ = ("grant_id", "token", "n_model_cache", "n_data_cache", "preference", "priority")
    GRANT_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    N_MODEL_CACHE_FIELD_NUMBER: _ClassVar[int]
    N_DATA_CACHE_FIELD_NUMBER: _ClassVar[int]
    PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    grant_id: str
    token: bytes
    n_model_cache: int
    n_data_cache: int
    preference: int
    priority: int
    def __init__(self, grant_id: _Optional[str] = ..., token: _Optional[bytes] = ..., n_model_cache: _Optional[int] = ..., n_data_cache: _Optional[int] = ..., preference: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class PreparedModelMsg(_message.Message):
    __slots__ = ("model_id", "memory_bytes", "inputs", "outputs", "from_cache", "cache_written", "from_fleet")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    FROM_CACHE_FIELD_NUMBER: _ClassVar[int]
    CACHE_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    FROM_FLEET_FIELD_NUMBER: _ClassVar[int]
    model_id: int
    memory_bytes: int
    inputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    outputs: _containers.RepeatedCompositeFieldContainer[TensorSpec]
    from_cache: bool
    cache_written: bool
    from_fleet: bool
    def __init__(self, model_id: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TensorSpec, _Mapping]]] = ..., from_cache: _Optional[bool] = ..., cache_written: _Optional[bool] = ..., from_fleet: _Optional[bool] = ...) -> None: ...

class RegisterPool(_message.Message):
    __slots__ = ("size",)
    SIZE_FIELD_NUMBER: _ClassVar[int]
    size: int
    def __init__(self, size: _Optional[int] = ...) -> None: ...

class PoolId(_message.Message):
    __slots__ = ("pool_id",)
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    pool_id: int
    def __init__(self, pool_id: _Optional[int] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("name", "dtype", "shape", "data", "pool_id", "offset", "nbytes", "in_reply_fd", "strings", "bytes_elements")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    IN_REPLY_FD_FIELD_NUMBER: _ClassVar[int]
    STRINGS_FIELD_NUMBER: _ClassVar[int]
    BYTES_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    pool_id: int
    offset: int
    nbytes: int
    in_reply_fd: bool
    strings: _containers.RepeatedScalarFieldContainer[bytes]
    bytes_elements: bool
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., pool_id: _Optional[int] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ..., in_reply_fd: _Optional[bool] = ..., strings: _Optional[_Iterable[bytes]] = ..., bytes_elements: _Optional[bool] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("name", "tensor", "sequence", "map", "optional")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    OPTIONAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    tensor: Tensor
    sequence: Sequence
    map: Map
    optional: Optional
    def __init__(self, name: _Optional[str] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ..., sequence: _Optional[_Union[Sequence, _Mapping]] = ..., map: _Optional[_Union[Map, _Mapping]] = ..., optional: _Optional[_Union[Optional, _Mapping]] = ...) -> None: ...

class Sequence(_message.Message):
    __slots__ = ("elements",)
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    elements: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, elements: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Map(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: Tensor
    values: Tensor
    def __init__(self, keys: _Optional[_Union[Tensor, _Mapping]] = ..., values: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class Optional(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: Value
    def __init__(self, value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Execute(_message.Message):
    __slots__ = ("model_id", "inputs", "job_priority", "has_feature_id", "feature_id", "has_original_uid", "original_uid", "steps", "feedback", "out_pool_id", "out_offset", "out_capacity", "exec_id", "group_id", "values")
    class FeedbackEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    JOB_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    HAS_FEATURE_ID_FIELD_NUMBER: _ClassVar[int]
    FEATURE_ID_FIELD_NUMBER: _ClassVar[int]
    HAS_ORIGINAL_UID_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_UID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    FEEDBACK_FIELD_NUMBER: _ClassVar[int]
    OUT_POOL_ID_FIELD_NUMBER: _ClassVar[int]
    OUT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OUT_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    model_id: int
    inputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    job_priority: int
    has_feature_id: bool
    feature_id: int
    has_original_uid: bool
    original_uid: int
    steps: int
    feedback: _containers.ScalarMap[str, str]
    out_pool_id: int
    out_offset: int
    out_capacity: int
    exec_id: int
    group_id: bytes
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, model_id: _Optional[int] = ..., inputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., job_priority: _Optional[int] = ..., has_feature_id: _Optional[bool] = ..., feature_id: _Optional[int] = ..., has_original_uid: _Optional[bool] = ..., original_uid: _Optional[int] = ..., steps: _Optional[int] = ..., feedback: _Optional[_Mapping[str, str]] = ..., out_pool_id: _Optional[int] = ..., out_offset: _Optional[int] = ..., out_capacity: _Optional[int] = ..., exec_id: _Optional[int] = ..., group_id: _Optional[bytes] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ExecuteResult(_message.Message):
    __slots__ = ("outputs", "work_id", "steps_run", "values", "moved", "moved_lane")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    WORK_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_RUN_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    MOVED_LANE_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[Tensor]
    work_id: int
    steps_run: int
    values: _containers.RepeatedCompositeFieldContainer[Value]
    moved: bool
    moved_lane: str
    def __init__(self, outputs: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., work_id: _Optional[int] = ..., steps_run: _Optional[int] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., moved: _Optional[bool] = ..., moved_lane: _Optional[str] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("model_id", "exec_id")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    EXEC_ID_FIELD_NUMBER: _ClassVar[int]
    model_id: int
    exec_id: int
    def __init__(self, model_id: _Optional[int] = ..., exec_id: _Optional[int] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("model_id",)
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    model_id: int
    def __init__(self, model_id: _Optional[int] = ...) -> None: ...

class OpenBurst(_message.Message):
    __slots__ = ("model_id", "size", "req_size", "resp_size")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    REQ_SIZE_FIELD_NUMBER: _ClassVar[int]
    RESP_SIZE_FIELD_NUMBER: _ClassVar[int]
    model_id: int
    size: int
    req_size: int
    resp_size: int
    def __init__(self, model_id: _Optional[int] = ..., size: _Optional[int] = ..., req_size: _Optional[int] = ..., resp_size: _Optional[int] = ...) -> None: ...

class BurstOpened(_message.Message):
    __slots__ = ("burst_id", "pool_id", "moved", "moved_lane")
    BURST_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_ID_FIELD_NUMBER: _ClassVar[int]
    MOVED_FIELD_NUMBER: _ClassVar[int]
    MOVED_LANE_FIELD_NUMBER: _ClassVar[int]
    burst_id: int
    pool_id: int
    moved: bool
    moved_lane: str
    def __init__(self, burst_id: _Optional[int] = ..., pool_id: _Optional[int] = ..., moved: _Optional[bool] = ..., moved_lane: _Optional[str] = ...) -> None: ...

class BurstId(_message.Message):
    __slots__ = ("burst_id",)
    BURST_ID_FIELD_NUMBER: _ClassVar[int]
    burst_id: int
    def __init__(self, burst_id: _Optional[int] = ...) -> None: ...

class BurstError(_message.Message):
    __slots__ = ("type", "message", "need_bytes")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NEED_BYTES_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    need_bytes: int
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., need_bytes: _Optional[int] = ...) -> None: ...
