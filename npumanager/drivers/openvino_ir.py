"""How a model reaches the OpenVINO driver: ONNX bytes, or an IR bundle (xml + bin in one buffer).

The plugin interface hands a driver one byte string per model (``compile``).
ONNX fits as it is. An OpenVINO IR is two files, the topology (``.xml``) and
its weights (``.bin``); they travel as one *IR bundle*::

    b"NPUOVIR1" | u64 len(xml) | u64 len(bin) | xml | bin     (little endian)

:func:`pack_ir` builds one from the two files' bytes and
:func:`ir_bundle_from_path` from a path to the ``.xml`` (the ``.bin`` beside
it), read with the caller's own permissions. The driver never opens a path:
everything it reads arrives in the buffer. ONNX models that name external
data files are refused (:class:`InvalidArgument`): the client passes their
bytes, a driver never resolves a path named inside a model.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from npumanager.errors import InvalidArgument

IR_MAGIC = b"NPUOVIR1"
_HEADER = struct.Struct("<8sQQ")


def pack_ir(xml: bytes, weights: bytes) -> bytes:
    """One buffer holding an IR's topology and weights, for ``prepare_model``."""
    return _HEADER.pack(IR_MAGIC, len(xml), len(weights)) + bytes(xml) + bytes(weights)


def ir_bundle_from_path(xml_path: str | os.PathLike[str]) -> bytes:
    """The IR bundle of ``model.xml`` and the ``model.bin`` beside it."""
    xml_file = Path(xml_path)
    bin_file = xml_file.with_suffix(".bin")
    try:
        xml = xml_file.read_bytes()
        weights = bin_file.read_bytes() if bin_file.exists() else b""
    except OSError as exc:
        raise InvalidArgument(f"cannot read OpenVINO IR {xml_file}: {exc}") from None
    return pack_ir(xml, weights)


def is_ir_bundle(data: bytes) -> bool:
    return data[: len(IR_MAGIC)] == IR_MAGIC


def unpack_ir(data: bytes) -> tuple[memoryview, memoryview]:
    """The (xml, bin) views of an IR bundle; InvalidArgument if it is malformed."""
    if len(data) < _HEADER.size or not is_ir_bundle(data):
        raise InvalidArgument("not an OpenVINO IR bundle")
    _, n_xml, n_bin = _HEADER.unpack_from(data)
    if _HEADER.size + n_xml + n_bin != len(data):
        raise InvalidArgument(
            f"IR bundle of {len(data)} bytes announces {n_xml} bytes of xml and {n_bin} of weights"
        )
    view = memoryview(data)
    xml = view[_HEADER.size : _HEADER.size + n_xml]
    return xml, view[_HEADER.size + n_xml :]


def _graphs(graph: Any) -> Iterator[Any]:
    import onnx

    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _graphs(g)


def check_onnx_self_contained(onnx_bytes: bytes) -> None:
    """InvalidArgument unless ``onnx_bytes`` parse as ONNX and name no external data.

    OpenVINO's ONNX reader would resolve an external-data location against
    the driver's own working directory: a path chosen by the app, opened with
    the driver's rights. Refused before OpenVINO sees the model.
    """
    import onnx
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(onnx_bytes)
    except (DecodeError, ValueError) as exc:
        raise InvalidArgument(f"not an ONNX model: {exc}") from None
    if not model.graph.node and not model.graph.output:
        raise InvalidArgument("not an ONNX model (no graph)")
    for g in _graphs(model.graph):
        tensors = [*g.initializer, *(sp.values for sp in g.sparse_initializer)]
        for node in g.node:
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.TENSOR:
                    tensors.append(attr.t)
                elif attr.type == onnx.AttributeProto.TENSORS:
                    tensors.extend(attr.tensors)
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL or t.external_data:
                where = {e.key: e.value for e in t.external_data}.get("location", "?")
                raise InvalidArgument(
                    f"tensor {t.name!r} refers to external data {where!r}: a driver never "
                    "opens a path named inside a model; pass a self-contained model"
                )


__all__ = [
    "IR_MAGIC",
    "check_onnx_self_contained",
    "ir_bundle_from_path",
    "is_ir_bundle",
    "pack_ir",
    "unpack_ir",
]
