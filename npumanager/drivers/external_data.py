"""A model's external data, bound to the files its client sent: the driver opens no path.

An ONNX model may keep tensors in files it names (``location``, relative to the
model). ONNX Runtime and OpenVINO resolve such a name against the process's
working directory when they load a model from bytes, so a root driver would
read whatever file an app names (``etc/shadow``, ``../../var/lib/npu/...``) and
hand it back as a tensor: the confused deputy. Here the client opens the files
with the app's own rights and sends them as fds (``PrepareModel.external_locations``
names one location string per fd), and :func:`bind` resolves every reference
against those fds only:

* a reference to a location the client did not send is an InvalidArgument
  naming the tensor and the location, whatever the backend;
* each referenced range is read (``pread``, so a file shrunk meanwhile is a short
  read, never a SIGBUS) into memory of the driver's own and bound bounds-checked;
* initializers of the main graph with a plain numeric type keep an external
  reference, renamed to a location of the driver's (``npu-external-N``, offset
  0), whose bytes travel to the backend in ``CompileOptions.external_data``: a
  backend can hand them over without a copy, and a model past protobuf's 2 GiB
  keeps working; every other tensor gets its bytes inline.

:func:`check_bound` is the backends' own check: every reference left in the
model they are given must name a buffer they were given.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from npumanager.errors import InvalidArgument
from npumanager.tensorio.onnx_external import ExternalRef, external_refs, parse_onnx

#: Locations the driver gives the external data it bound (never a client's name).
BOUND_PREFIX = "npu-external-"
_DEFAULT = 0  # onnx.TensorProto.DEFAULT
_STRING = 8  # onnx.TensorProto.STRING
#: Element types (onnx.TensorProto) a backend may bind straight from a buffer.
BINDABLE = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
            7: "int64", 9: "bool", 10: "float16", 11: "float64", 12: "uint32",
            13: "uint64"}
_READ_CHUNK = 64 << 20
_HOW = ("prepare the model from its path (nn.Device.prepare_model(path)): the client then "
        "sends the files it names")


@dataclass(frozen=True)
class SentFile:
    """An external data file as the client sent it: the location string it stands for
    and an fd of it (never reopened by path)."""

    location: str
    fd: int
    size: int


def sent_files(locations: Sequence[str], fds: Sequence[int]) -> dict[str, SentFile]:
    """The client's files by location; InvalidArgument for a duplicate or empty location
    or an fd that is not a regular file (memfds are)."""
    if len(locations) != len(fds):
        raise InvalidArgument(f"{len(locations)} external data locations, {len(fds)} fds")
    files: dict[str, SentFile] = {}
    for location, fd in zip(locations, fds, strict=True):
        if not location:
            raise InvalidArgument("an external data file needs the location it stands for")
        if location in files:
            raise InvalidArgument(f"external data location {location!r} was sent twice")
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"the fd sent for external data {location!r} is not a "
                                  "regular file")
        files[location] = SentFile(location, fd, st.st_size)
    return files


def _nbytes(tensor: Any) -> int | None:
    """The bytes a tensor of fixed-size elements needs (None otherwise)."""
    name = BINDABLE.get(tensor.data_type)
    if name is None:
        return None
    return int(np.prod(tensor.dims, dtype=np.int64)) * np.dtype(name).itemsize


def _read(fd: int, offset: int, length: int, location: str) -> np.ndarray:
    buf = np.empty(length, np.uint8)
    view = buf.data
    pos = 0
    while pos < length:
        n = os.preadv(fd, [view[pos : pos + _READ_CHUNK]], offset + pos)
        if n <= 0:
            raise InvalidArgument(f"external data {location!r} ended after {pos} of the "
                                  f"{length} bytes at offset {offset} (it changed meanwhile?)")
        pos += n
    return buf


def _set_external(tensor: Any, location: str, length: int) -> None:
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def bind(onnx_bytes: bytes, files: Mapping[str, SentFile], *, max_bytes: int,
         accepts: bool = True, driver: str = "driver") -> tuple[bytes, dict[str, np.ndarray]]:
    """The model to compile and its bound external data (see the module docstring).

    ``accepts``: whether the driver takes external data at all. Bytes that do not parse
    as ONNX pass unchanged (they are the backend's own format), but not with files."""
    model = parse_onnx(onnx_bytes)
    if model is None:
        if files:
            raise InvalidArgument("external data files go with an ONNX model; this is not one")
        return onnx_bytes, {}
    try:
        refs = external_refs(model)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    if not refs:
        return onnx_bytes, {}
    for ref in refs:
        if ref.location not in files:
            raise InvalidArgument(
                f"tensor {ref.name!r} refers to external data {ref.location!r}, which the "
                f"client did not send: a driver never opens a path named inside a model; "
                f"{_HOW}")
    if not accepts:
        raise InvalidArgument(f"driver {driver} takes no external data; send a "
                              "self-contained model")
    buffers: dict[str, np.ndarray] = {}
    total = 0
    for i, ref in enumerate(refs):
        f, tensor = files[ref.location], ref.tensor
        length = f.size - ref.offset if ref.length is None else ref.length
        if length < 0 or ref.offset + length > f.size:
            raise InvalidArgument(
                f"tensor {ref.name!r} needs bytes {ref.offset}..{ref.offset + max(length, 0)} "
                f"of external data {ref.location!r}, which holds {f.size}")
        want = _nbytes(tensor)
        if want is not None and want != length:
            raise InvalidArgument(f"tensor {ref.name!r} needs {want} bytes; its external data "
                                  f"reference {ref.location!r} gives {length}")
        if tensor.data_type == _STRING:
            raise InvalidArgument(f"tensor {ref.name!r}: strings cannot be external data")
        total += length
        if total > max_bytes:
            raise InvalidArgument(f"the model's external data passes driver {driver}'s limit "
                                  f"of {max_bytes} bytes")
        data = _read(f.fd, ref.offset, length, ref.location)
        if ref.main_initializer and want is not None:
            key = f"{BOUND_PREFIX}{i}"
            _set_external(tensor, key, length)
            buffers[key] = data
        else:
            put_inline(tensor, data)
    try:
        return model.SerializeToString(), buffers
    except (ValueError, RuntimeError) as exc:
        raise InvalidArgument(f"the model with its small tensors inline is too large for "
                              f"protobuf: {exc}") from None


def check_bound(model: Any, external: Mapping[str, Any]
                ) -> list[tuple[ExternalRef, np.ndarray]]:
    """Every external reference of ``model`` (an onnx.ModelProto) against the buffers a
    backend was given: the (reference, its bytes) pairs, or InvalidArgument naming a tensor
    whose bytes were not given (the backend must not go looking for them)."""
    try:
        refs = external_refs(model)
    except ValueError as exc:
        raise InvalidArgument(str(exc)) from None
    out = []
    for ref in refs:
        buf = external.get(ref.location)
        if buf is None:
            raise InvalidArgument(
                f"tensor {ref.name!r} refers to external data {ref.location!r}, which the "
                f"client did not send: a driver never opens a path named inside a model; "
                f"{_HOW}")
        data = np.frombuffer(buf, np.uint8)
        length = data.size - ref.offset if ref.length is None else ref.length
        if length < 0 or ref.offset + length > data.size:
            raise InvalidArgument(f"tensor {ref.name!r} refers past the end of external data "
                                  f"{ref.location!r}")
        out.append((ref, data[ref.offset : ref.offset + length]))
    return out


def inline(model: Any, external: Mapping[str, Any]) -> Any:
    """``model`` with every external tensor's bytes inline (for a backend that reads ONNX
    only from one buffer); InvalidArgument as :func:`check_bound`."""
    for ref, data in check_bound(model, external):
        put_inline(ref.tensor, data)
    return model


def put_inline(tensor: Any, data: np.ndarray) -> None:
    """Give ``tensor`` its bytes inline instead of its external reference."""
    del tensor.external_data[:]
    tensor.data_location = _DEFAULT
    tensor.raw_data = data.tobytes()


__all__ = ["BINDABLE", "BOUND_PREFIX", "SentFile", "bind", "check_bound", "inline",
           "put_inline", "sent_files"]
