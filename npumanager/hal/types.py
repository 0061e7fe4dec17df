"""HAL value types: SchedulingConfig, WorkInfo and the lifecycle reasons (API.md "HAL")."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from npumanager.errors import IllegalArgument

MIN_PRIORITY = 0
MAX_PRIORITY = 1000
DEBOUNCE_DURATION_MS = 50
#: Priority of a uid with no SchedulingConfig.
UNKNOWN_UID_PRIORITY = 1000
#: Protocol version of the HAL that npud speaks; drivers declare theirs.
HAL_VERSION = 1


class StartReason(IntEnum):
    INITIAL = 0
    RESUMED = 1


class EndReason(IntEnum):
    CANCELLED_USER = 0
    CANCELLED_SYSTEM = 1
    PAUSED = 2
    FAILED = 3
    COMPLETED = 4


@dataclass(frozen=True)
class SchedulingConfig:
    uid: int
    app_priority: int
    min_priority: int = MIN_PRIORITY
    max_priority: int = MAX_PRIORITY
    has_direct_access: bool = True
    can_attribute_other_uid: bool = False

    def clamp(self, job_priority: int) -> int:
        return max(self.min_priority, min(self.max_priority, job_priority))


def default_config(uid: int) -> SchedulingConfig:
    """An unconfigured uid: priority 1000, direct access, no attribution."""
    return SchedulingConfig(uid=uid, app_priority=UNKNOWN_UID_PRIORITY)


def validate_configs(configs: list[SchedulingConfig]) -> None:
    """Raise IllegalArgument for the first invalid entry; callers change nothing on error."""
    seen: set[int] = set()
    for c in configs:
        for name in ("app_priority", "min_priority", "max_priority"):
            v = getattr(c, name)
            if not isinstance(v, int) or not MIN_PRIORITY <= v <= MAX_PRIORITY:
                raise IllegalArgument(
                    f"uid {c.uid}: {name}={v!r} is outside {MIN_PRIORITY}..{MAX_PRIORITY}"
                )
        if c.min_priority > c.max_priority:
            raise IllegalArgument(
                f"uid {c.uid}: min_priority {c.min_priority} > max_priority {c.max_priority}"
            )
        if c.uid < 0:
            raise IllegalArgument(f"uid {c.uid} is negative")
        if c.uid in seen:
            raise IllegalArgument(f"uid {c.uid} appears twice")
        seen.add(c.uid)


@dataclass(frozen=True)
class WorkInfo:
    id: int
    group_id: bytes | None
    uid: int
    debug_pid: int
    original_uid: int
    debug_feature_id: int | None
    job_priority: int
    effective_priority: int
    timestamp_ms: int
    device_number: int = 0


class ISchedulingCallback:
    """Receives the driver's work lifecycle. The base methods do nothing."""

    def on_work_requested(self, info: WorkInfo) -> None:
        pass

    def on_work_started(self, info: WorkInfo, reason: StartReason) -> None:
        pass

    def on_work_ended(self, info: WorkInfo, reason: EndReason) -> None:
        pass
