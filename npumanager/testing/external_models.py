"""ONNX models whose tensors live in external data files, for the trust-boundary tests.

* :func:`referencing_model`: a model whose tensor claims to live at a location
  of the caller's choosing (``etc/shadow``, ``../../var/lib/npu/...``), hidden in
  any of the places a tensor can be: an initializer, a node attribute, a
  subgraph, a model-local function, a sparse initializer. Nothing is written:
  this is what a hostile app sends to make a driver read a file for it.
* :func:`save_external_model`: a real model saved the way ``onnx.save`` does with
  external data (``model.onnx`` + a weights file beside it), y = x * scale + bias.
* :func:`save_big_external_model`: the same idea past protobuf's 2 GiB, cheaply:
  the weights file is sparse (it costs no disk), only its last elements are set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from npumanager.testing.onnx_models import OPSET

PLACES = ("initializer", "attribute", "subgraph", "function", "sparse")


def set_external(tensor: Any, location: str, offset: int = 0, length: int | None = None) -> Any:
    """Make ``tensor`` (an onnx.TensorProto) claim its bytes live at ``location``."""
    from onnx import TensorProto

    n = length if length is not None else len(tensor.raw_data) or 4 * int(
        np.prod(tensor.dims, dtype=np.int64))
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(n))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def _finish(graph: Any, functions: list[Any] | None = None) -> bytes:
    from onnx import helper

    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("npu.test", 1)]
    model = helper.make_model(graph, opset_imports=opsets, functions=functions or [])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def referencing_model(location: str, where: str = "initializer", n: int = 4) -> bytes:
    """y = x + W (float32 [1, n]) where W's bytes are "at" ``location``, W being hidden in
    ``where`` (one of :data:`PLACES`)."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])
    w = set_external(numpy_helper.from_array(np.zeros((1, n), np.float32), "W"), location)
    if where == "initializer":
        g = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g", [x], [y], [w])
        return _finish(g)
    if where == "attribute":
        nodes = [helper.make_node("Constant", [], ["W"], value=w),
                 helper.make_node("Add", ["x", "W"], ["y"])]
        return _finish(helper.make_graph(nodes, "g", [x], [y]))
    if where == "subgraph":
        branch = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y_b"])], "b", [],
                                   [helper.make_tensor_value_info("y_b", TensorProto.FLOAT,
                                                                  [1, n])], [w])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["y_o"])], "o", [],
                                  [helper.make_tensor_value_info("y_o", TensorProto.FLOAT,
                                                                 [1, n])])
        cond = helper.make_tensor("c", TensorProto.BOOL, [], [True])
        nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other)]
        return _finish(helper.make_graph(nodes, "g", [x], [y], [cond]))
    if where == "function":
        fn = helper.make_function(
            "npu.test", "AddW", ["a"], ["b"],
            [helper.make_node("Constant", [], ["k"], value=w),
             helper.make_node("Add", ["a", "k"], ["b"])],
            [helper.make_opsetid("", OPSET)])
        nodes = [helper.make_node("AddW", ["x"], ["y"], domain="npu.test")]
        return _finish(helper.make_graph(nodes, "g", [x], [y]), [fn])
    if where == "sparse":
        values = set_external(numpy_helper.from_array(np.zeros(n, np.float32), "W_values"),
                              location)
        indices = numpy_helper.from_array(np.arange(n, dtype=np.int64), "W_indices")
        sparse = helper.make_sparse_tensor(values, indices, [1, n])
        g = helper.make_graph([helper.make_node("Add", ["x", "W"], ["y"])], "g", [x], [y])
        sparse.values.name = "W"
        g.sparse_initializer.append(sparse)
        return _finish(g)
    raise ValueError(f"unknown place {where!r}; one of {PLACES}")


def save_external_model(directory: Path, n: int = 4, *, weights: str = "weights.bin",
                        scale: float = 3.0, bias: float = 0.5) -> Path:
    """``directory/model.onnx`` computing y = x * scale + bias (float32 [1, n]) whose
    ``scale`` (an initializer) and ``bias`` (a Constant node's attribute) both live in
    ``directory/weights``; returns the model's path."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])
    s = numpy_helper.from_array(np.full((1, n), scale, np.float32), "scale")
    b = numpy_helper.from_array(np.full((1, n), bias, np.float32), "bias")
    nodes = [helper.make_node("Constant", [], ["b"], value=b),
             helper.make_node("Mul", ["x", "scale"], ["xs"]),
             helper.make_node("Add", ["xs", "b"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "affine", [x], [y], [s]),
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=weights, size_threshold=0,
                    convert_attribute=True)
    return path


def save_big_external_model(directory: Path, elements: int, tensors: int = 2) -> Path:
    """``directory/big.onnx``: ``tensors`` float32 initializers of ``elements`` each in one
    sparse weights file (``big.bin``, ``4 * elements * tensors`` bytes, no disk used); each
    tensor's last element is ``i + 1``, every other element 0. y[i] = W_i[idx[i]]: feed
    idx = [elements - 1] * tensors to read them."""
    from onnx import TensorProto, helper

    directory.mkdir(parents=True, exist_ok=True)
    nbytes = 4 * elements
    weights = directory / "big.bin"
    fd = os.open(weights, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, nbytes * tensors)
        for i in range(tensors):
            os.pwrite(fd, np.float32(i + 1).tobytes(), nbytes * (i + 1) - 4)
    finally:
        os.close(fd)
    inits, nodes, outs = [], [], []
    for i in range(tensors):
        w = TensorProto()
        w.name, w.data_type = f"W{i}", TensorProto.FLOAT
        w.dims.append(elements)
        inits.append(set_external(w, "big.bin", offset=i * nbytes, length=nbytes))
        nodes.append(helper.make_node("Gather", [f"W{i}", "idx"], [f"g{i}"]))
        outs.append(f"g{i}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=0))
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [tensors])
    path = directory / "big.onnx"
    path.write_bytes(_finish(helper.make_graph(nodes, "big", [idx], [y], inits)))
    return path


__all__ = ["PLACES", "referencing_model", "save_big_external_model", "save_external_model",
           "set_external"]
