"""npumanager: an open NPU stack for Linux.

The manager API (``from npumanager import ...``) is re-exported here; see
API.md for the contract. Implementation lives in the subpackages.
"""

from __future__ import annotations

from npumanager.client import (
    AsyncNpuManager,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelLoadStatusListener,
    NpuManager,
)
from npumanager.constants import (
    KEY_MAX_BUDGET,
    KEY_MODEL_SIZE_WEIGHTS,
    NPU_MODEL_LOAD_REQUEST_STATUS_CANCELLED,
    NPU_MODEL_LOAD_REQUEST_STATUS_COMPLETE,
    NPU_MODEL_LOAD_REQUEST_STATUS_REVOKED,
    NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW,
    NPU_MODEL_LOAD_STATUS_NOT_PRIORITIZED,
    NPU_MODEL_LOAD_STATUS_WAIT_FOR_UNLOAD,
    NPU_MODEL_POLICY_BUDGET,
    NPU_MODEL_POLICY_MEMORY,
    NPU_MODEL_POLICY_STATUS_QUO,
    NPU_MODEL_POLICY_TURN_TAKING,
    NPU_MODEL_PRIORITY_BACKGROUND,
    NPU_MODEL_PRIORITY_NORMAL,
    NPU_MODEL_PRIORITY_OPPORTUNISTIC,
    NPU_MODEL_SIZE_BETWEEN_1GB_AND_2GB,
    NPU_MODEL_SIZE_GREATER_THAN_2G,
    NPU_MODEL_SIZE_LESS_THAN_1GB,
    Importance,
    LoadStatus,
    ModelPriority,
    ModelSize,
    Policy,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.version import __version__

__all__ = [
    "KEY_MAX_BUDGET",
    "KEY_MODEL_SIZE_WEIGHTS",
    "NPU_MODEL_LOAD_REQUEST_STATUS_CANCELLED",
    "NPU_MODEL_LOAD_REQUEST_STATUS_COMPLETE",
    "NPU_MODEL_LOAD_REQUEST_STATUS_REVOKED",
    "NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW",
    "NPU_MODEL_LOAD_STATUS_NOT_PRIORITIZED",
    "NPU_MODEL_LOAD_STATUS_WAIT_FOR_UNLOAD",
    "NPU_MODEL_POLICY_BUDGET",
    "NPU_MODEL_POLICY_MEMORY",
    "NPU_MODEL_POLICY_STATUS_QUO",
    "NPU_MODEL_POLICY_TURN_TAKING",
    "NPU_MODEL_PRIORITY_BACKGROUND",
    "NPU_MODEL_PRIORITY_NORMAL",
    "NPU_MODEL_PRIORITY_OPPORTUNISTIC",
    "NPU_MODEL_SIZE_BETWEEN_1GB_AND_2GB",
    "NPU_MODEL_SIZE_GREATER_THAN_2G",
    "NPU_MODEL_SIZE_LESS_THAN_1GB",
    "AsyncNpuManager",
    "Importance",
    "LoadStatus",
    "ModelLoadRequest",
    "ModelLoadRequestCallback",
    "ModelLoadStatusListener",
    "ModelPriority",
    "ModelSize",
    "NpuManager",
    "Policy",
    "RequestStatus",
    "ThermalStatus",
    "UnloadReason",
    "__version__",
]
