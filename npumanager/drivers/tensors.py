"""Tensors on the device socket: inline bytes, or offsets into a shared-memory pool.

Both ends use these codecs. A pool is a sealed memfd (it can neither shrink
nor grow, so the driver's mapping can never fault with SIGBUS however the
client misbehaves); the client registers it once and then only
(pool, offset, nbytes) travel. Every offset a client names is bounds-checked.
"""

from __future__ import annotations

import fcntl
import functools
import math
import mmap
import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from npumanager.errors import InvalidArgument
from npumanager.proto.v1 import driver_pb2 as pb

#: Tensors above this many bytes go through a pool when the client has one.
DEFAULT_INLINE_LIMIT = 64 * 1024
ALIGN = 64
_ALLOWED_KINDS = set("biuf")  # bool, signed, unsigned, float: no object/str dtypes
_REQUIRED_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


_NAMES: dict[np.dtype[np.generic], str] = {}


def dtype_name(dt: np.dtype[np.generic]) -> str:
    """``dt.name``, memoized (numpy computes the name on every access: ~5 µs)."""
    name = _NAMES.get(dt)
    if name is None:
        name = _NAMES[dt] = dt.name
    return name


@functools.lru_cache(maxsize=64)
def check_dtype(dtype: str) -> np.dtype[np.generic]:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(f"unknown tensor dtype {dtype!r}") from None
    if dt.kind not in _ALLOWED_KINDS:
        raise InvalidArgument(f"tensor dtype {dtype!r} is not a numeric type")
    return dt


def _count(shape: Sequence[int]) -> int:
    if shape and min(shape) < 0:
        raise InvalidArgument(f"tensor shape {tuple(shape)} has a negative dimension")
    return math.prod(shape)


def inline_msg(name: str, arr: np.ndarray) -> pb.Tensor:
    arr = np.ascontiguousarray(arr)
    return pb.Tensor(name=name, dtype=dtype_name(arr.dtype), shape=arr.shape, data=arr.tobytes(),
                     nbytes=arr.nbytes)


def add_inline(into: Any, name: str, arr: np.ndarray) -> None:
    """Add ``arr`` as an inline tensor to the repeated field ``into`` (``msg.inputs`` or
    ``msg.outputs``): built in place, where appending a ready Tensor would copy it and its
    bytes once more (a copy per tensor that costs ~10 µs at 64 KiB)."""
    arr = np.ascontiguousarray(arr)
    into.add(name=name, dtype=dtype_name(arr.dtype), shape=arr.shape, data=arr.tobytes(),
             nbytes=arr.nbytes)


def inline_array(msg: pb.Tensor) -> np.ndarray:
    dt = check_dtype(msg.dtype)
    shape = tuple(msg.shape)
    data = msg.data  # each access copies the bytes out of the message: once only
    if _count(shape) * dt.itemsize != len(data):
        raise InvalidArgument(
            f"tensor {msg.name!r}: {len(data)} bytes do not hold {shape} {dt.name}"
        )
    return np.frombuffer(data, dtype=dt).reshape(shape)


def view_in(buf: mmap.mmap, offset: int, nbytes: int, dtype: str,
            shape: Sequence[int], what: str) -> np.ndarray:
    """A numpy view of ``nbytes`` at ``offset`` in a mapped pool (bounds-checked)."""
    dt = check_dtype(dtype)
    n = _count(shape)
    if n * dt.itemsize != nbytes:
        raise InvalidArgument(f"{what}: {nbytes} bytes do not hold {tuple(shape)} {dt.name}")
    if offset < 0 or offset + nbytes > len(buf):
        raise InvalidArgument(f"{what}: bytes {offset}..{offset + nbytes} lie outside the pool "
                              f"of {len(buf)} bytes")
    return np.frombuffer(buf, dtype=dt, count=n, offset=offset).reshape(tuple(shape))


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
