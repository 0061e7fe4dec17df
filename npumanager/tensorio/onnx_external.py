"""ONNX external data: where a model's tensors say their bytes live.

An ONNX tensor may keep its bytes outside the model (``data_location =
EXTERNAL``, ``external_data = {location, offset, length}``), in a file named
relative to the model. The client resolves those names with the app's own
rights and sends the files as fds; a driver resolves them against those fds
only, never against a path (a root driver reading ``location = "etc/shadow"``
relative to its working directory is the confused deputy). Both sides walk the
model here, so they agree on every place a tensor can hide: initializers and
sparse initializers, tensors in node attributes, subgraphs (If/Loop/Scan
bodies), local functions and training graphs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: Attribute types (onnx.AttributeProto) that carry tensors or graphs.
_TENSOR, _GRAPH, _SPARSE_TENSOR = 4, 5, 11
_TENSORS, _GRAPHS, _SPARSE_TENSORS = 9, 10, 12
_EXTERNAL = 1  # onnx.TensorProto.EXTERNAL


@dataclass(frozen=True)
class ExternalRef:
    """One tensor whose bytes live outside the model."""

    tensor: Any  # onnx.TensorProto
    location: str
    offset: int
    length: int | None  # None: to the end of the file
    #: An initializer of the main graph (a backend may bind its bytes without a copy).
    main_initializer: bool

    @property
    def name(self) -> str:
        return str(self.tensor.name)


def _attr_tensors(node: Any) -> Iterator[Any]:
    for attr in node.attribute:
        if attr.type == _TENSOR:
            yield attr.t
        elif attr.type == _TENSORS:
            yield from attr.tensors
        elif attr.type == _SPARSE_TENSOR:
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
        elif attr.type == _SPARSE_TENSORS:
            for sp in attr.sparse_tensors:
                yield sp.values
                yield sp.indices


def _subgraphs(node: Any) -> Iterator[Any]:
    for attr in node.attribute:
        if attr.type == _GRAPH:
            yield attr.g
        elif attr.type == _GRAPHS:
            yield from attr.graphs


def _graph_tensors(graph: Any, main: bool) -> Iterator[tuple[Any, bool]]:
    for init in graph.initializer:
        yield init, main
    for sp in graph.sparse_initializer:
        yield sp.values, False
        yield sp.indices, False
    for node in graph.node:
        for t in _attr_tensors(node):
            yield t, False
        for g in _subgraphs(node):
            yield from _graph_tensors(g, False)


def model_tensors(model: Any) -> Iterator[tuple[Any, bool]]:
    """Every TensorProto in ``model`` (an onnx.ModelProto), with whether it is an
    initializer of the main graph."""
    yield from _graph_tensors(model.graph, True)
    for fn in model.functions:
        for node in fn.node:
            for t in _attr_tensors(node):
                yield t, False
            for g in _subgraphs(node):
                yield from _graph_tensors(g, False)
    for info in model.training_info:
        yield from _graph_tensors(info.initialization, False)
        yield from _graph_tensors(info.algorithm, False)


def is_external(tensor: Any) -> bool:
    return bool(tensor.data_location == _EXTERNAL or len(tensor.external_data))


def external_refs(model: Any) -> list[ExternalRef]:
    """The tensors of ``model`` whose bytes live outside it. ValueError for a reference
    that names no location or has a malformed offset or length."""
    refs = []
    for tensor, main in model_tensors(model):
        if not is_external(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if not location:
            raise ValueError(f"tensor {tensor.name!r} has external data without a location")
        try:
            offset = int(info.get("offset") or 0)
            length = int(info["length"]) if info.get("length") else None
        except ValueError:
            raise ValueError(f"tensor {tensor.name!r} has a malformed external data offset "
                             f"or length (location {location!r})") from None
        if offset < 0 or (length is not None and length < 0):
            raise ValueError(f"tensor {tensor.name!r} has a negative external data offset "
                             f"or length (location {location!r})")
        refs.append(ExternalRef(tensor, location, offset, length, main))
    return refs


def parse_onnx(data: bytes) -> Any | None:
    """``data`` as an onnx.ModelProto, or None if it does not parse as one (a torch
    archive, an OpenVINO IR bundle). Whatever parses is a model to check: a backend
    that takes ONNX would parse it the same way."""
    import onnx
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError):
        return None
    return model


__all__ = ["ExternalRef", "external_refs", "is_external", "model_tensors", "parse_onnx"]
