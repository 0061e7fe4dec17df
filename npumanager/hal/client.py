"""The IScheduling client: what npud (and admins, and the conformance suite) call.

``connect_scheduling(name)`` opens the driver's socket; callbacks registered
with ``set_callback`` arrive on the connection's reader thread, in order.
"""

from __future__ import annotations

import os

from npumanager import paths
from npumanager.errors import PermissionDenied
from npumanager.fds import close_fds
from npumanager.hal.types import (
    DEBOUNCE_DURATION_MS,
    EndReason,
    ISchedulingCallback,
    SchedulingConfig,
    StartReason,
    validate_configs,
)
from npumanager.hal.wire import SERVICE, configs_msg, work_event_from_payload
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.wire.client import SyncRpcClient


class IScheduling:
    """A connection to one driver's IScheduling (admin only)."""

    def __init__(self, socket_path: str) -> None:
        self._callback: ISchedulingCallback | None = None
        self._rpc = SyncRpcClient(socket_path, SERVICE, on_push=self._on_push,
                                  client_name="hal")
        if not self._rpc.hello.admin:
            uid = self._rpc.hello.uid
            self._rpc.close()
            raise PermissionDenied(f"IScheduling is for npud and admins only (uid {uid})")

    def __repr__(self) -> str:
        return f"<IScheduling {self._rpc.path} callback={self._callback!r}>"

    def set_scheduling_configs(self, configs: list[SchedulingConfig]) -> None:
        """Replace the whole table (IllegalArgument on any invalid entry; nothing changes)."""
        validate_configs(configs)
        self._rpc.call("hal.set_scheduling_configs", configs_msg(configs))

    def update_scheduling_configs(self, configs: list[SchedulingConfig]) -> None:
        """Upsert entries by uid (IllegalArgument on any invalid entry; nothing changes)."""
        validate_configs(configs)
        self._rpc.call("hal.update_scheduling_configs", configs_msg(configs))

    def set_callback(self, callback: ISchedulingCallback | None,
                     debounce_duration_ms: int = DEBOUNCE_DURATION_MS) -> None:
        """Become the driver's one callback (replacing any other), or clear it with None."""
        self._callback = callback
        self._rpc.call("hal.set_callback", pb.SetCallback(
            clear=callback is None, debounce_ms=max(0, int(debounce_duration_ms))))

    def get_temperature(self) -> float | None:
        payload, _ = self._rpc.call("hal.get_temperature", Empty())
        t = pb.Temperature.FromString(payload).celsius
        return None if t != t else t  # NaN: no thermal model

    def _on_push(self, method: str, payload: bytes, fds: list[int]) -> None:
        close_fds(fds)
        cb = self._callback
        if cb is None or not method.startswith("hal.on_work_"):
            return
        info, reason = work_event_from_payload(payload)
        if method == "hal.on_work_requested":
            cb.on_work_requested(info)
        elif method == "hal.on_work_started":
            cb.on_work_started(info, StartReason(reason))
        elif method == "hal.on_work_ended":
            cb.on_work_ended(info, EndReason(reason))

    def close(self) -> None:
        self._rpc.close()

    def __enter__(self) -> IScheduling:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_scheduling(driver_name: str,
                       runtime_dir: str | os.PathLike[str] | None = None) -> IScheduling:
    """Connect to driver ``driver_name``'s IScheduling (ServiceUnavailable if it is down)."""
    return IScheduling(str(paths.driver_socket(driver_name, runtime_dir)))
