"""Wait for files another process writes without polling: Linux inotify through libc.

A test that waits for a real process to write a file (a cache entry rewritten in
the background, say) blocks on the kernel's notification for the directory and
re-checks its condition after each one, instead of sleeping in a loop.
"""

from __future__ import annotations

import ctypes
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

# <sys/inotify.h>
IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
_CHANGES = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE


class DirectoryWatch:
    """Changes to files in ``directory`` (written, closed, renamed into it, created).

    Open it before the action that changes the directory, so no change is missed."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        if libc.inotify_add_watch(fd, os.fsencode(Path(directory)), _CHANGES) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {directory} failed")
        self.fd = fd

    def wait_until(self, cond: Callable[[], object], timeout: float) -> bool:
        """True once ``cond()`` holds, checked now and after every change the kernel
        reports; False if ``timeout`` seconds pass first."""
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    while os.read(self.fd, 65536):
                        pass
                except BlockingIOError:
                    pass
        return True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
