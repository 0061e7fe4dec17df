"""The vendor-driver boundary (the android.hardware.npu analog)."""

from npumanager.hal.client import IScheduling, connect_scheduling
from npumanager.hal.types import (
    DEBOUNCE_DURATION_MS,
    HAL_VERSION,
    MAX_PRIORITY,
    MIN_PRIORITY,
    EndReason,
    ISchedulingCallback,
    SchedulingConfig,
    StartReason,
    WorkInfo,
)

__all__ = [
    "DEBOUNCE_DURATION_MS",
    "HAL_VERSION",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "EndReason",
    "IScheduling",
    "ISchedulingCallback",
    "SchedulingConfig",
    "StartReason",
    "WorkInfo",
    "connect_scheduling",
]
