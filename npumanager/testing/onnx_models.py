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


def gru_step_model(frame: int = 512, features: int = 64, hidden: int = 128,
                   seed: int = 0) -> bytes:
    """One step of a voice-activity detector: a 512-sample audio frame goes through a
    learned filterbank (MatMul + Relu) into a GRU cell (PyTorch's layout,
    linear_before_reset) and a sigmoid head. Inputs ``frame`` float32 [1, frame] and
    ``h`` [1, 1, hidden]; outputs ``prob`` [1, 1] and ``h_out`` (feed it back as ``h``)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> Any:
        return numpy_helper.from_array(
            (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32), name)

    inits = [w("fb", frame, features), w("W", 1, 3 * hidden, features),
             w("R", 1, 3 * hidden, hidden), w("B", 1, 6 * hidden), w("head", hidden, 1),
             numpy_helper.from_array(np.array([1, 1, features], np.int64), "seq_shape"),
             numpy_helper.from_array(np.array([1, hidden], np.int64), "h_shape")]
    nodes = [
        helper.make_node("MatMul", ["frame", "fb"], ["bands"]),
        helper.make_node("Relu", ["bands"], ["energy"]),
        helper.make_node("Reshape", ["energy", "seq_shape"], ["xs"]),
        helper.make_node("GRU", ["xs", "W", "R", "B", "", "h"], ["", "h_out"],
                         hidden_size=hidden, linear_before_reset=1),
        helper.make_node("Reshape", ["h_out", "h_shape"], ["h_flat"]),
        helper.make_node("MatMul", ["h_flat", "head"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    g = helper.make_graph(
        nodes, "gru_step",
        [helper.make_tensor_value_info("frame", TensorProto.FLOAT, [1, frame]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, hidden])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1]),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, 1, hidden])],
        inits)
    return _model(g)


def cnn_model(height: int = 48, width: int = 192, channels: tuple[int, ...] = (16, 32, 64, 128),
              classes: int = 2, seed: int = 0) -> bytes:
    """A small image classifier (3x3 convolutions + Relu, stride 2 while the image is
    larger than 8 pixels high, global average pool, Gemm, Softmax), like a text-direction
    classifier at its default size. Input ``image`` float32 [1, 3, height, width]; output
    ``probs`` [1, classes]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev, cin, h = "image", 3, height
    for i, cout in enumerate(channels):
        stride = 2 if h > 8 else 1
        h = (h + stride - 1) // stride
        wt = rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)
        inits += [numpy_helper.from_array(wt.astype(np.float32), f"k{i}"),
                  numpy_helper.from_array(np.zeros(cout, np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [prev, f"k{i}", f"b{i}"], [f"c{i}"],
                                   kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                   strides=[stride, stride]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev, cin = f"r{i}", cout
    fc = (rng.standard_normal((cin, classes)) / np.sqrt(cin)).astype(np.float32)
    inits += [numpy_helper.from_array(fc, "fc"),
              numpy_helper.from_array(np.zeros(classes, np.float32), "fc_b")]
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc", "fc_b"], ["logits"]),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=1)]
    g = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, height, width])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, classes])], inits)
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
        if dt.kind == "O":  # ONNX strings: numpy object arrays of str
            words = rng.integers(0, 1000, concrete)
            out[name] = np.array([f"w{n}" for n in words.ravel()], object).reshape(concrete)
        elif dt.kind == "f":
            out[name] = rng.standard_normal(concrete).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.integers(0, 2, concrete).astype(dt)
        else:
            out[name] = rng.integers(0, 10, concrete).astype(dt)
    return out
