"""Element types: ONNX's names, numpy's dtypes, and which of them may cross the socket.

numpy has no bfloat16, float8, float4, int4 or int2; ONNX (``onnx.numpy_helper``)
and its test data use ``ml_dtypes`` for them, so they cross as those dtypes (one
element per byte for the 4- and 2-bit types, as ml_dtypes stores them). Strings
are numpy object arrays of str or bytes (what ONNX Runtime returns), or numpy's
fixed-width ``<U``/``|S`` arrays; they always travel inline.
"""

from __future__ import annotations

import functools

import numpy as np

from npumanager.errors import InvalidArgument

#: ONNX element type names (TensorProto.DataType, lower case, as in ONNX Runtime's
#: "tensor(float)") -> numpy dtype names.
ONNX_TO_NUMPY = {
    "float": "float32",
    "uint8": "uint8",
    "int8": "int8",
    "uint16": "uint16",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "string": "object",
    "bool": "bool",
    "float16": "float16",
    "double": "float64",
    "uint32": "uint32",
    "uint64": "uint64",
    "complex64": "complex64",
    "complex128": "complex128",
    "bfloat16": "bfloat16",
    "float8e4m3fn": "float8_e4m3fn",
    "float8e4m3fnuz": "float8_e4m3fnuz",
    "float8e5m2": "float8_e5m2",
    "float8e5m2fnuz": "float8_e5m2fnuz",
    "uint4": "uint4",
    "int4": "int4",
    "float4e2m1": "float4_e2m1fn",
    "float8e8m0": "float8_e8m0fnu",
    "uint2": "uint2",
    "int2": "int2",
    "float6e2m3": "float6_e2m3fn",
    "float6e3m2": "float6_e3m2fn",
}
NUMPY_TO_ONNX = {v: k for k, v in ONNX_TO_NUMPY.items()}

#: The element types only ml_dtypes has.
ML_DTYPES = frozenset({
    "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "uint4",
    "int4", "float4_e2m1fn", "float8_e8m0fnu", "uint2", "int2", "float6_e2m3fn", "float6_e3m2fn",
})
_NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex
_STRING_KINDS = frozenset("OUS")  # object (str or bytes elements), unicode, bytes

_NAMES: dict[np.dtype[np.generic], str] = {}


def dtype_name(dt: np.dtype[np.generic]) -> str:
    """The name a dtype crosses the socket as: ``dt.name`` (memoized: numpy computes it on
    every access, ~5 µs), or ``dt.str`` for fixed-width strings (``<U5``, ``|S3``)."""
    name = _NAMES.get(dt)
    if name is None:
        name = _NAMES[dt] = dt.str if dt.kind in "US" else dt.name
    return name


@functools.lru_cache(maxsize=128)
def check_dtype(dtype: str) -> np.dtype[np.generic]:
    """The dtype a peer named, if tensors of it may cross: numeric (numpy's, or
    ml_dtypes' for ONNX's narrow floats and ints) or string. Anything else — structured
    and void dtypes, datetimes, unknown names — is refused."""
    if dtype in ML_DTYPES:
        import ml_dtypes

        scalar = getattr(ml_dtypes, dtype, None)
        if scalar is None:
            raise InvalidArgument(f"tensor dtype {dtype!r} needs a newer ml_dtypes")
        ml: np.dtype[np.generic] = np.dtype(scalar)
        return ml
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidArgument(f"unknown tensor dtype {dtype!r}") from None
    if dt.kind not in _NUMERIC_KINDS and dt.kind not in _STRING_KINDS:
        raise InvalidArgument(f"tensor dtype {dtype!r} is not an ONNX element type")
    if dt.kind in "US" and dt.itemsize == 0:
        raise InvalidArgument(f"tensor dtype {dtype!r} has no width")
    return dt


def is_numeric(dt: np.dtype[np.generic]) -> bool:
    """Whether tensors of ``dt`` are raw bytes (inline or in shared memory)."""
    return dt.kind in _NUMERIC_KINDS or dtype_name(dt) in ML_DTYPES


def is_string(dt: np.dtype[np.generic]) -> bool:
    return dt.kind in _STRING_KINDS


def onnx_elem_name(dtype: str) -> str:
    """ONNX's name for a numpy dtype name (``float32`` -> ``float``); fixed-width numpy
    strings are ONNX strings; an unknown or empty name stays as it is."""
    if dtype[:2] in ("<U", ">U", "|S"):
        return "string"
    return NUMPY_TO_ONNX.get(dtype, dtype)
