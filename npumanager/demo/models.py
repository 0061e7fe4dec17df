"""The demo apps' ONNX models, built with ``onnx.helper`` at start (no downloads).

Each builder returns serialized ONNX bytes plus the inputs one run needs, so an
app process only needs numpy and the runtime client. Sizes are chosen so one
run takes a few milliseconds on a laptop-class CPU core: long enough for the
driver's scheduling to matter, short enough for a 30 fps camera.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

OPSET = 17


@dataclass(frozen=True)
class DemoModel:
    """A model an app prepares: its bytes, one run's inputs, and multi-step feedback."""

    name: str
    onnx: bytes
    inputs: dict[str, np.ndarray]
    feedback: dict[str, str] = field(default_factory=dict)

    @property
    def weight_bytes(self) -> int:
        return len(self.onnx)


def _serialize(graph: Any) -> bytes:
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def _weights(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    w: np.ndarray = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return w


def camera_model(size: int = 96, seed: int = 1) -> DemoModel:
    """A small detector: two 3x3 convolutions, pooling, a 10-class head.

    Input ``frame`` float32 [1, 3, size, size] (108 KiB at 96: it travels through
    the shared-memory pool, not the socket frame); output ``scores`` [1, 10]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(_weights(rng, (16, 3, 3, 3), 27), "c1"),
        numpy_helper.from_array(_weights(rng, (32, 16, 3, 3), 144), "c2"),
        numpy_helper.from_array(_weights(rng, (32, 10), 32), "head"),
    ]
    nodes = [
        helper.make_node("Conv", ["frame", "c1"], ["a1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Conv", ["r1", "c2"], ["a2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "head"], ["scores"]),
    ]
    g = helper.make_graph(
        nodes, "camera",
        [helper.make_tensor_value_info("frame", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 10])], inits)
    frame = np.random.default_rng(seed + 100).random((1, 3, size, size), dtype=np.float32)
    return DemoModel("camera-detector", _serialize(g), {"frame": frame})


def mlp_model(name: str, dim: int, depth: int, batch: int, seed: int) -> DemoModel:
    """y = tanh(...tanh(x @ W1)... @ Wd), x and y float32 [batch, dim] (voice, embedder)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i in range(depth):
        inits.append(numpy_helper.from_array(_weights(rng, (dim, dim), dim), f"w{i}"))
        out = "y" if i == depth - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [out]))
        prev = out
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, dim])], inits)
    x = np.random.default_rng(seed + 100).standard_normal((batch, dim)).astype(np.float32)
    return DemoModel(name, _serialize(g), {"x": x})


def llm_step_model(dim: int = 1024, layers: int = 8, seed: int = 3) -> DemoModel:
    """One decode step of a toy language model: the hidden state goes through ``layers``
    dense layers (dim x dim weights: 32 MiB at 1024 x 8) and the position advances.

    Inputs ``h`` [1, dim], ``pos`` [1, 1]; outputs ``h_out``, ``pos_out`` (= pos + 1).
    A multi-step job feeds ``h_out -> h`` and ``pos_out -> pos``, as a decode loop
    feeds each token back, so ``pos_out`` counts the steps the driver really ran."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.ones((1, 1), np.float32), "one")]
    nodes = [helper.make_node("Add", ["pos", "one"], ["pos_out"])]
    prev = "h"
    for i in range(layers):
        inits.append(numpy_helper.from_array(_weights(rng, (dim, dim), dim), f"w{i}"))
        out = "h_out" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        nodes.append(helper.make_node("Tanh", [f"m{i}"], [out]))
        prev = out
    g = helper.make_graph(
        nodes, "llm-step",
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, dim]),
         helper.make_tensor_value_info("pos", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [1, dim]),
         helper.make_tensor_value_info("pos_out", TensorProto.FLOAT, [1, 1])], inits)
    h = np.random.default_rng(seed + 100).standard_normal((1, dim)).astype(np.float32)
    return DemoModel("llm-decoder", _serialize(g),
                     {"h": h, "pos": np.zeros((1, 1), np.float32)},
                     feedback={"h_out": "h", "pos_out": "pos"})


def demo_models(fast: bool = False) -> dict[str, DemoModel]:
    """The four apps' models, by app name."""
    return {
        "camera": camera_model(),
        "voice": mlp_model("voice-keyword", 256, 4, 16, seed=5),
        "embedder": mlp_model("text-embedder", 384, 6, 8, seed=7),
        "llm": llm_step_model(1024, 6 if fast else 8),
    }
