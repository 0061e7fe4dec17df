"""Values between numpy and OpenVINO for the element types numpy lacks.

ONNX's bfloat16, float8, float4 and int4 values arrive as ``ml_dtypes`` arrays
(:mod:`npumanager.tensorio.dtypes`). OpenVINO's Python API maps numpy dtypes
to its element types itself and has none of these: it takes a float8 array as
``u8`` (and refuses it for an ``f8e4m3`` input, or converts its bit patterns
as integers when it has to copy), and it hands its ``bf16``, ``f8*`` and
4-bit outputs back as float16, uint8 or int8 arrays of raw bits (the 4-bit
ones packed two to a byte). So those values go in as :class:`ov.Tensor` of
the exact element type over the same bytes (the 4-bit ones packed, low nibble
first, as ONNX and OpenVINO both pack them), and come out reread as the
``ml_dtypes`` type. Every other dtype passes through untouched, so plain
float tensors keep their zero-copy path.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from npumanager.tensorio import check_dtype, contiguous, dtype_name

#: ml_dtypes names -> OpenVINO element type names, for the types both have.
ML_TO_OV = {
    "bfloat16": "bf16",
    "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
    "float8_e8m0fnu": "f8e8m0",
    "uint4": "u4",
    "int4": "i4",
    "float4_e2m1fn": "f4e2m1",
}
OV_TO_ML = {v: k for k, v in ML_TO_OV.items()}
_PACKED = frozenset({"u4", "i4", "f4e2m1"})


def _pack(arr: np.ndarray) -> np.ndarray:
    """One 4-bit element a byte (ml_dtypes) -> two a byte, low nibble first."""
    nibbles = arr.reshape(-1).view(np.uint8) & 0xF
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    packed: np.ndarray = nibbles[0::2] | (nibbles[1::2] << 4)
    return packed


def _unpack(raw: np.ndarray, count: int, ov_type: str) -> np.ndarray:
    import ml_dtypes

    b = raw.reshape(-1).view(np.uint8)
    nibbles = np.empty(b.size * 2, np.uint8)
    nibbles[0::2] = b & 0xF
    nibbles[1::2] = b >> 4
    nibbles = nibbles[:count]
    if ov_type == "i4":
        return ((nibbles.astype(np.int8) ^ 8) - 8).astype(ml_dtypes.int4)
    if ov_type == "u4":
        return nibbles.astype(ml_dtypes.uint4)
    return nibbles.view(ml_dtypes.float4_e2m1fn)


def to_ov(arr: Any) -> Any:
    """An input as OpenVINO takes it: ``arr`` itself (contiguous, shape kept) for numpy's
    dtypes, a typed ``ov.Tensor`` for ml_dtypes'."""
    arr = contiguous(arr)
    ov_type = ML_TO_OV.get(dtype_name(arr.dtype))
    if ov_type is None:
        if arr.ndim == 0 and not arr.flags.writeable:
            arr = arr.copy()  # (OpenVINO's scalar path insists on a writeable array)
        return arr
    import openvino as ov

    if ov_type in _PACKED:
        raw = _pack(arr)
    else:
        raw = arr.reshape(-1).view(np.uint16 if arr.dtype.itemsize == 2 else np.uint8)
        if not raw.flags.writeable:
            raw = raw.copy()  # an inline input: OpenVINO shares only writeable memory
    return ov.Tensor(raw, ov.Shape(list(arr.shape)), getattr(ov.Type, ov_type))


def from_ov(tensor: Any, dtype: str) -> np.ndarray:
    """An output tensor as a numpy array of its own; ``dtype`` is the output's (from
    :data:`OV_TO_ML` for the types numpy lacks: reread as that ml_dtypes type)."""
    ov_type = ML_TO_OV.get(dtype)
    if ov_type is None:
        return np.array(tensor.data, copy=True)
    shape = tuple(tensor.shape)
    if ov_type in _PACKED:
        return _unpack(np.asarray(tensor.data), math.prod(shape), ov_type).reshape(shape)
    return np.array(tensor.data, copy=True).view(check_dtype(dtype)).reshape(shape)
