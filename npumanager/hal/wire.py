"""Conversions between the HAL's typed values and driver.proto messages.

Generated classes stay at the wire boundary: the host, the HAL client and the
supervisor all convert here and work with :mod:`npumanager.hal.types` inside.
"""

from __future__ import annotations

from npumanager.hal.types import SchedulingConfig, WorkInfo
from npumanager.proto.v1 import driver_pb2 as pb

#: Service name of every driver socket.
SERVICE = "driver"


def config_to_msg(c: SchedulingConfig) -> pb.SchedulingConfigMsg:
    return pb.SchedulingConfigMsg(
        uid=c.uid,
        app_priority=c.app_priority,
        min_priority=c.min_priority,
        max_priority=c.max_priority,
        has_direct_access=c.has_direct_access,
        can_attribute_other_uid=c.can_attribute_other_uid,
    )


def config_from_msg(m: pb.SchedulingConfigMsg) -> SchedulingConfig:
    return SchedulingConfig(
        uid=m.uid,
        app_priority=m.app_priority,
        min_priority=m.min_priority,
        max_priority=m.max_priority,
        has_direct_access=m.has_direct_access,
        can_attribute_other_uid=m.can_attribute_other_uid,
    )


def configs_msg(configs: list[SchedulingConfig]) -> pb.SchedulingConfigs:
    return pb.SchedulingConfigs(configs=[config_to_msg(c) for c in configs])


def configs_from_payload(payload: bytes) -> list[SchedulingConfig]:
    msg = pb.SchedulingConfigs()
    msg.ParseFromString(payload)
    return [config_from_msg(m) for m in msg.configs]


def work_to_msg(w: WorkInfo) -> pb.WorkInfoMsg:
    return pb.WorkInfoMsg(
        id=w.id,
        group_id=w.group_id or b"",
        uid=w.uid,
        debug_pid=w.debug_pid,
        original_uid=w.original_uid,
        has_feature_id=w.debug_feature_id is not None,
        debug_feature_id=w.debug_feature_id or 0,
        job_priority=w.job_priority,
        effective_priority=w.effective_priority,
        timestamp_ms=w.timestamp_ms,
        device_number=w.device_number,
    )


def work_from_msg(m: pb.WorkInfoMsg) -> WorkInfo:
    return WorkInfo(
        id=m.id,
        group_id=m.group_id or None,
        uid=m.uid,
        debug_pid=m.debug_pid,
        original_uid=m.original_uid,
        debug_feature_id=m.debug_feature_id if m.has_feature_id else None,
        job_priority=m.job_priority,
        effective_priority=m.effective_priority,
        timestamp_ms=m.timestamp_ms,
        device_number=m.device_number,
    )


def work_event_from_payload(payload: bytes) -> tuple[WorkInfo, int]:
    msg = pb.WorkEvent()
    msg.ParseFromString(payload)
    return work_from_msg(msg.info), msg.reason
