"""ONNX's value model on the wire (npumanager.tensorio): every element type, 0-d and empty
tensors, strings, sequences, maps and optionals cross with dtype and shape exactly kept;
what is not an ONNX value is refused with InvalidArgument."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from npumanager import tensorio
from npumanager.errors import InvalidArgument
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio.dtypes import ML_DTYPES, ONNX_TO_NUMPY


def _round_trip(arr: np.ndarray) -> np.ndarray:
    msg = pb.Tensor.FromString(tensorio.inline_msg("t", arr).SerializeToString())
    return tensorio.inline_array(msg)


def _same(a: Any, b: Any) -> None:
    """Same Python structure, dtypes, shapes and values (NaN == NaN)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        if a.dtype.kind in "OUS":
            assert a.tolist() == b.tolist()
            assert [type(x) for x in a.reshape(-1).tolist()] == [
                type(x) for x in b.reshape(-1).tolist()]
        else:
            assert a.tobytes() == b.tobytes()
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b) and [type(k) for k in a] == [type(k) for k in b]
        for k in a:
            assert type(a[k]) is type(b[k]) and a[k] == b[k]
    else:
        assert a == b


@pytest.mark.parametrize("dtype", sorted(set(ONNX_TO_NUMPY.values()) - {"object"}))
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (3,), (2, 3)])
def test_every_numeric_element_type_keeps_dtype_and_shape(dtype: str, shape: tuple[int, ...]
                                                          ) -> None:
    dt = tensorio.check_dtype(dtype)
    arr = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) % 2
    arr = np.asarray(arr).astype(dt)
    back = _round_trip(arr)
    _same(back, arr)
    assert tensorio.dtype_name(back.dtype) == dtype


def test_ml_dtypes_are_ml_dtypes_on_both_ends() -> None:
    assert tensorio.check_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    x = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    _same(_round_trip(x), x)
    assert "bfloat16" in ML_DTYPES and "float64" not in ML_DTYPES


def test_zero_d_tensors_stay_zero_d() -> None:
    for x in (np.array(6, np.int64), np.float32(2.5), np.array(True)):
        msg = pb.Value(name="v")
        tensorio.encode_value(msg, x)
        back = tensorio.decode_value(msg)
        assert back.shape == () and back.dtype == np.asarray(x).dtype
    assert tensorio.contiguous(np.float32(1)).shape == ()
    assert tensorio.contiguous(np.ones((4, 4))[:, 1]).flags.c_contiguous


@pytest.mark.parametrize("arr", [
    np.array(["a", "é", "", "x\x00y"], dtype=object),
    np.array([[b"\xff\x00", b""]], dtype=object),
    np.array([["ab", "c"]]),  # numpy's fixed-width unicode
    np.array([b"ab", b"c"]),  # and bytes
    np.array("scalar", dtype=object),
    np.empty((0, 2), dtype=object),
])
def test_string_tensors_keep_their_kind_of_elements(arr: np.ndarray) -> None:
    back = _round_trip(arr)
    _same(back, arr)
    assert tensorio.dtype_name(back.dtype) == tensorio.dtype_name(arr.dtype)


def test_strings_that_are_not_onnx_strings_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="only str or only bytes"):
        tensorio.inline_msg("t", np.array(["a", b"b"], dtype=object))
    with pytest.raises(InvalidArgument, match="only str or only bytes"):
        tensorio.inline_msg("t", np.array([1, "b"], dtype=object))
    msg = tensorio.inline_msg("t", np.array(["a"], dtype=object))
    msg.strings[0] = b"\xff"
    with pytest.raises(InvalidArgument, match="UTF-8"):
        tensorio.inline_array(msg)
    msg.strings[:] = [b"a", b"b"]
    with pytest.raises(InvalidArgument, match="do not fill"):
        tensorio.inline_array(msg)
    # A hostile width would make the driver allocate gigabytes for empty strings.
    msg = tensorio.inline_msg("t", np.array([""] * 1000))
    msg.dtype = "<U1000000"
    with pytest.raises(InvalidArgument, match="wider"):
        tensorio.inline_array(msg)


def test_dtypes_that_are_no_onnx_type_are_refused() -> None:
    for dtype in ("V8", "f4,i4", "datetime64[s]", "timedelta64", "no-such", "<U0"):
        with pytest.raises(InvalidArgument):
            tensorio.check_dtype(dtype)
    msg = tensorio.inline_msg("t", np.ones(2, np.float32))
    msg.dtype = "object"  # raw bytes read as object pointers: never
    with pytest.raises(InvalidArgument):
        tensorio.inline_array(msg)
    pool = tensorio.ClientPool(4096)
    try:
        with pytest.raises(InvalidArgument, match="inline"):
            tensorio.view_in(pool.buf, 0, 16, "object", (2,), "x")
    finally:
        pool.close()


VALUES: list[Any] = [
    [np.ones((2, 2), np.float32), np.zeros(3, np.float32)],
    [],
    [np.array(1, np.int64)],
    [[np.ones(1, np.int32)], []],
    {"a": 0.5, "b": 1.0},
    {3: 0.25, 7: -1.0},
    {"x": 1, "y": 2},
    {1: "one", 2: "two"},
    {"t": True},
    {},
    [{"a": 0.1}, {"b": 0.2}],  # ZipMap's output
    None,
    np.array(["s"], dtype=object),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_values_round_trip(value: Any) -> None:
    msg = pb.Value(name="v")
    tensorio.encode_value(msg, value)
    back = tensorio.decode_value(pb.Value.FromString(msg.SerializeToString()))
    _same(back, value)


def test_map_numbers_of_mixed_kinds_reach_the_backend_as_floats() -> None:
    msg = pb.Value()
    tensorio.encode_value(msg, {"a": 1, "b": 2.5})
    assert tensorio.decode_value(msg) == {"a": 1.0, "b": 2.5}


@pytest.mark.parametrize("value", [
    {"a": [1.0]}, {(1, 2): 1.0}, {"a": 1, 2: 3}, {"big": 1 << 70}, object(), {1, 2},
])
def test_what_is_no_onnx_value_is_refused(value: Any) -> None:
    with pytest.raises(InvalidArgument):
        tensorio.encode_value(pb.Value(name="v"), value)


def test_hostile_value_messages_are_refused() -> None:
    deep = pb.Value()
    inner = deep
    for _ in range(40):
        inner = inner.sequence.elements.add()
    with pytest.raises(InvalidArgument, match="deeper"):
        tensorio.decode_value(deep)
    with pytest.raises(InvalidArgument, match="empty"):
        tensorio.decode_value(pb.Value(name="v"))
    msg = pb.Value()
    tensorio.encode_value(msg, {"a": 1.0, "b": 2.0})
    msg.map.values.data = b""  # keys without values
    msg.map.values.shape[:] = [0]
    with pytest.raises(InvalidArgument, match="keys"):
        tensorio.decode_value(msg)


def test_nested_tensors_are_placed_like_top_level_ones() -> None:
    """The caller decides where a numeric tensor's bytes go, nested or not; strings and
    map entries always stay inline."""
    placed: list[np.ndarray] = []
    store: dict[int, np.ndarray] = {}

    def place(t: pb.Tensor, arr: np.ndarray) -> None:
        placed.append(arr)
        t.pool_id, t.nbytes = len(placed), arr.nbytes
        store[len(placed)] = arr.copy()

    def resolve(t: pb.Tensor) -> np.ndarray:
        return store[t.pool_id] if t.pool_id else tensorio.inline_array(t)

    value = [np.arange(5, dtype=np.int16), [np.zeros((2, 0), np.float32)],
             np.array(["s"], dtype=object)]
    msg = pb.Value(name="seq")
    tensorio.encode_value(msg, value, place)
    assert len(placed) == 2  # the two numeric tensors, not the string one
    _same(tensorio.decode_value(msg, resolve), value)
    assert [a.shape for a in tensorio.tensors_in(value)] == [(5,), (2, 0), (1,)]


# --- the codec pair end to end: a real sealed pool, every element type, nesting, malformed --


def _sample(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array of ``dtype`` and ``shape`` with distinct-ish values (strings: str elements)."""
    n = int(np.prod(shape))
    if dtype == "object":
        arr = np.empty(n, dtype=object)
        arr[:] = [f"s{i}é" for i in range(n)]
        return arr.reshape(shape)
    return (np.arange(n, dtype=np.int64) % 3).reshape(shape).astype(tensorio.check_dtype(dtype))


class _Pools:
    """A client pool and the driver's mapping of it, with the place/resolve pair both ends
    use: numeric tensors are written at aligned offsets and read back as views."""

    def __init__(self, size: int = 1 << 16) -> None:
        self.client = tensorio.ClientPool(size)
        self.mapped = tensorio.MappedPool(self.client.fd, size)
        self.pos = 0
        self.placed = 0

    def place(self, t: pb.Tensor, arr: np.ndarray) -> None:
        start = tensorio.align(self.pos)
        view = tensorio.view_in(self.client.buf, start, arr.nbytes, t.dtype, arr.shape, t.name)
        view[...] = arr
        t.pool_id, t.offset, t.nbytes = 1, start, arr.nbytes
        self.pos = start + arr.nbytes
        self.placed += 1

    def resolve(self, t: pb.Tensor) -> np.ndarray:
        if not t.pool_id:
            return tensorio.inline_array(t)
        return tensorio.view_in(self.mapped.buf, t.offset, t.nbytes, t.dtype, t.shape, t.name)

    def close(self) -> None:
        self.mapped.close()
        self.client.close()


def _cross(value: Any, pools: _Pools | None = None) -> Any:
    msg = pb.Value(name="v")
    tensorio.encode_value(msg, value, pools.place if pools else None)
    wire = pb.Value.FromString(msg.SerializeToString())
    return tensorio.decode_value(wire, pools.resolve if pools else tensorio.inline_array)


@pytest.mark.parametrize("dtype", sorted(set(ONNX_TO_NUMPY.values())))
def test_every_element_type_crosses_a_sealed_pool_alone_and_nested(dtype: str) -> None:
    """0-d, empty and n-d tensors of every ONNX element type, at the top level, in a
    sequence, in a sequence of sequences and as a present optional, through a real memfd
    pool (strings inline): the same dtypes, shapes and bytes come back."""
    pools = _Pools()
    try:
        scalar, empty, full = _sample(dtype, ()), _sample(dtype, (0, 3)), _sample(dtype, (2, 3))
        for value in (scalar, empty, full, [scalar, empty, full], [[full], [], [scalar]]):
            back = _cross(value, pools)
            _same(back, value)
            assert all(tensorio.dtype_name(a.dtype) == dtype for a in tensorio.tensors_in(back))
        numeric = dtype != "object"
        assert (pools.placed > 0) == numeric  # numeric ones went through the pool
        assert _cross(None, pools) is None  # an absent optional is no empty tensor
        assert _cross([], pools) == []  # and an empty sequence is neither
    finally:
        pools.close()


def test_maps_and_zipmap_outputs_keep_key_and_value_types() -> None:
    for value in ({"a": "x", "b": ""}, {-1: True, 2: False}, {b"k": 1.5},
                  [{1: 0.5}, {}, {"z": -2}], [[{"n": "m"}]]):
        _same(_cross(value), value)


MALFORMED: list[tuple[str, Callable[[pb.Value], None], str]] = [
    ("empty element of a sequence", lambda m: m.sequence.elements.add(), "empty"),
    ("element with no ONNX dtype",
     lambda m: m.sequence.elements.add().tensor.MergeFrom(pb.Tensor(dtype="V8", shape=[1])),
     "dtype"),
    ("element with a negative dimension",
     lambda m: m.sequence.elements.add().tensor.MergeFrom(
         pb.Tensor(dtype="float32", shape=[-1, -4], data=b"")), "negative"),
    ("bytes that do not fill the shape",
     lambda m: m.optional.value.tensor.MergeFrom(
         pb.Tensor(dtype="int64", shape=[2], data=b"\0" * 8)), "do not hold"),
    ("numeric tensor with strings too",
     lambda m: m.optional.value.tensor.MergeFrom(
         pb.Tensor(dtype="uint8", shape=[1], data=b"\1", strings=[b"x"])), "do not hold"),
    ("string tensor with raw bytes too",
     lambda m: m.sequence.elements.add().tensor.MergeFrom(
         pb.Tensor(dtype="object", shape=[1], strings=[b"a"], data=b"a")), "do not fill"),
    ("2-d map keys",
     lambda m: m.map.MergeFrom(pb.Map(keys=tensorio.inline_msg("k", np.ones((1, 1), np.int64)),
                                      values=tensorio.inline_msg("v", np.ones((1, 1))))),
     "keys"),
    ("map keys that are no UTF-8",
     lambda m: m.map.MergeFrom(pb.Map(
         keys=pb.Tensor(dtype="object", shape=[1], strings=[b"\xff"]),
         values=tensorio.inline_msg("v", np.ones(1)))), "UTF-8"),
    ("map without values",
     lambda m: m.map.MergeFrom(pb.Map(keys=tensorio.inline_msg("k", np.ones(1, np.int64)))),
     "dtype"),
    ("a map's keys in a pool",
     lambda m: m.map.MergeFrom(pb.Map(
         keys=pb.Tensor(dtype="int64", shape=[1], pool_id=1, nbytes=8),
         values=tensorio.inline_msg("v", np.ones(1)))), "do not hold"),
]


@pytest.mark.parametrize(("build", "match"), [(b, m) for _, b, m in MALFORMED],
                         ids=[what for what, _, _ in MALFORMED])
def test_malformed_value_messages_raise_invalid_argument(build: Callable[[pb.Value], None],
                                                         match: str) -> None:
    """A peer's malformed Value (wherever in the nesting) is an InvalidArgument that says
    what is wrong, never a numpy or protobuf exception."""
    msg = pb.Value(name="v")
    build(msg)
    with pytest.raises(InvalidArgument, match=match):
        tensorio.decode_value(pb.Value.FromString(msg.SerializeToString()))


def test_pool_references_outside_the_pool_are_refused_when_nested() -> None:
    pools = _Pools(4096)
    try:
        msg = pb.Value(name="v")
        tensorio.encode_value(msg, [np.ones(4, np.float32)], pools.place)
        msg.sequence.elements[0].tensor.offset = 4090
        with pytest.raises(InvalidArgument, match="outside the pool"):
            tensorio.decode_value(msg, pools.resolve)
        msg.sequence.elements[0].tensor.offset = 0
        msg.sequence.elements[0].tensor.dtype = "object"
        with pytest.raises(InvalidArgument, match="inline"):
            tensorio.decode_value(msg, pools.resolve)
    finally:
        pools.close()
