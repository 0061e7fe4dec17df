"""The execution class rule, shared by the driver and npud: which class (FOREGROUND or
BACKGROUND) a uid's work runs in, from its SchedulingConfig and the driver's
``foreground_priority`` ([[driver]] key).

Why here and not in the driver alone: npud routes a grant on a device with a background
lane (service/host_lanes.grant_target) by the class the driver will run the model in, so
the two must agree on one rule; npud may not import the driver (pyproject's layers)."""

from __future__ import annotations

from enum import Enum

from npumanager.hal.types import SchedulingConfig


class ExecClass(Enum):
    FOREGROUND = "foreground"
    BACKGROUND = "background"


#: Effective priority at or below which work is foreground by default: VISIBLE (200)
#: with job priority 0. A camera (FOREGROUND 100) and a voice assistant (VISIBLE 200)
#: are foreground; services (300) and anything with a background job priority are not.
DEFAULT_FOREGROUND_PRIORITY = 200


def exec_class(effective_priority: int, foreground_priority: int) -> ExecClass:
    """The class a job runs in (lower effective priority = more important)."""
    if effective_priority <= foreground_priority:
        return ExecClass.FOREGROUND
    return ExecClass.BACKGROUND


def model_class(config: SchedulingConfig, foreground_priority: int) -> ExecClass:
    """The class of a model ``config``'s uid prepares (its compile, its session's threads):
    its app priority with job priority 0, clamped into its range."""
    return exec_class(config.app_priority + config.clamp(0), foreground_priority)


__all__ = ["DEFAULT_FOREGROUND_PRIORITY", "ExecClass", "exec_class", "model_class"]
