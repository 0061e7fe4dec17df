"""Tensors on the device socket: inline bytes, or views at offsets in a mapped pool.

Both ends use these codecs (the client in :mod:`npumanager.nn`, the driver host
in :mod:`npumanager.drivers`). Every dtype, shape and offset a peer names is
checked: only ONNX element types (:mod:`.dtypes`), no negative dimensions,
bytes inside the pool. Shapes cross exactly: a 0-d tensor stays 0-d (numpy's
``ascontiguousarray`` would make it 1-d, so it is only called on arrays that
are not contiguous already). String tensors always travel inline, as their
elements.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np

from npumanager.errors import InvalidArgument
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio.dtypes import check_dtype, dtype_name, is_numeric

ALIGN = 64
_STRING_KINDS = "OUS"
_NUMPY_NUMERIC = "biufc"  # (ml_dtypes' types are kind "V": checked by name)

__all__ = ["ALIGN", "add_inline", "align", "check_dtype", "contiguous", "dtype_name",
           "fill_inline", "inline_array", "inline_msg", "view_in"]


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def contiguous(arr: Any) -> np.ndarray:
    """``arr`` as a C-contiguous ndarray with its shape kept (0-d stays 0-d)."""
    if type(arr) is not np.ndarray:
        arr = np.asarray(arr)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _count(shape: Sequence[int]) -> int:
    if shape and min(shape) < 0:
        raise InvalidArgument(f"tensor shape {tuple(shape)} has a negative dimension")
    return math.prod(shape)


# --- strings ---------------------------------------------------------------------------


def _string_elements(name: str, arr: np.ndarray) -> tuple[list[bytes], bool]:
    """The elements of a string tensor as bytes, and whether they were bytes objects."""
    flat = arr.reshape(-1).tolist()
    kind = arr.dtype.kind
    try:
        if kind == "U":
            return [s.encode() for s in flat], False
        if kind == "S":
            return flat, False
        if all(type(s) is str for s in flat):
            return [s.encode() for s in flat], False
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"tensor {name!r}: a string is not valid UTF-8: {exc}") from None
    if all(type(s) is bytes for s in flat):
        return flat, True
    kinds = sorted({type(s).__name__ for s in flat})
    raise InvalidArgument(f"tensor {name!r}: an object array must hold only str or only bytes "
                          f"(ONNX strings), not {', '.join(kinds)}")


def _strings_array(msg: pb.Tensor, dt: np.dtype[np.generic], shape: tuple[int, ...]
                   ) -> np.ndarray:
    n = _count(shape)
    raw = list(msg.strings)
    if len(raw) != n or msg.data:
        raise InvalidArgument(f"tensor {msg.name!r}: {len(raw)} strings do not fill {shape}")
    if dt.kind in "US" and dt.itemsize * n > 64 * (sum(map(len, raw)) + n) + (1 << 20):
        raise InvalidArgument(f"tensor {msg.name!r}: dtype {dt.str} is wider than its strings")
    try:
        if dt.kind == "S" or (dt.kind == "O" and msg.bytes_elements):
            elements: list[Any] = raw
        else:
            elements = [b.decode() for b in raw]
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"tensor {msg.name!r}: a string is not valid UTF-8: {exc}"
                              ) from None
    if dt.kind == "O":
        arr = np.empty(n, dtype=object)
        arr[:] = elements
    else:
        arr = np.array(elements, dtype=dt) if n else np.empty(0, dtype=dt)
    return arr.reshape(shape)


# --- inline tensors ----------------------------------------------------------------------


def fill_inline(msg: pb.Tensor, arr: np.ndarray) -> None:
    """Set the payload of ``msg`` (name, dtype and shape already set) to ``arr``'s."""
    if arr.dtype.kind in _STRING_KINDS:
        strings, as_bytes = _string_elements(msg.name, arr)
        msg.strings.extend(strings)
        msg.bytes_elements = as_bytes
    else:
        msg.data = arr.tobytes()
        msg.nbytes = arr.nbytes


def inline_msg(name: str, arr: np.ndarray) -> pb.Tensor:
    arr = contiguous(arr)
    msg = pb.Tensor(name=name, dtype=dtype_name(arr.dtype), shape=arr.shape)
    fill_inline(msg, arr)
    return msg


def add_inline(into: Any, name: str, arr: np.ndarray) -> None:
    """Add ``arr`` (contiguous) as an inline tensor to the repeated field ``into``
    (``msg.inputs`` or ``msg.outputs``): built in place, where appending a ready Tensor
    would copy it and its bytes once more (a copy per tensor that costs ~10 µs at 64 KiB)."""
    if arr.dtype.kind in _STRING_KINDS:
        fill_inline(into.add(name=name, dtype=dtype_name(arr.dtype), shape=arr.shape), arr)
        return
    into.add(name=name, dtype=dtype_name(arr.dtype), shape=arr.shape, data=arr.tobytes(),
             nbytes=arr.nbytes)


def inline_array(msg: pb.Tensor) -> np.ndarray:
    """The tensor an inline message holds (read-only for numeric dtypes: a view of the
    message's bytes)."""
    dt = check_dtype(msg.dtype)
    shape = tuple(msg.shape)
    kind = dt.kind
    if kind not in _NUMPY_NUMERIC:
        if kind in _STRING_KINDS:
            return _strings_array(msg, dt, shape)
        if not is_numeric(dt):
            raise InvalidArgument(f"tensor {msg.name!r}: dtype {msg.dtype!r} is not an ONNX "
                                  "type")
    data = msg.data  # each access copies the bytes out of the message: once only
    if _count(shape) * dt.itemsize != len(data) or msg.strings:
        raise InvalidArgument(
            f"tensor {msg.name!r}: {len(data)} bytes do not hold {shape} {dt.name}"
        )
    return np.frombuffer(data, dtype=dt).reshape(shape)


def view_in(buf: mmap.mmap, offset: int, nbytes: int, dtype: str,
            shape: Sequence[int], what: str) -> np.ndarray:
    """A numpy view of ``nbytes`` at ``offset`` in a mapped pool (bounds-checked)."""
    dt = check_dtype(dtype)
    if dt.kind not in _NUMPY_NUMERIC and not is_numeric(dt):
        raise InvalidArgument(f"{what}: {dt} tensors travel inline, never in shared memory")
    n = _count(shape)
    if n * dt.itemsize != nbytes:
        raise InvalidArgument(f"{what}: {nbytes} bytes do not hold {tuple(shape)} {dt.name}")
    if offset < 0 or offset + nbytes > len(buf):
        raise InvalidArgument(f"{what}: bytes {offset}..{offset + nbytes} lie outside the pool "
                              f"of {len(buf)} bytes")
    return np.frombuffer(buf, dtype=dt, count=n, offset=offset).reshape(tuple(shape))
