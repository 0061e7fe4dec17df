"""File descriptor helpers shared by every layer that receives fds (SCM_RIGHTS)."""

from __future__ import annotations

import os
from collections.abc import Iterable


def close_fds(fds: Iterable[int]) -> None:
    """Close every fd, ignoring ones already closed."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
