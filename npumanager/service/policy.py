"""Admission policies: their settings, validation, charges and budgets.

This module owns the numbers: which policy is active with which weights and
budget (:class:`PolicySettings`), what one request is charged under it
(:func:`charge`), how large the budget is once the thermal governor has
scaled it (:func:`capacity`), which ranks a thermal status keeps
(:func:`keep_rank`), and the manager's tunables (:class:`ManagerParams`, read
from the ``[manager]`` and ``[policy]`` config sections). The decisions that
use these numbers live in :mod:`npumanager.service.state`.

Budgets are ``int | None``; ``None`` is unlimited (STATUS_QUO).

Devices: npud keeps one budget per device, all under the one policy in force
(its name and weights are global: ``set_policy`` is Android's API and names no
device). A device may carry its own ceiling (:class:`DeviceLimits`, from
``[policy.devices."NAME"]``): its ``max_budget`` under BUDGET and its
``memory_budget_bytes`` under MEMORY replace the global ones for that device
only, and survive ``set_policy`` (they describe the hardware, not a choice of
policy). Under MEMORY each device's budget is its own memory, as its driver
reports it, unless a byte budget is set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from npumanager.config import Config
from npumanager.constants import Importance, ModelSize, Policy, ThermalStatus
from npumanager.errors import InvalidArgument

GIB = 1 << 30

DEFAULT_WEIGHTS: dict[int, int] = {0: 1, 1: 2, 2: 4}
DEFAULT_MAX_BUDGET = 4
#: What a request is charged under MEMORY until its driver reports the real size.
DEFAULT_SIZE_BYTES: dict[int, int] = {0: 1 * GIB, 1: 2 * GIB, 2: 4 * GIB}

#: Share of the budget left at each thermal status.
DEFAULT_THERMAL_SCALE: dict[ThermalStatus, float] = {
    ThermalStatus.NONE: 1.0,
    ThermalStatus.LIGHT: 1.0,
    ThermalStatus.MODERATE: 0.75,
    ThermalStatus.SEVERE: 0.5,
    ThermalStatus.CRITICAL: 0.25,
    ThermalStatus.EMERGENCY: 0.25,
    ThermalStatus.SHUTDOWN: 0.0,
}

#: Worst rank a holder may have and keep holding at each thermal status
#: (``None`` = no limit, ``-1`` = nobody). Ranks above it are asked to unload
#: (UnloadReason.THERMAL) and new requests above it wait.
DEFAULT_THERMAL_KEEP_RANK: dict[ThermalStatus, int | None] = {
    ThermalStatus.NONE: None,
    ThermalStatus.LIGHT: None,
    ThermalStatus.MODERATE: None,
    ThermalStatus.SEVERE: int(Importance.PERCEPTIBLE),
    ThermalStatus.CRITICAL: int(Importance.FOREGROUND_SERVICE),
    ThermalStatus.EMERGENCY: int(Importance.FOREGROUND),
    ThermalStatus.SHUTDOWN: -1,
}

#: Importance of uid 0 (root), fixed as AOSP fixes system uids.
ROOT_IMPORTANCE = int(Importance.FOREGROUND)


@dataclass(frozen=True)
class PolicySettings:
    """The active policy and its parameters (what ``npu status`` prints)."""

    policy: Policy = Policy.BUDGET
    max_budget: int = DEFAULT_MAX_BUDGET
    weights: Mapping[int, int] = field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    memory_budget_bytes: int = 0  # MEMORY: 0 = the drivers' reported memory

    @property
    def name(self) -> str:
        return self.policy.name.lower()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_budget": self.max_budget,
            "weights": {str(k): v for k, v in sorted(self.weights.items())},
            "memory_budget_bytes": self.memory_budget_bytes,
        }


def parse_policy(value: int | str) -> Policy:
    """A policy given as its number or its name (any case); InvalidArgument otherwise."""
    if isinstance(value, str):
        try:
            return Policy[value.strip().upper().replace("-", "_")]
        except KeyError:
            pass
        try:
            value = int(value)
        except ValueError:
            names = ", ".join(p.name for p in Policy)
            raise InvalidArgument(f"unknown policy {value!r}; use one of {names}") from None
    if isinstance(value, bool) or value not in {int(p) for p in Policy}:
        raise InvalidArgument(f"unknown policy {value!r}; use 0-{max(Policy)}")
    return Policy(value)


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidArgument(f"{name} must be a positive integer, got {value!r}")
    return value


def _size_key(key: object) -> int:
    try:
        size: int = int(key)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidArgument(f"unknown model size {key!r}; use 0, 1 or 2") from None
    if size not in {int(s) for s in ModelSize}:
        raise InvalidArgument(f"unknown model size {key!r}; use 0, 1 or 2")
    return size


def make_settings(
    policy: int | str,
    *,
    max_budget: int | None = None,
    weights: Mapping[Any, int] | None = None,
    memory_budget_bytes: int | None = None,
    defaults: PolicySettings | None = None,
) -> PolicySettings:
    """Validated settings; ``None`` keeps ``defaults`` (BUDGET 1/2/4 and 4).

    A weight or budget <= 0, an unknown size class or an unknown policy raise
    InvalidArgument. TURN_TAKING is BUDGET with every weight 1 and a budget of
    1 whatever was passed (AOSP); the values passed are still validated.
    """
    base = defaults or PolicySettings()
    pol = parse_policy(policy)
    budget = base.max_budget if max_budget is None else _positive("max budget", max_budget)
    merged = dict(base.weights)
    if weights is not None:
        for k, w in weights.items():
            merged[_size_key(k)] = _positive(f"weight of size {k}", w)
    mem = base.memory_budget_bytes if memory_budget_bytes is None else memory_budget_bytes
    if isinstance(mem, bool) or not isinstance(mem, int) or mem < 0:
        raise InvalidArgument(f"memory budget must be >= 0 bytes (0 = from drivers), got {mem!r}")
    if pol is Policy.TURN_TAKING:
        budget, merged = 1, {int(s): 1 for s in ModelSize}
    return PolicySettings(policy=pol, max_budget=budget, weights=merged, memory_budget_bytes=mem)


def declared_bytes(size: ModelSize, size_bytes: Mapping[int, int]) -> int:
    return size_bytes.get(int(size), DEFAULT_SIZE_BYTES[int(size)])


def charge(
    settings: PolicySettings, size: ModelSize, real_bytes: int, size_bytes: Mapping[int, int]
) -> int:
    """What one holder counts against the budget under ``settings``.

    MEMORY charges max(declared, real): a client that declared a small size
    class and prepared a large model is charged what it really holds.
    """
    if settings.policy is Policy.STATUS_QUO:
        return 1
    if settings.policy is Policy.MEMORY:
        return max(declared_bytes(size, size_bytes), real_bytes)
    return settings.weights.get(int(size), 1)


def base_budget(settings: PolicySettings, device_bytes: int,
                limits: DeviceLimits | None = None) -> int | None:
    """The unscaled budget of one device; ``None`` = unlimited."""
    if settings.policy is Policy.STATUS_QUO:
        return None
    if settings.policy is Policy.MEMORY:
        if limits is not None and limits.memory_budget_bytes is not None:
            return limits.memory_budget_bytes or device_bytes
        return settings.memory_budget_bytes or device_bytes
    if settings.policy is Policy.BUDGET and limits is not None and limits.max_budget is not None:
        return limits.max_budget
    return settings.max_budget


@dataclass(frozen=True)
class DeviceLimits:
    """One device's own ceilings (``[policy.devices."NAME"]``); ``None`` = the global one."""

    max_budget: int | None = None
    memory_budget_bytes: int | None = None  # 0 = the device's reported memory

    def as_dict(self) -> dict[str, int]:
        out: dict[str, int] = {}
        if self.max_budget is not None:
            out["max_budget"] = self.max_budget
        if self.memory_budget_bytes is not None:
            out["memory_budget_bytes"] = self.memory_budget_bytes
        return out


def parse_device_limits(table: Mapping[str, Any]) -> dict[str, DeviceLimits]:
    """``[policy.devices]``: device name -> {max_budget, memory_budget_bytes}."""
    out: dict[str, DeviceLimits] = {}
    for name, entry in dict(table).items():
        if not isinstance(entry, Mapping):
            raise InvalidArgument(f"[policy.devices] {name!r} must be a table")
        unknown = set(entry) - {"max_budget", "memory_budget_bytes"}
        if unknown:
            raise InvalidArgument(f"[policy.devices.{name!r}]: unknown key(s) {sorted(unknown)}; "
                                  "use max_budget or memory_budget_bytes")
        mem = entry.get("memory_budget_bytes")
        if mem is not None and (isinstance(mem, bool) or not isinstance(mem, int) or mem < 0):
            raise InvalidArgument(f"[policy.devices.{name!r}] memory_budget_bytes must be >= 0")
        mb = entry.get("max_budget")
        out[str(name)] = DeviceLimits(
            max_budget=None if mb is None else _positive(f"max budget of device {name}", mb),
            memory_budget_bytes=mem)
    return out


def scale_budget(budget: int | None, scale: float, *, in_bytes: bool) -> int | None:
    """The thermal governor's budget. A scaled integer budget keeps at least 1
    while the scale is positive, so TURN_TAKING still takes turns when warm."""
    if scale >= 1.0:
        return budget
    if scale <= 0.0:
        return 0
    if budget is None:
        return None
    if in_bytes:
        return int(budget * scale)
    return max(1, math.floor(budget * scale)) if budget > 0 else 0


def keep_rank(limits: Mapping[ThermalStatus, int | None], status: ThermalStatus) -> int | None:
    return limits.get(status, DEFAULT_THERMAL_KEEP_RANK[status])


def rank_allowed(rank: int, limit: int | None) -> bool:
    return limit is None or rank <= limit


@dataclass(frozen=True)
class ManagerParams:
    """Tunables of :class:`~npumanager.service.state.ManagerState`."""

    policy: PolicySettings = field(default_factory=PolicySettings)
    unload_deadline_s: float = 5.0
    #: How long an ended grant waits for its driver to apply the end (service/ending.py)
    #: before the driver is restarted as hung; 0: nobody waits (the end is fire and forget).
    grant_end_ack_s: float = 10.0
    #: After an npud restart: how long grants a driver still holds wait for their client.
    adopt_grace_s: float = 5.0
    max_queue_wait_s: float = 0.0  # 0 = none
    decision_log_size: int = 10000
    max_requests_per_uid: int = 256
    default_importance: int = int(Importance.GONE)
    size_bytes: Mapping[int, int] = field(default_factory=lambda: dict(DEFAULT_SIZE_BYTES))
    thermal_budget_scale: Mapping[ThermalStatus, float] = field(
        default_factory=lambda: dict(DEFAULT_THERMAL_SCALE)
    )
    thermal_keep_rank: Mapping[ThermalStatus, int | None] = field(
        default_factory=lambda: dict(DEFAULT_THERMAL_KEEP_RANK)
    )
    #: From this status on, new OPPORTUNISTIC requests wait (queued).
    opportunistic_wait_from: ThermalStatus = ThermalStatus.MODERATE
    #: Per-device ceilings by device name (``[policy.devices]``).
    device_limits: Mapping[str, DeviceLimits] = field(default_factory=dict)
    #: The configured drivers, in order: each stands for its first device until it reports
    #: its devices (so a request before that goes to the right budget). Empty: one
    #: anonymous device that the first driver to come up adopts (a pure manager, tests).
    drivers: tuple[str, ...] = ()

    # Convenience accessors named as the brief names them.
    @property
    def max_budget(self) -> int:
        return self.policy.max_budget

    @property
    def weights(self) -> Mapping[int, int]:
        return self.policy.weights

    @property
    def memory_budget_bytes(self) -> int:
        return self.policy.memory_budget_bytes

    def with_policy(self, policy: int | str, **kw: Any) -> ManagerParams:
        return replace(self, policy=make_settings(policy, defaults=self.policy, **kw))

    @classmethod
    def from_config(cls, cfg: Config) -> ManagerParams:
        """Read ``[manager]`` and ``[policy]`` (see defaults.toml); InvalidArgument if bad."""
        man = cfg.section("manager")
        pol = cfg.section("policy")
        settings = make_settings(
            pol.get("name", "BUDGET"),
            max_budget=pol.get("max_budget", DEFAULT_MAX_BUDGET),
            weights=pol.get("weights", DEFAULT_WEIGHTS),
            memory_budget_bytes=pol.get("memory_budget_bytes", 0),
            defaults=PolicySettings(),
        )
        size_bytes = dict(DEFAULT_SIZE_BYTES)
        for k, v in dict(pol.get("size_bytes", {})).items():
            size_bytes[_size_key(k)] = _positive(f"size_bytes[{k}]", v)
        scale = dict(DEFAULT_THERMAL_SCALE)
        for k, v in dict(pol.get("thermal_budget_scale", {})).items():
            st = _status_key(k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
                raise InvalidArgument(f"thermal_budget_scale.{k} must be within 0..1, got {v!r}")
            scale[st] = float(v)
        keep = dict(DEFAULT_THERMAL_KEEP_RANK)
        for k, v in dict(pol.get("thermal_keep_rank", {})).items():
            st = _status_key(k)
            if isinstance(v, bool) or not isinstance(v, int) or v < -1:
                raise InvalidArgument(f"thermal_keep_rank.{k} must be an integer >= -1, got {v!r}")
            # -2 is not offered; "no limit" is written as a large number in TOML.
            keep[st] = None if v >= 1_000_000 else v
        opp = pol.get("opportunistic_wait_from", "moderate")
        deadline = float(man.get("unload_deadline_s", 5.0))
        max_wait = float(man.get("max_queue_wait_s", 0.0))
        if deadline <= 0 or max_wait < 0:
            raise InvalidArgument("unload_deadline_s must be > 0 and max_queue_wait_s >= 0")
        return cls(
            policy=settings,
            unload_deadline_s=deadline,
            grant_end_ack_s=_non_negative_float("grant_end_ack_s",
                                                man.get("grant_end_ack_s", 10.0)),
            adopt_grace_s=_positive_float("adopt_grace_s", man.get("adopt_grace_s", 5.0)),
            max_queue_wait_s=max_wait,
            decision_log_size=_positive("decision_log_size", man.get("decision_log_size", 10000)),
            max_requests_per_uid=_positive(
                "max_requests_per_uid", man.get("max_requests_per_uid", 256)
            ),
            default_importance=int(pol.get("default_importance", int(Importance.GONE))),
            size_bytes=size_bytes,
            thermal_budget_scale=scale,
            thermal_keep_rank=keep,
            opportunistic_wait_from=_status_key(opp),
            device_limits=parse_device_limits(pol.get("devices", {})),
        )


def _positive_float(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
        raise InvalidArgument(f"{name} must be a number > 0, got {v!r}")
    return float(v)


def _non_negative_float(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0:
        raise InvalidArgument(f"{name} must be a number >= 0, got {v!r}")
    return float(v)


def _status_key(key: object) -> ThermalStatus:
    try:
        if isinstance(key, str) and not key.strip().isdigit():
            return ThermalStatus[key.strip().upper()]
        return ThermalStatus(int(key))  # type: ignore[call-overload]
    except (KeyError, ValueError, TypeError):
        raise InvalidArgument(f"unknown thermal status {key!r}") from None
