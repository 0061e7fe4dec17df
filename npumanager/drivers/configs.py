"""npud's scheduling configs per uid (IScheduling.setSchedulingConfigs) and what they
decide: direct access, attribution to another uid, and a job's effective priority.
Pure (part of :class:`~npumanager.drivers.state.DriverState`)."""

from __future__ import annotations

from collections.abc import Iterable

from npumanager.errors import AttributionDenied, DirectAccessDenied
from npumanager.hal.types import SchedulingConfig, default_config, validate_configs


class SchedulingConfigs:
    def __init__(self) -> None:
        self.by_uid: dict[int, SchedulingConfig] = {}

    def of(self, uid: int) -> SchedulingConfig:
        return self.by_uid.get(uid) or default_config(uid)

    def set(self, configs: Iterable[SchedulingConfig], replace: bool) -> None:
        """Validated first: a bad list changes nothing."""
        configs = list(configs)
        validate_configs(configs)
        if replace:
            self.by_uid = {c.uid: c for c in configs}
        else:
            for c in configs:
                self.by_uid[c.uid] = c

    def effective_priority(self, uid: int, original_uid: int | None, job_priority: int) -> int:
        """Check access and attribution; the attributed uid's app priority + clamped job."""
        cfg = self.of(uid)
        if not cfg.has_direct_access:
            raise DirectAccessDenied(f"uid {uid} has no direct access to this device")
        attributed = cfg
        if original_uid is not None and original_uid != uid:
            if not cfg.can_attribute_other_uid:
                raise AttributionDenied(f"uid {uid} may not attribute work to uid {original_uid}")
            attributed = self.of(original_uid)
        return attributed.app_priority + attributed.clamp(job_priority)
