from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class DeviceInfo(_message.Message):
    __slots__ = ("name", "version", "socket_path", "channels", "memory_bytes", "available", "model_cache_files", "data_cache_files", "backend", "device_number")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOCKET_PATH_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_CACHE_FILES_FIELD_NUMBER: _ClassVar[int]
    DATA_CACHE_FILES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NUMBER_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    socket_path: str
    channels: int
    memory_bytes: int
    available: bool
    model_cache_files: int
    data_cache_files: int
    backend: str
    device_number: int
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., socket_path: _Optional[str] = ..., channels: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., available: _Optional[bool] = ..., model_cache_files: _Optional[int] = ..., data_cache_files: _Optional[int] = ..., backend: _Optional[str] = ..., device_number: _Optional[int] = ...) -> None: ...
