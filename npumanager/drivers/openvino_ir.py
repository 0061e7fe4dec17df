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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npumanager.drivers.external_data import inline
from npumanager.errors import InvalidArgument
from npumanager.tensorio.onnx_external import external_refs, parse_onnx

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


def check_onnx_self_contained(onnx_bytes: bytes) -> None:
    """InvalidArgument unless ``onnx_bytes`` parse as ONNX and name no external data.

    OpenVINO's ONNX reader would resolve an external-data location against
    the driver's own working directory: a path chosen by the app, opened with
    the driver's rights. Refused before OpenVINO sees the model (the host binds
    a model's external data to the files its client sent, and the driver puts
    those bytes inline first: :func:`with_external_inline`).
    """
    model = parse_onnx(onnx_bytes)
    if model is None:
        raise InvalidArgument("not an ONNX model")
    if not model.graph.node and not model.graph.output:
        raise InvalidArgument("not an ONNX model (no graph)")
    try:
        refs = external_refs(model)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    for ref in refs:
        raise InvalidArgument(
            f"tensor {ref.name!r} refers to external data {ref.location!r}: a driver never "
            "opens a path named inside a model; prepare it from its path "
            "(nn.Device.prepare_model(path)), which sends the files it names"
        )


def with_external_inline(onnx_bytes: bytes, external: Mapping[str, Any]) -> bytes:
    """The model with the external data the host bound put inline (OpenVINO reads ONNX
    from one buffer only, so such a model must stay under protobuf's 2 GiB: a larger
    one comes as an IR)."""
    if not external:
        return onnx_bytes
    model = parse_onnx(onnx_bytes)
    if model is None:
        raise InvalidArgument("external data files go with an ONNX model; this is not one")
    inline(model, external)
    try:
        return bytes(model.SerializeToString())
    except (ValueError, RuntimeError):
        raise InvalidArgument("with its external data inline this model passes protobuf's "
                              "2 GiB; give OpenVINO an IR (xml + bin) instead") from None


__all__ = [
    "IR_MAGIC",
    "check_onnx_self_contained",
    "ir_bundle_from_path",
    "is_ir_bundle",
    "pack_ir",
    "unpack_ir",
    "with_external_inline",
]
