"""The runtime client (the NNAPI analog): devices, prepared models, execution.

```python
from npumanager import nn
dev = nn.device("reference")
model = dev.prepare_model("model.onnx", grant=listener)
outputs = model.execute({"x": array})
```
"""

from __future__ import annotations

import os

from npumanager.errors import (
    AttributionDenied,
    DeviceUnavailable,
    DirectAccessDenied,
    GeneralFailure,
    GrantRequired,
    GrantRevoked,
    InvalidArgument,
)

# Compilation caching helpers (owned by the cache engineer).
from npumanager.nn.cache_files import cache_file_names as cache_file_names
from npumanager.nn.device import Capabilities, Device, ExecutionPreference, Priority
from npumanager.nn.model import Model
from npumanager.nn.token import driver_token as driver_token
from npumanager.tensorio import TensorSpec, ValueType


def devices(runtime_dir: str | os.PathLike[str] | None = None) -> list[Device]:
    """The devices npud supervises (its ``list_devices``), available or not."""
    from npumanager import paths
    from npumanager.errors import ServiceUnavailable
    from npumanager.proto.v1.manager_pb2 import DeviceList
    from npumanager.proto.v1.wire_pb2 import Empty
    from npumanager.wire.client import SyncRpcClient

    try:
        with SyncRpcClient(str(paths.manager_socket(runtime_dir)), "manager",
                           threaded=False, client_name="nn") as rpc:
            payload, _ = rpc.call("list_devices", Empty())
    except ServiceUnavailable as exc:
        raise DeviceUnavailable(f"cannot list devices: {exc}") from None
    listed = DeviceList.FromString(payload)
    return [Device(d.name, runtime_dir, socket_path=d.socket_path or None,
                   number=d.device_number) for d in listed.devices]


def device(name: str, runtime_dir: str | os.PathLike[str] | None = None) -> Device:
    """The device ``name``, connected (DeviceUnavailable if its driver is down)."""
    dev = Device(name, runtime_dir)
    dev.connection()
    return dev


__all__ = [
    "AttributionDenied",
    "Capabilities",
    "Device",
    "DeviceUnavailable",
    "DirectAccessDenied",
    "ExecutionPreference",
    "GeneralFailure",
    "GrantRequired",
    "GrantRevoked",
    "InvalidArgument",
    "Model",
    "Priority",
    "TensorSpec",
    "ValueType",
    "cache_file_names",
    "device",
    "devices",
    "driver_token",
]
