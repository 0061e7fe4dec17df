"""ONNX's whole value model through a real driver host, against ONNX Runtime in-process:
every output has the Python type, dtype, shape and value ONNX Runtime gives in-process."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from npumanager import nn
from npumanager.errors import InvalidArgument
from npumanager.testing.driver_host import running_driver

pytestmark = pytest.mark.slow

ML = h.make_opsetid("ai.onnx.ml", 3)


def _model(nodes: list[Any], ins: list[Any], outs: list[Any], opset: int = 21) -> bytes:
    g = h.make_graph(nodes, "g", ins, outs)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), ML])
    m.ir_version = 10
    return bytes(m.SerializeToString())


def _identity(elem: int, shape: list[Any] | None) -> bytes:
    return _model([h.make_node("Identity", ["x"], ["y"])],
                  [h.make_tensor_value_info("x", elem, shape)],
                  [h.make_tensor_value_info("y", elem, shape)])


SEQ_F = h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, None))
OPT_F = h.make_optional_type_proto(h.make_tensor_type_proto(T.FLOAT, [2]))
OPT_SEQ = h.make_optional_type_proto(SEQ_F)

CASES: dict[str, tuple[bytes, dict[str, Any]]] = {
    "0-d out (Size)": (
        _model([h.make_node("Size", ["x"], ["y"])],
               [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
               [h.make_tensor_value_info("y", T.INT64, [])]),
        {"x": np.ones((2, 3), np.float32)}),
    "0-d in and out": (_identity(T.DOUBLE, []), {"x": np.array(2.5)}),
    "empty": (_identity(T.INT32, [None, 0]), {"x": np.empty((3, 0), np.int32)}),
    "bool": (_identity(T.BOOL, [None]), {"x": np.array([True, False])}),
    "float16": (_identity(T.FLOAT16, [None]), {"x": np.array([1.5, -2], np.float16)}),
    "uint64": (_identity(T.UINT64, [None]), {"x": np.array([2**63 + 1], np.uint64)}),
    "strings": (_identity(T.STRING, ["N", 2]),
                {"x": np.array([["a", "é"], ["", "x\x00y"]], dtype=object)}),
    "fixed-width strings in": (_identity(T.STRING, [None]), {"x": np.array(["ab", "c"])}),
    "float8e4m3fn out": (
        _model([h.make_node("Cast", ["x"], ["y"], to=T.FLOAT8E4M3FN)],
               [h.make_tensor_value_info("x", T.FLOAT, [3])],
               [h.make_tensor_value_info("y", T.FLOAT8E4M3FN, [3])]),
        {"x": np.array([1.5, -2, 3], np.float32)}),
    "sequence in and out": (
        _model([h.make_node("SequenceInsert", ["s", "t"], ["y"]),
                h.make_node("SequenceLength", ["y"], ["n"])],
               [h.make_value_info("s", SEQ_F), h.make_tensor_value_info("t", T.FLOAT, None)],
               [h.make_value_info("y", SEQ_F), h.make_tensor_value_info("n", T.INT64, [])]),
        {"s": [np.ones((2, 2), np.float32), np.zeros(0, np.float32)],
         "t": np.arange(3, dtype=np.float32)}),
    "large tensors in a sequence (shared memory)": (
        _model([h.make_node("SequenceInsert", ["s", "t"], ["y"])],
               [h.make_value_info("s", SEQ_F), h.make_tensor_value_info("t", T.FLOAT, None)],
               [h.make_value_info("y", SEQ_F)]),
        {"s": [np.full((256, 512), 2.0, np.float32)], "t": np.arange(300_000, dtype=np.float32)}),
    "empty sequence": (
        _model([h.make_node("SequenceEmpty", [], ["y"], dtype=T.INT64)], [],
               [h.make_value_info("y", h.make_sequence_type_proto(
                   h.make_tensor_type_proto(T.INT64, None)))]), {}),
    "optional absent": (
        _model([h.make_node("OptionalHasElement", ["x"], ["has"]),
                h.make_node("Identity", ["x"], ["y"])],
               [h.make_value_info("x", OPT_F)],
               [h.make_tensor_value_info("has", T.BOOL, []), h.make_value_info("y", OPT_F)]),
        {"x": None}),
    "optional present": (
        _model([h.make_node("OptionalHasElement", ["x"], ["has"]),
                h.make_node("Identity", ["x"], ["y"])],
               [h.make_value_info("x", OPT_F)],
               [h.make_tensor_value_info("has", T.BOOL, []), h.make_value_info("y", OPT_F)]),
        {"x": np.ones(2, np.float32)}),
    "optional left out": (
        _model([h.make_node("OptionalHasElement", ["x"], ["has"])],
               [h.make_value_info("x", OPT_F)], [h.make_tensor_value_info("has", T.BOOL, [])]),
        {}),
    "optional sequence": (
        _model([h.make_node("Identity", ["x"], ["y"])], [h.make_value_info("x", OPT_SEQ)],
               [h.make_value_info("y", OPT_SEQ)]),
        {"x": [np.ones(2, np.float32)]}),
    "map in (CastMap)": (
        _model([h.make_node("CastMap", ["x"], ["y"], domain="ai.onnx.ml", cast_to="TO_FLOAT",
                            map_form="DENSE")],
               [h.make_value_info("x", h.make_map_type_proto(
                   T.INT64, h.make_tensor_type_proto(T.FLOAT, [])))],
               [h.make_tensor_value_info("y", T.FLOAT, [1, None])]),
        {"x": {1: 1.5, 0: 2.0}}),
    "sequence of maps out (ZipMap, string labels)": (
        _model([h.make_node("ZipMap", ["x"], ["y"], domain="ai.onnx.ml",
                            classlabels_strings=["cat", "dog"])],
               [h.make_tensor_value_info("x", T.FLOAT, [None, 2])],
               [h.make_value_info("y", h.make_sequence_type_proto(h.make_map_type_proto(
                   T.STRING, h.make_tensor_type_proto(T.FLOAT, []))))]),
        {"x": np.array([[0.1, 0.9], [0.3, 0.7]], np.float32)}),
    "sequence of maps out (ZipMap, int labels)": (
        _model([h.make_node("ZipMap", ["x"], ["y"], domain="ai.onnx.ml",
                            classlabels_int64s=[3, 7])],
               [h.make_tensor_value_info("x", T.FLOAT, [None, 2])],
               [h.make_value_info("y", h.make_sequence_type_proto(h.make_map_type_proto(
                   T.INT64, h.make_tensor_type_proto(T.FLOAT, []))))]),
        {"x": np.array([[0.25, 0.75]], np.float32)}),
}


def same(a: Any, b: Any, where: str = "") -> None:
    """Same Python type, dtype, shape and bytes (strings: same elements), recursively."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), f"{where}: {a.dtype}{a.shape} vs " \
                                                         f"{b.dtype}{b.shape}"
        if a.dtype.kind == "O":
            assert a.tolist() == b.tolist(), where
        else:
            assert a.tobytes() == b.tobytes(), where
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, dict):
        assert list(a.items()) == list(b.items()), where
        assert [type(v) for v in a.values()] == [type(v) for v in b.values()], where
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def dev() -> Iterator[nn.Device]:
    rt = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        with running_driver("reference", rt, st, args=["--no-enforce-admission"]):
            d = nn.device("reference", rt)
            yield d
            d.close()
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)


def in_process(onnx: bytes, feed: dict[str, Any]) -> dict[str, Any]:
    """As an app calls ONNX Runtime: ``session.run``, or for bfloat16 and float8 inputs or
    outputs OrtValues of their ONNX type (``run`` maps no ml_dtypes array; it gave a
    float8e4m3fn output as uint8)."""
    from npumanager.drivers.ort_values import run_values, session_typed

    sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    if session_typed(sess):
        return dict(zip(names, run_values(sess, names, feed, None), strict=True))
    return dict(zip(names, sess.run(None, feed), strict=True))


@pytest.mark.parametrize("case", list(CASES))
def test_values_come_back_as_onnx_runtime_gives_them_in_process(dev: nn.Device,
                                                                case: str) -> None:
    onnx, feed = CASES[case]
    expected = in_process(onnx, feed)
    model = dev.prepare_model(onnx)
    try:
        got = model.execute(feed)
        assert list(got) == list(expected)
        for name in expected:
            same(got[name], expected[name], f"{case}: {name}")
    finally:
        model.release()


def test_model_inputs_and_outputs_describe_onnx_types(dev: nn.Device) -> None:
    model = dev.prepare_model(CASES["sequence in and out"][0])
    assert [str(s) for s in model.inputs] == ["s: seq(tensor(float))", "t: tensor(float)"]
    assert [str(s) for s in model.outputs] == ["y: seq(tensor(float))", "n: tensor(int64)[]"]
    assert model.outputs[1].shape == () and model.outputs[1].type.dims == ()
    assert model.inputs[1].type.dims is None  # no shape declared: not a scalar
    model.release()
    model = dev.prepare_model(CASES["strings"][0])
    (spec,) = model.inputs
    assert (spec.dtype, spec.shape, spec.type.dims) == ("object", (-1, 2), ("N", 2))
    model.release()
    model = dev.prepare_model(CASES["sequence of maps out (ZipMap, int labels)"][0])
    assert str(model.outputs[0].type) == "seq(map(int64,tensor(float)[]))"
    model.release()


def test_bfloat16_passes_and_a_packed_type_is_refused_at_prepare(dev: nn.Device) -> None:
    """ONNX Runtime's ``session.run`` takes no bfloat16 array; the driver passes it as an
    OrtValue (as an app must), bit for bit. An int4 input, which ONNX Runtime packs two to
    a byte, is refused at prepare with the type named."""
    x = np.array([1, 2.5, -3], dtype=ml_dtypes.bfloat16)
    model = dev.prepare_model(_identity(T.BFLOAT16, [None]))
    try:
        got = model.execute({"x": x})["y"]
        assert got.dtype == x.dtype and got.tobytes() == x.tobytes()
    finally:
        model.release()
    with pytest.raises(InvalidArgument, match="the model's 'x' is int4: ONNX Runtime's Python "
                                              "API packs that type"):
        dev.prepare_model(_identity(T.INT4, [None]))


def test_wrong_inputs_are_invalid_argument_naming_the_input(dev: nn.Device) -> None:
    model = dev.prepare_model(CASES["sequence in and out"][0])
    try:
        ok = CASES["sequence in and out"][1]
        with pytest.raises(InvalidArgument, match=r"input 's' expects seq\(tensor\(float\)\), "
                                                   r"got tensor\(float\)"):
            model.execute({**ok, "s": np.ones(2, np.float32)})
        with pytest.raises(InvalidArgument, match=r"input 's\[1\]' expects tensor\(float\), "
                                                   r"got tensor\(double\)"):
            model.execute({**ok, "s": [np.ones(1, np.float32), np.ones(1)]})
        with pytest.raises(InvalidArgument, match=r"input 't' .* is missing"):
            model.execute({"s": ok["s"]})
        with pytest.raises(InvalidArgument, match="model has no input 'u'"):
            model.execute({**ok, "u": np.ones(1, np.float32)})
        with pytest.raises(InvalidArgument, match="only str or only bytes"):
            model.execute({**ok, "t": np.array([1, "a"], dtype=object)})
        np.testing.assert_array_equal(model.execute(ok)["n"], np.array(3))  # still serving
    finally:
        model.release()


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # (the plain path's answer, whatever its type)
        return type(exc)


def test_a_burst_takes_values_larger_than_the_largest_request_area(dev: nn.Device) -> None:
    """A burst's request area is at most 1 MiB (the driver parses it holding its GIL): a
    sequence of 1,100 small tensors (1 KiB each, inline in a plain request: 1.1 MiB) goes
    in the burst's data area instead; strings (inline only) larger than the area get what
    a plain execute gets."""
    from npumanager.tensorio import burst as layout

    seq = _model([h.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)],
                 [h.make_value_info("s", SEQ_F)], [h.make_tensor_value_info("y", T.FLOAT, None)])
    feed = {"s": [np.full(256, i, np.float32) for i in range(1100)]}
    expected = in_process(seq, feed)["y"]
    strings = _identity(T.STRING, [None])
    model, smodel = dev.prepare_model(seq), dev.prepare_model(strings)
    try:
        with model.burst() as b, smodel.burst() as sb:
            for _ in range(2):
                same(b.execute(feed)["y"], expected, "sequence")
            assert b._req <= layout.MAX_REQUEST_AREA
            fits = {"x": np.array(["x" * 1000] * 700, dtype=object)}  # 0.7 MiB: grows to it
            same(sb.execute(fits)["y"], fits["x"], "strings")
            big = {"x": np.array(["x" * 1000] * 1500, dtype=object)}  # 1.5 MiB
            assert _outcome(lambda: sb.execute(big)) == _outcome(
                lambda: smodel.execute(big)), "the burst answers as a plain execute does"
            assert sb._req <= layout.MAX_REQUEST_AREA
            same(sb.execute(fits)["y"], fits["x"], "strings after")
    finally:
        model.release()
        smodel.release()
