"""Tensors on the device socket: inline bytes, or views at offsets in a mapped pool.

Both ends use these codecs (the client in :mod:`npumanager.nn`, the driver host
in :mod:`npumanager.drivers`). Every dtype, shape and offset a peer names is
checked: only numeric dtypes, no negative dimensions, bytes inside the pool.
"""

from __future__ import annotations

import functools
import math
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

from npumanager.errors import InvalidArgument
from npumanager.proto.v1 import driver_pb2 as pb

ALIGN = 64
_ALLOWED_KINDS = set("biuf")  # bool, signed, unsigned, float: no object/str dtypes


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
