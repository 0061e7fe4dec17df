"""`npu chaos --duration S [--apps N] [--seed S]`: see :mod:`npumanager.testing.chaos`."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    from npumanager.testing.chaos import register as register_chaos

    register_chaos(sub)
