"""Small real ONNX models built with ``onnx.helper`` (no downloads), for tests and benches."""

from __future__ import annotations

from typing import Any

import numpy as np

OPSET = 17


def _model(graph: Any) -> bytes:
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def add_model(n: int = 4, bias: float = 1.0) -> bytes:
    """y = x + bias, x and y float32 [1, n]."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, n], [bias] * n)
    g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "add", [x], [y], [w])
    return _model(g)


def relu_model(shape: tuple[int, ...]) -> bytes:
    """y = relu(x) for a float32 tensor of ``shape`` (large ones exercise shared memory)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    return _model(g)


def matmul_model(dim: int = 256, depth: int = 4, batch: int = 16, seed: int = 0) -> bytes:
    """y = tanh(...tanh(x @ W1)... @ Wd): a compute-bound model whose run time scales with
    ``dim``, ``depth`` and ``batch``. x and y are float32 [batch, dim]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, dim])
    nodes, inits = [], []
    prev = "x"
    for i in range(depth):
        w = (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        out = "y" if i == depth - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [out]))
        prev = out
    g = helper.make_graph(nodes, "matmul", [x], [y], inits)
    return _model(g)


def matmul_reference(x: np.ndarray, dim: int = 256, depth: int = 4, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    h = x.astype(np.float32)
    for _ in range(depth):
        w = (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32)
        h = np.tanh(h @ w)
    return h


def step_model(n: int = 4, work_dim: int = 0, work_depth: int = 1) -> bytes:
    """A decode-loop step: state_out = state + 1 (float32 [1, n]); with ``work_dim`` > 0 it
    also computes a [work_dim, work_dim] MatMul chain (output ``work``) so a step takes time.
    Feed ``state_out`` back into ``state`` between steps."""
    from onnx import TensorProto, helper, numpy_helper

    s = helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, n])
    so = helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [1, n])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1, n], [1.0] * n)
    nodes = [helper.make_node("Add", ["state", "one"], ["state_out"])]
    inits = [one]
    outputs = [so]
    if work_dim > 0:
        rng = np.random.default_rng(1)
        a = (rng.standard_normal((work_dim, work_dim)) / np.sqrt(work_dim)).astype(np.float32)
        inits.append(numpy_helper.from_array(a, "a"))
        # Scale by the state so ONNX Runtime cannot fold the chain into a constant.
        nodes.append(helper.make_node("ReduceMean", ["state"], ["s_mean"], keepdims=0))
        nodes.append(helper.make_node("Mul", ["a", "s_mean"], ["a_scaled"]))
        prev = "a_scaled"
        for i in range(work_depth):
            out = "work" if i == work_depth - 1 else f"wk{i}"
            nodes.append(helper.make_node("MatMul", [prev, "a"], [f"mm{i}"]))
            nodes.append(helper.make_node("Tanh", [f"mm{i}"], [out]))
            prev = out
        outputs.append(helper.make_tensor_value_info("work", TensorProto.FLOAT,
                                                     [work_dim, work_dim]))
    g = helper.make_graph(nodes, "step", [s], outputs, inits)
    return _model(g)


def reshape_model() -> bytes:
    """y = reshape(x [1, 4], shape): a bad ``shape`` input makes ONNX Runtime fail at run time
    (the FAILED path)."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                          [x, shape], [y])
    return _model(g)


def random_inputs(specs: list[tuple[str, str, tuple[int, ...]]], seed: int = 0
                  ) -> dict[str, np.ndarray]:
    """Random inputs for (name, dtype, shape) specs; dynamic dims (-1) become 1."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, dtype, shape in specs:
        concrete = tuple(d if d >= 0 else 1 for d in shape)
        dt = np.dtype(dtype)
        if dt.kind == "f":
            out[name] = rng.standard_normal(concrete).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.integers(0, 2, concrete).astype(dt)
        else:
            out[name] = rng.integers(0, 10, concrete).astype(dt)
    return out
