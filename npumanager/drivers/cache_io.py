"""Reading and writing the cache files a client handed the driver as fds.

The fds come from the app (over SCM_RIGHTS) and point at files the app can
change at any time, at any offset, with any size. So:

- writes truncate first and ``pwrite`` from offset 0 (the fd offset is
  irrelevant), then ``fsync``; a failure raises GeneralFailure, which callers
  swallow (a failed save never changes a prepare result);
- reads take each file ONCE fully into memory with ``pread`` from offset 0; the
  caller verifies and deserializes those same buffers and never looks at the
  file again (no TOCTOU window);
- a write-only or unreadable fd is an InvalidArgument, too much data a
  GeneralFailure.

Cooperating writers (the driver's own saves and its multi-stage rewrites) lock
all files of an entry in a fixed order: exclusive to write, shared to read, so
no reader sees a half-written entry and no two writers interleave. Across
processes that is ``flock`` (it belongs to the open file description, so it
also separates two prepares of one process with their own opened files, unlike
POSIX record locks); inside the process an inode-keyed readers-writer lock
covers holders of the same open file description (dup'd fds). Lock waits are
bounded: an app that holds a lock on its own files only makes its own cache
miss.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from npumanager.errors import GeneralFailure, InvalidArgument

#: Default bound on how long a lock over an entry's files is waited for.
LOCK_TIMEOUT_S = 2.0

_CHUNK = 1 << 30  # pread/pwrite move at most ~2 GiB per call on Linux


def _check_fd(fd: int, *, need_read: bool) -> None:
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        st = os.fstat(fd)
    except (OSError, TypeError, ValueError) as exc:
        raise InvalidArgument(f"cache fd {fd!r} is not usable: {exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise InvalidArgument(f"cache fd {fd} is not a regular file")
    mode = flags & os.O_ACCMODE
    if need_read and mode == os.O_WRONLY:
        raise InvalidArgument(f"cache fd {fd} is write-only")
    if not need_read and mode == os.O_RDONLY:
        raise InvalidArgument(f"cache fd {fd} is read-only")


def check_fds(fds: Sequence[int], *, need_read: bool) -> None:
    """InvalidArgument unless every fd is an open regular file readable (or writable)."""
    for fd in fds:
        _check_fd(fd, need_read=need_read)


class _InodeLock:
    """A readers-writer lock for one file inside this process (see :func:`locked`)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.readers = 0
        self.writer = False
        self.users = 0  # registry refcount, guarded by _REGISTRY_LOCK

    def acquire(self, exclusive: bool, deadline: float) -> bool:
        with self.cond:
            while self.writer or (exclusive and self.readers):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.cond.wait(remaining)
            if exclusive:
                self.writer = True
            else:
                self.readers += 1
            return True

    def release(self, exclusive: bool) -> None:
        with self.cond:
            if exclusive:
                self.writer = False
            else:
                self.readers -= 1
            self.cond.notify_all()


_REGISTRY_LOCK = threading.Lock()
_REGISTRY: dict[tuple[int, int], _InodeLock] = {}


def _inode_lock(key: tuple[int, int]) -> _InodeLock:
    with _REGISTRY_LOCK:
        lock = _REGISTRY.get(key)
        if lock is None:
            lock = _REGISTRY[key] = _InodeLock()
        lock.users += 1
        return lock


def _drop_inode_lock(key: tuple[int, int], lock: _InodeLock) -> None:
    with _REGISTRY_LOCK:
        lock.users -= 1
        if lock.users == 0 and _REGISTRY.get(key) is lock:
            del _REGISTRY[key]


@contextmanager
def locked(
    fds: Sequence[int], *, exclusive: bool, timeout_s: float = LOCK_TIMEOUT_S
) -> Iterator[None]:
    """Hold the entry's locks for the block: exclusive to write, shared to read.

    Two layers, both taken per file in (device, inode) order so every
    participant locks in the same order: an in-process readers-writer lock
    (``flock`` cannot exclude holders of the same open file description, which
    dup'd fds share) and ``flock`` for other processes. A file passed twice is
    locked once. Raises GeneralFailure if the locks are not all had within
    ``timeout_s`` (what was taken is released).
    """
    op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    deadline = time.monotonic() + timeout_s
    by_inode: dict[tuple[int, int], int] = {}
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError as exc:
            raise GeneralFailure(f"cannot lock cache fd {fd}: {exc}") from exc
        by_inode.setdefault((st.st_dev, st.st_ino), fd)
    held: list[tuple[tuple[int, int], _InodeLock, int | None]] = []
    try:
        for key in sorted(by_inode):
            fd = by_inode[key]
            ilock = _inode_lock(key)
            if not ilock.acquire(exclusive, deadline):
                _drop_inode_lock(key, ilock)
                raise GeneralFailure("timed out waiting for a cache file lock")
            held.append((key, ilock, None))
            delay = 0.001
            while True:
                try:
                    fcntl.flock(fd, op | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise GeneralFailure("timed out waiting for a cache file lock") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.005)
                except OSError as exc:
                    raise GeneralFailure(f"cannot lock cache fd {fd}: {exc}") from exc
            held[-1] = (key, ilock, fd)
        yield
    finally:
        for key, ilock, locked_fd in reversed(held):
            if locked_fd is not None:
                try:
                    fcntl.flock(locked_fd, fcntl.LOCK_UN)
                except OSError:
                    pass
            ilock.release(exclusive)
            _drop_inode_lock(key, ilock)


def _write_one(fd: int, blob: bytes | bytearray | memoryview) -> None:
    view = memoryview(blob).cast("B")
    os.ftruncate(fd, 0)
    off = 0
    while off < len(view):
        n = os.pwrite(fd, view[off : off + _CHUNK], off)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        off += n
    os.fsync(fd)


def write_cache_files(
    fds: Sequence[int],
    blobs: Sequence[bytes | bytearray | memoryview],
    *,
    lock: bool = True,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> None:
    """Replace each file's content with its blob (truncate, pwrite from 0, fsync).

    ``lock=False`` when the caller already holds the exclusive lock (see
    :func:`locked`). Raises GeneralFailure on any error (callers ignore it).
    """
    if len(fds) != len(blobs):
        raise GeneralFailure(f"{len(blobs)} cache blobs for {len(fds)} cache files")
    try:
        for fd in fds:
            _check_fd(fd, need_read=False)
    except InvalidArgument as exc:
        raise GeneralFailure(str(exc)) from exc
    try:
        if lock:
            with locked(fds, exclusive=True, timeout_s=lock_timeout_s):
                for fd, blob in zip(fds, blobs, strict=True):
                    _write_one(fd, blob)
        else:
            for fd, blob in zip(fds, blobs, strict=True):
                _write_one(fd, blob)
    except OSError as exc:
        raise GeneralFailure(f"cannot write cache file: {exc}") from exc


def _read_one(fd: int, budget: int) -> bytes:
    """All of the file from offset 0; GeneralFailure past ``budget`` bytes."""
    size = os.fstat(fd).st_size
    if size > budget:
        raise GeneralFailure(f"cache file of {size} bytes exceeds the {budget}-byte bound")
    chunks: list[bytes] = []
    off = 0
    # Ask for one byte more than the size so a file that grew is noticed.
    want = size + 1
    while True:
        data = os.pread(fd, min(want, _CHUNK), off)
        if not data:
            break
        chunks.append(data)
        off += len(data)
        if off > budget:
            raise GeneralFailure(f"cache file grew past the {budget}-byte bound while read")
        want = max(want - len(data), 1 << 16)
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


def read_cache_files(
    fds: Sequence[int],
    max_bytes: int,
    *,
    lock: bool = True,
    lock_timeout_s: float = LOCK_TIMEOUT_S,
) -> list[bytes]:
    """Each file's full content, read once from offset 0 whatever the fd offset.

    ``max_bytes`` bounds the total over all files (GeneralFailure past it). A
    write-only, closed or non-regular fd raises InvalidArgument.
    """
    for fd in fds:
        _check_fd(fd, need_read=True)
    out: list[bytes] = []
    budget = max_bytes
    try:
        if lock:
            with locked(fds, exclusive=False, timeout_s=lock_timeout_s):
                for fd in fds:
                    out.append(_read_one(fd, budget))
                    budget -= len(out[-1])
        else:
            for fd in fds:
                out.append(_read_one(fd, budget))
                budget -= len(out[-1])
    except OSError as exc:
        raise InvalidArgument(f"cannot read cache file: {exc}") from exc
    return out


def dup_fds(fds: Sequence[int]) -> list[int]:
    """Close-on-exec duplicates of ``fds`` for later rewrites (all or none)."""
    out: list[int] = []
    try:
        for fd in fds:
            out.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 0))
    except OSError as exc:
        for d in out:
            os.close(d)
        raise GeneralFailure(f"cannot duplicate cache fd: {exc}") from exc
    return out


__all__ = [
    "LOCK_TIMEOUT_S",
    "check_fds",
    "dup_fds",
    "locked",
    "read_cache_files",
    "write_cache_files",
]
