"""Shared-memory pools: sealed memfds a client registers once with the driver.

A pool can neither shrink nor grow (F_SEAL_SHRINK | F_SEAL_GROW), so the
driver's mapping can never fault with SIGBUS however the client misbehaves;
after registration only (pool, offset, nbytes) travel.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import weakref

from npumanager.errors import InvalidArgument

_REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class MappedPool:
    """The driver's mapping of a client's sealed memfd pool."""

    def __init__(self, fd: int, size: int) -> None:
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            raise InvalidArgument("a pool must be a memfd created with sealing allowed") from None
        if seals & _REQUIRED_SEALS != _REQUIRED_SEALS:
            raise InvalidArgument("a pool memfd must be sealed against shrinking and growing")
        actual = os.fstat(fd).st_size
        if size <= 0 or actual < size:
            raise InvalidArgument(f"pool claims {size} bytes but the memfd holds {actual}")
        self.size = size
        self.buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:
            # A numpy view still exists (a running step); the GC unmaps it later.
            pass


class ClientPool:
    """The client's pool: a sealed memfd it writes inputs to and reads outputs from."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = os.memfd_create("npu-pool", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _REQUIRED_SEALS)
            self.buf = mmap.mmap(self.fd, size, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.pool_id = 0
        # A pool nobody closed still gives its fd back when it is collected.
        self._close_fd = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        try:
            self.buf.close()
        except BufferError:
            pass  # a view is still out there; the mapping goes with the last one
        if self.fd >= 0:
            self._close_fd()
            self.fd = -1
