"""The client SDK of npud: NpuManager (blocking, callbacks on an executor),
AsyncNpuManager (asyncio, with ``reserve()`` leases) and their value types."""

from npumanager.client.aio import AsyncModelLoadStatusListener, AsyncNpuManager, Lease
from npumanager.client.manager import NpuManager
from npumanager.client.request import (
    KEY_MEMORY_BUDGET_BYTES,
    DeviceSummary,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelLoadStatusListener,
    ThermalInfo,
)

__all__ = [
    "KEY_MEMORY_BUDGET_BYTES",
    "AsyncModelLoadStatusListener",
    "AsyncNpuManager",
    "DeviceSummary",
    "Lease",
    "ModelLoadRequest",
    "ModelLoadRequestCallback",
    "ModelLoadStatusListener",
    "NpuManager",
    "ThermalInfo",
]
