from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Frame(_message.Message):
    __slots__ = ("kind", "call_id", "method", "payload", "n_fds", "error_type", "error_message")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[Frame.Kind]
        REQUEST: _ClassVar[Frame.Kind]
        REPLY: _ClassVar[Frame.Kind]
        ERROR: _ClassVar[Frame.Kind]
        PUSH: _ClassVar[Frame.Kind]
    KIND_UNSPECIFIED: Frame.Kind
    REQUEST: Frame.Kind
    REPLY: Frame.Kind
    ERROR: Frame.Kind
    PUSH: Frame.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    N_FDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    kind: Frame.Kind
    call_id: int
    method: str
    payload: bytes
    n_fds: int
    error_type: str
    error_message: str
    def __init__(self, kind: _Optional[_Union[Frame.Kind, str]] = ..., call_id: _Optional[int] = ..., method: _Optional[str] = ..., payload: _Optional[bytes] = ..., n_fds: _Optional[int] = ..., error_type: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol_version", "service", "client_name")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    service: str
    client_name: str
    def __init__(self, protocol_version: _Optional[int] = ..., service: _Optional[str] = ..., client_name: _Optional[str] = ...) -> None: ...

class HelloReply(_message.Message):
    __slots__ = ("protocol_version", "service", "server_version", "uid", "pid", "admin", "max_frame")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    service: str
    server_version: str
    uid: int
    pid: int
    admin: bool
    max_frame: int
    def __init__(self, protocol_version: _Optional[int] = ..., service: _Optional[str] = ..., server_version: _Optional[str] = ..., uid: _Optional[int] = ..., pid: _Optional[int] = ..., admin: _Optional[bool] = ..., max_frame: _Optional[int] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
