"""ONNX values that are not plain tensors, as ONNX Runtime's Python API has them.

==================  ========================================  ==========================
ONNX type           Python                                    on the wire (pb.Value)
==================  ========================================  ==========================
tensor              numpy array (0-d, empty, any element      ``tensor``
                    type of :mod:`.dtypes`, object of str)
seq(T)              list of T                                 ``sequence``
map(K, V)           dict of int or str -> float, int, bool    ``map`` (keys, values
                    or str                                    tensors)
optional(T)         None (absent) or the T itself             ``optional`` (absent), or T
==================  ========================================  ==========================

:func:`encode_value` and :func:`decode_value` are the one codec pair for these
values, wherever they travel (an execute's inputs and outputs today). Where a
tensor's bytes go — inline, or a pool — is the caller's choice: it passes a
``place`` function that fills a :class:`pb.Tensor` whose name, dtype and shape
are set, and a ``resolve`` function that turns one back into an array. A
tensor nested in a value is placed exactly as a top-level one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from npumanager.errors import InvalidArgument
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio.codec import contiguous, fill_inline, inline_array
from npumanager.tensorio.dtypes import dtype_name, is_numeric, is_string

#: Fills a Tensor message (name, dtype and shape set) with an array's payload.
Place = Callable[[pb.Tensor, np.ndarray], None]
#: The array a Tensor message stands for (inline, or in a pool).
Resolve = Callable[[pb.Tensor], np.ndarray]

#: Values nest at most this deep (a sequence of maps is 2).
MAX_DEPTH = 16
_TENSORS = (np.ndarray, np.generic, bool, int, float, str, bytes)


def is_tensor(value: Any) -> bool:
    """Whether ``value`` crosses as a plain tensor (numpy array or scalar)."""
    return isinstance(value, np.ndarray | np.generic)


def encode_tensor(msg: pb.Tensor, arr: Any, place: Place | None = None) -> None:
    """``arr`` into ``msg``: dtype, shape, then the payload (``place`` for numeric
    tensors when given, inline otherwise)."""
    arr = contiguous(arr)
    dt = arr.dtype
    if not is_numeric(dt) and not is_string(dt):
        raise InvalidArgument(f"tensor {msg.name!r} has dtype {dt}, not an ONNX element type")
    msg.dtype = dtype_name(dt)
    msg.shape[:] = arr.shape
    if place is not None and not is_string(dt):
        place(msg, arr)
    else:
        fill_inline(msg, arr)


def encode_value(msg: pb.Value, value: Any, place: Place | None = None,
                 _depth: int = 0) -> None:
    """Any ONNX value (table above) into ``msg`` (its name, if any, already set)."""
    if _depth > MAX_DEPTH:
        raise InvalidArgument(f"value {msg.name!r} nests deeper than {MAX_DEPTH}")
    if value is None:
        msg.optional.SetInParent()
    elif isinstance(value, _TENSORS):
        msg.tensor.name = msg.name
        encode_tensor(msg.tensor, value, place)
    elif isinstance(value, list | tuple):
        seq = msg.sequence
        seq.SetInParent()
        for element in value:
            encode_value(seq.elements.add(), element, place, _depth + 1)
    elif isinstance(value, dict):
        encode_map(msg.map, value, msg.name)
    else:
        raise InvalidArgument(f"value {msg.name!r}: a {type(value).__name__} is not an ONNX "
                              "value (a tensor, a list for a sequence, a dict for a map, or "
                              "None for an absent optional)")


def _scalars(what: str, items: list[Any]) -> np.ndarray:
    """Map keys or values as one 1-d tensor whose ``tolist()`` gives them back."""
    if all(type(x) is str for x in items):
        arr = np.empty(len(items), dtype=object)
        arr[:] = items
        return arr
    if items and all(type(x) is bytes for x in items):
        arr = np.empty(len(items), dtype=object)
        arr[:] = items
        return arr
    try:
        if all(isinstance(x, bool | np.bool_) for x in items):
            return np.array(items, dtype=bool)
        if all(isinstance(x, int | np.integer) and not isinstance(x, bool | np.bool_)
               for x in items):
            return np.array(items, dtype=np.int64)
        if all(isinstance(x, int | float | np.integer | np.floating) for x in items):
            # ONNX Runtime turns a dict's numbers into floats: a mix of ints and floats
            # reaches it as the same numbers either way.
            return np.array(items, dtype=np.float64)
    except OverflowError:
        raise InvalidArgument(f"map {what}: an int does not fit in int64") from None
    kinds = sorted({type(x).__name__ for x in items})
    raise InvalidArgument(f"map {what} must be all str, all ints or all numbers (ONNX maps "
                          f"hold scalars), not {', '.join(kinds)}")


def encode_map(msg: pb.Map, value: dict[Any, Any], name: str = "") -> None:
    msg.SetInParent()
    keys = _scalars(f"{name!r} keys", list(value))
    values = _scalars(f"{name!r} values", list(value.values()))
    encode_tensor(msg.keys, keys)
    encode_tensor(msg.values, values)


def decode_value(msg: pb.Value, resolve: Resolve = inline_array, _depth: int = 0) -> Any:
    """The Python value a message stands for (table above)."""
    if _depth > MAX_DEPTH:
        raise InvalidArgument(f"value {msg.name!r} nests deeper than {MAX_DEPTH}")
    kind = msg.WhichOneof("kind")
    if kind == "tensor":
        return resolve(msg.tensor)
    if kind == "sequence":
        return [decode_value(e, resolve, _depth + 1) for e in msg.sequence.elements]
    if kind == "map":
        keys = inline_array(msg.map.keys)
        values = inline_array(msg.map.values)
        if keys.ndim != 1 or values.shape != keys.shape:
            raise InvalidArgument(f"map {msg.name!r}: {keys.shape} keys for "
                                  f"{values.shape} values")
        return dict(zip(keys.tolist(), values.tolist(), strict=True))
    if kind == "optional":
        inner = msg.optional
        return decode_value(inner.value, resolve, _depth + 1) if inner.HasField("value") else None
    raise InvalidArgument(f"value {msg.name!r} is empty (no tensor, sequence, map or optional)")


def tensors_in(value: Any) -> Iterator[np.ndarray]:
    """The arrays nested in a value (for sizing the pool space they need)."""
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, list | tuple):
        for element in value:
            yield from tensors_in(element)
