"""The exception tree of npumanager.

Errors are grouped by who is at fault, as httpcore and NNAPI's ErrorStatus do:
the caller (a bad argument, a missing permission), the device (transient or
persistent), or the service itself. Every error that crosses the wire is sent
by its class name and comes out on the other side as the same class
(:func:`error_from_wire`).
"""

from __future__ import annotations


class NpuError(Exception):
    """Root of every npumanager error."""

    #: Whether retrying the same call later may succeed.
    transient: bool = False


# --- the caller is at fault -------------------------------------------------


class CallerError(NpuError):
    """The caller asked for something it may not or cannot have."""


class InvalidArgument(CallerError, ValueError):
    """A malformed argument: bad weights, budget, policy, token or reused id."""


class IllegalArgument(InvalidArgument):
    """A HAL call with invalid scheduling configs (EX_ILLEGAL_ARGUMENT); nothing changed."""


class PermissionDenied(CallerError, PermissionError):
    """The caller's uid may not do this (admin-only call, another uid's request)."""


class UnknownRequest(CallerError, KeyError):
    """The request id is not known for this caller."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want prose.
        return str(self.args[0]) if self.args else "unknown request"


class GrantRequired(CallerError):
    """Enforced admission: the driver refuses to prepare a model without a live grant."""


class GrantMoved(GrantRequired):
    """The grant moved to its device's other host (its app's class changed since npud
    granted it: service/grant_moves.py): prepare there. ``nn``'s prepare_model does."""


class GrantRevoked(CallerError):
    """The grant this model was bound to was revoked by npud; the model is released."""


class DirectAccessDenied(CallerError):
    """The uid has no direct access to the device (SchedulingConfig.has_direct_access)."""


class AttributionDenied(CallerError):
    """The uid may not attribute work to another uid."""


class LimitExceeded(CallerError):
    """A per-uid bound (connections, pending requests, queue length) was reached."""

    transient = True


# --- the device is at fault -------------------------------------------------


class DeviceError(NpuError):
    """The device or its driver failed."""


class DeviceUnavailable(DeviceError):
    """The driver is down or restarting; try again later."""

    transient = True


class NoManagerAttached(DeviceUnavailable):
    """The driver's manager (npud) went away: it loads nothing new until one attaches again;
    models already loaded keep running for a grace period."""


class GeneralFailure(DeviceError):
    """The driver could not do it (NNAPI GENERAL_FAILURE), e.g. a modified cache."""


class ExecutionFailed(GeneralFailure):
    """The backend raised while executing; the message carries its error."""


class DriverRefused(DeviceError):
    """A driver plugin does not implement the HAL npud speaks; it is not started."""


class WorkCancelled(DeviceError):
    """The work was cancelled (by the client, or by the system when preempted)."""


# --- the service / transport -------------------------------------------------


class ServiceError(NpuError):
    """npud or the transport failed."""


class ServiceUnavailable(ServiceError):
    """No daemon is listening, or the connection to it was lost."""

    transient = True


class ProtocolError(ServiceError):
    """A malformed frame, an unknown method or an incompatible protocol version."""


class FrameTooLarge(ProtocolError):
    """A frame exceeded the negotiated size bound."""


class RequestEnded(ServiceError):
    """A model load request ended (CANCELLED, REVOKED, ...) before what the caller awaited.

    Raised by ``AsyncNpuManager.reserve()`` when the request ends before it is granted."""

    def __init__(self, message: str = "", status: object = None) -> None:
        super().__init__(message)
        #: The RequestStatus the request ended with, when known.
        self.status = status


class UnsafePath(ServiceError):
    """A runtime or state directory is not safe to serve from (a symlink, owned by another
    uid, or writable by others); the message names the path and what is wrong."""


class RealtimeUnavailable(ServiceError):
    """npud grants no real-time thread here: the feature is off in its config
    (``[manager] app_rt_priority = 0``) or the kernel refused (no CAP_SYS_NICE). The SDK
    goes on without real-time priority."""


class InternalError(ServiceError):
    """A bug on the service side; the daemon logged it and kept serving."""


def _all_subclasses(cls: type[NpuError]) -> list[type[NpuError]]:
    out: list[type[NpuError]] = [cls]
    for sub in cls.__subclasses__():
        out.extend(_all_subclasses(sub))
    return out


_BY_NAME: dict[str, type[NpuError]] = {c.__name__: c for c in _all_subclasses(NpuError)}


def error_to_wire(exc: BaseException) -> tuple[str, str]:
    """The (type name, message) pair that represents ``exc`` on the wire."""
    if isinstance(exc, NpuError):
        return type(exc).__name__, str(exc)
    return "InternalError", f"{type(exc).__name__}: {exc}"


def error_from_wire(type_name: str, message: str) -> NpuError:
    """Rebuild the exception a peer sent; an unknown name becomes ProtocolError."""
    cls = _BY_NAME.get(type_name)
    if cls is None:
        return ProtocolError(f"peer sent unknown error type {type_name!r}: {message}")
    return cls(message)


__all__ = [name for name in _BY_NAME] + ["error_from_wire", "error_to_wire"]
