"""Public constants of the manager API, with their Android twins.

Each enum has the value Android gives it, so code ported from
``android.npumanager`` keeps its numbers. Lower priority numbers are more
important, as in Android.
"""

from __future__ import annotations

from enum import IntEnum


class ModelSize(IntEnum):
    LESS_THAN_1GB = 0
    BETWEEN_1GB_AND_2GB = 1
    GREATER_THAN_2G = 2


class ModelPriority(IntEnum):
    NORMAL = 0
    BACKGROUND = 1000
    OPPORTUNISTIC = 2000


class LoadStatus(IntEnum):
    CAN_LOAD_NOW = 0
    WAIT_FOR_UNLOAD = 1
    NOT_PRIORITIZED = 2


class RequestStatus(IntEnum):
    """Terminal statuses; nothing follows one."""

    CANCELLED = 3
    COMPLETE = 4
    REVOKED = 5


class Policy(IntEnum):
    STATUS_QUO = 0
    TURN_TAKING = 1
    BUDGET = 2
    MEMORY = 3


class UnloadReason(IntEnum):
    PREEMPTED = 0
    FAIRNESS = 1
    THERMAL = 2
    POLICY_CHANGED = 3
    ADMIN = 4
    MEMORY_PRESSURE = 5


class Importance(IntEnum):
    """ActivityManager importance values: a uid's priority."""

    FOREGROUND = 100
    FOREGROUND_SERVICE = 125
    VISIBLE = 200
    PERCEPTIBLE = 230
    SERVICE = 300
    TOP_SLEEPING = 325
    CANT_SAVE_STATE = 350
    CACHED = 400
    GONE = 1000


class ThermalStatus(IntEnum):
    """Android's THERMAL_STATUS ladder."""

    NONE = 0
    LIGHT = 1
    MODERATE = 2
    SEVERE = 3
    CRITICAL = 4
    EMERGENCY = 5
    SHUTDOWN = 6


KEY_MAX_BUDGET = "maxBudget"
KEY_MODEL_SIZE_WEIGHTS = "modelSizeWeights"

# Android names with Android values, for people porting code.
NPU_MODEL_SIZE_LESS_THAN_1GB = ModelSize.LESS_THAN_1GB
NPU_MODEL_SIZE_BETWEEN_1GB_AND_2GB = ModelSize.BETWEEN_1GB_AND_2GB
NPU_MODEL_SIZE_GREATER_THAN_2G = ModelSize.GREATER_THAN_2G
NPU_MODEL_PRIORITY_NORMAL = ModelPriority.NORMAL
NPU_MODEL_PRIORITY_BACKGROUND = ModelPriority.BACKGROUND
NPU_MODEL_PRIORITY_OPPORTUNISTIC = ModelPriority.OPPORTUNISTIC
NPU_MODEL_LOAD_STATUS_CAN_LOAD_NOW = LoadStatus.CAN_LOAD_NOW
NPU_MODEL_LOAD_STATUS_WAIT_FOR_UNLOAD = LoadStatus.WAIT_FOR_UNLOAD
NPU_MODEL_LOAD_STATUS_NOT_PRIORITIZED = LoadStatus.NOT_PRIORITIZED
NPU_MODEL_LOAD_REQUEST_STATUS_CANCELLED = RequestStatus.CANCELLED
NPU_MODEL_LOAD_REQUEST_STATUS_COMPLETE = RequestStatus.COMPLETE
NPU_MODEL_LOAD_REQUEST_STATUS_REVOKED = RequestStatus.REVOKED
NPU_MODEL_POLICY_STATUS_QUO = Policy.STATUS_QUO
NPU_MODEL_POLICY_TURN_TAKING = Policy.TURN_TAKING
NPU_MODEL_POLICY_BUDGET = Policy.BUDGET
NPU_MODEL_POLICY_MEMORY = Policy.MEMORY


#: `npu importance set` accepts 0 .. GONE (1000), ActivityManager's range.
MAX_IMPORTANCE = 1000


def parse_importance(text: str) -> int:
    """An importance given as a name (``foreground``, any case) or a number."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return int(Importance[text.strip().upper().replace("-", "_")])
    except KeyError:
        names = ", ".join(m.name.lower() for m in Importance)
        raise ValueError(f"unknown importance {text!r}; use a number or one of {names}") from None


def parse_thermal_status(text: str) -> ThermalStatus:
    """A thermal LEVEL: a status name (any case) or its number 0-6."""
    try:
        n = int(text)
    except ValueError:
        try:
            return ThermalStatus[text.strip().upper()]
        except KeyError:
            names = ", ".join(m.name.lower() for m in ThermalStatus)
            raise ValueError(f"unknown thermal level {text!r}; use 0-6 or one of {names}") from None
    try:
        return ThermalStatus(n)
    except ValueError:
        raise ValueError(f"thermal level {n} out of range 0-6") from None
