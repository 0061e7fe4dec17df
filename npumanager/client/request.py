"""The client's value types: ModelLoadRequest (and its Builder), the callback base class,
the per-request listener, and the conversions of policy bundles to wire messages."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from npumanager.constants import (
    KEY_MAX_BUDGET,
    KEY_MODEL_SIZE_WEIGHTS,
    LoadStatus,
    ModelPriority,
    ModelSize,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.errors import InvalidArgument
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.proto.v1.manager_pb2 import RealtimeGrant, SetPolicy, ThermalReply

#: Extension key of a policy bundle: the MEMORY policy's budget in bytes.
KEY_MEMORY_BUDGET_BYTES = "memoryBudgetBytes"

_INT64 = (-(1 << 63), (1 << 63) - 1)


def _check_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an integer, not {value!r}")
    if not _INT64[0] <= value <= _INT64[1]:
        raise InvalidArgument(f"{what} {value} is out of range")
    return value


@dataclass(frozen=True)
class ModelLoadRequest:
    """What an app asks to load: an id unique per connection, a size class, a priority and
    the device the model will be prepared on (``nn.devices()`` names; None: the first).

    Frozen and hashable, so it can key a dict; the same id from two uids is two
    requests (npud keys requests by (uid, id))."""

    id: int
    size: ModelSize = ModelSize.LESS_THAN_1GB
    priority: ModelPriority = ModelPriority.NORMAL
    #: The grant is valid on this device only (npud keeps one budget per device).
    device: str | None = None

    def __post_init__(self) -> None:
        _check_int(self.id, "request id")
        if self.device is not None and (not isinstance(self.device, str) or not self.device):
            raise InvalidArgument(f"device must be a device name or None, got {self.device!r}")
        # Already enum members (the usual case): nothing to convert (an Enum call is ~0.7 µs).
        if type(self.size) is not ModelSize:
            try:
                object.__setattr__(self, "size", ModelSize(self.size))
            except ValueError:
                raise InvalidArgument(f"unknown model size {self.size!r}") from None
        if type(self.priority) is not ModelPriority:
            try:
                object.__setattr__(self, "priority", ModelPriority(self.priority))
            except ValueError:
                raise InvalidArgument(f"unknown model priority {self.priority!r}") from None

    class Builder:
        """Android's ModelLoadRequest.Builder: ``Builder(id).set_size(..).build()``."""

        def __init__(self, id: int) -> None:
            self._id = id
            self._size = ModelSize.LESS_THAN_1GB
            self._priority = ModelPriority.NORMAL
            self._device: str | None = None

        def set_size(self, size: ModelSize | int) -> ModelLoadRequest.Builder:
            self._size = size  # type: ignore[assignment]  # validated in build()
            return self

        def set_priority(self, priority: ModelPriority | int) -> ModelLoadRequest.Builder:
            self._priority = priority  # type: ignore[assignment]
            return self

        def set_device(self, device: str | None) -> ModelLoadRequest.Builder:
            self._device = device
            return self

        def build(self) -> ModelLoadRequest:
            return ModelLoadRequest(self._id, self._size, self._priority, self._device)


class ModelLoadRequestCallback:
    """Override what you need; the base methods do nothing.

    Called on the executor given to ``request_can_load_model`` (or the
    manager's dispatch thread), in the order npud sent them."""

    def on_can_load_model(
        self, request: ModelLoadRequest, status: LoadStatus, listener: Any
    ) -> None:
        """CAN_LOAD_NOW (``listener.grant_id`` is live), WAIT_FOR_UNLOAD or NOT_PRIORITIZED."""

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        """npud asks the app to unload (report with ``listener.notify_model_unloaded``)."""

    def on_model_load_request_complete(
        self, request: ModelLoadRequest, status: RequestStatus
    ) -> None:
        """The request ended: CANCELLED, COMPLETE or REVOKED. Nothing follows."""


class ListenerBase:
    """What both APIs' listeners share: the one request they are valid for, and its grant."""

    def __init__(self, request: ModelLoadRequest) -> None:
        self.request = request
        self.grant_id: str | None = None
        #: With the grant: which host of the device it is valid on ("": the main one,
        #: "background": its background lane); ``nn.Device.prepare_model`` goes there.
        self.lane = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} request={self.request.id} grant={self.grant_id}>"

    def _check(self, request: ModelLoadRequest) -> None:
        if request is not self.request and request != self.request:
            raise InvalidArgument(
                f"this listener belongs to request {self.request.id}, not {request!r}"
            )


class ModelLoadStatusListener(ListenerBase):
    """Tells npud what the app did with one request; valid only for that request.

    ``grant_id`` is set once npud answered CAN_LOAD_NOW; pass the listener as
    ``grant=`` to ``nn.Device.prepare_model``."""

    def __init__(self, request: ModelLoadRequest, report: Callable[[str, int], None]) -> None:
        super().__init__(request)
        self._report = report

    def notify_model_loaded(self, request: ModelLoadRequest) -> None:
        self._check(request)
        self._report("loaded", request.id)

    def notify_model_unloaded(self, request: ModelLoadRequest) -> None:
        self._check(request)
        self._report("unloaded", request.id)


def policy_message(policy: int, bundle: Mapping[str, Any] | None) -> SetPolicy:
    """A ``set_policy`` bundle as a wire message; malformed bundles -> InvalidArgument.

    Range rules (weight or budget <= 0, unknown policy) are npud's to enforce."""
    try:
        if isinstance(policy, bool):
            raise TypeError
        p = int(policy)
    except (TypeError, ValueError):
        raise InvalidArgument(f"unknown policy {policy!r}") from None
    if not -(1 << 31) <= p < (1 << 31):
        raise InvalidArgument(f"unknown policy {policy!r}")
    msg = SetPolicy(policy=p)
    if not bundle:
        return msg
    unknown = set(bundle) - {KEY_MAX_BUDGET, KEY_MODEL_SIZE_WEIGHTS, KEY_MEMORY_BUDGET_BYTES}
    if unknown:
        raise InvalidArgument(
            f"unknown policy bundle key(s) {sorted(unknown)}; use {KEY_MAX_BUDGET!r}, "
            f"{KEY_MODEL_SIZE_WEIGHTS!r} or {KEY_MEMORY_BUDGET_BYTES!r}"
        )
    if KEY_MAX_BUDGET in bundle:
        msg.max_budget = _check_int(bundle[KEY_MAX_BUDGET], KEY_MAX_BUDGET)
    if KEY_MEMORY_BUDGET_BYTES in bundle:
        msg.memory_budget_bytes = _check_int(bundle[KEY_MEMORY_BUDGET_BYTES],
                                             KEY_MEMORY_BUDGET_BYTES)
    weights = bundle.get(KEY_MODEL_SIZE_WEIGHTS)
    if weights is not None:
        if not isinstance(weights, Mapping):
            raise InvalidArgument(f"{KEY_MODEL_SIZE_WEIGHTS} must be a dict keyed by str(size)")
        for key, value in weights.items():
            try:
                size = ModelSize(int(key))
            except (TypeError, ValueError):
                raise InvalidArgument(
                    f"{KEY_MODEL_SIZE_WEIGHTS}: {key!r} is not a model size "
                    f"({', '.join(str(int(s)) for s in ModelSize)})"
                ) from None
            msg.weights.add(size=int(size), weight=_check_int(value, f"weight of size {key}"))
    return msg


@dataclass(frozen=True)
class DeviceSummary:
    """A device as npud lists it (``NpuManager.devices()``)."""

    name: str
    version: str
    backend: str
    socket_path: str
    channels: int
    memory_bytes: int
    available: bool
    model_cache_files: int
    data_cache_files: int
    device_number: int

    @classmethod
    def from_proto(cls, d: DeviceInfo) -> DeviceSummary:
        return cls(name=d.name, version=d.version, backend=d.backend,
                   socket_path=d.socket_path, channels=d.channels,
                   memory_bytes=d.memory_bytes, available=d.available,
                   model_cache_files=d.model_cache_files, data_cache_files=d.data_cache_files,
                   device_number=d.device_number)


@dataclass(frozen=True)
class ThermalInfo:
    """npud's thermal view: the status in effect, whether an admin overrides it, headroom."""

    status: ThermalStatus
    overridden: bool
    headroom: float | None
    details: dict[str, Any]

    @classmethod
    def from_proto(cls, m: ThermalReply) -> ThermalInfo:
        import json
        import math

        return cls(status=ThermalStatus(m.status), overridden=m.overridden,
                   headroom=None if math.isnan(m.headroom) else m.headroom,
                   details=json.loads(m.details_json) if m.details_json else {})


@dataclass(frozen=True)
class RealtimeInfo:
    """A real-time grant (``set_thread_realtime``): the thread's SCHED_FIFO priority and
    the watchdog's bound (it is demoted after using more than ``max_cpu_ms`` of CPU in
    any ``window_s``); ``max_threads``: how many one uid may hold."""

    priority: int
    max_cpu_ms: float
    window_s: float
    max_threads: int

    @classmethod
    def from_proto(cls, m: RealtimeGrant) -> RealtimeInfo:
        return cls(priority=m.priority, max_cpu_ms=m.max_cpu_ms, window_s=m.window_s,
                   max_threads=m.max_threads)
