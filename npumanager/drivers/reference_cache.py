"""Cache artifacts of the reference (ONNX Runtime) backend.

- Model cache: the graph as ONNX Runtime optimized it
  (``SessionOptions.optimized_model_filepath``), with every initializer moved
  out to an external data file named :data:`DATA_NAME`. It is small: the graph
  and the offsets of the weights.
- Data cache: that external data file, i.e. the raw initializer bytes.

With several files of a kind, the kind's bytes are cut into that many
contiguous pieces; loading concatenates them again. With no data-cache file
the weights stay inside the model cache.

Loading runs only on buffers the verifier accepted. Even so, it parses the
model with the onnx protobuf classes only (no pickle, nothing executable), and
refuses any external-data reference other than :data:`DATA_NAME` within the
data cache's bounds before ONNX Runtime sees the model: the weights are handed
to ONNX Runtime from memory, so it never opens a file named by the cache.
The optimized graph is loaded with graph optimizations disabled: they already
ran, which is the time the cache saves.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

from npumanager.drivers.lowering import native
from npumanager.drivers.ort_tuning import SessionTuning
from npumanager.drivers.ort_values import refuse_packed_model
from npumanager.drivers.reference_external import OrtBinding
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.tensorio.onnx_external import external_refs

#: The external-data file name the optimized model refers to.
DATA_NAME = "npu-data-cache.bin"
_MODEL_NAME = "npu-model-cache.onnx"

OptLevel = str | int | Any  # "disabled" | "basic" | "extended" | "all", 0..99, or ORT's enum

_LEVELS = {"disabled": 0, "basic": 1, "extended": 2, "layout": 3, "all": 99}


def ort_level(opt_level: OptLevel) -> Any:
    """ONNX Runtime's GraphOptimizationLevel for a name, number or the enum itself."""
    import onnxruntime as ort

    levels = {
        0: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        2: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        99: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
    layout = getattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT", None)
    if layout is not None:
        levels[3] = layout
    if isinstance(opt_level, ort.GraphOptimizationLevel):
        return opt_level
    if isinstance(opt_level, str):
        key = opt_level.lower().removeprefix("ort_").removeprefix("enable_")
        if key == "disable_all":
            key = "disabled"
        if key not in _LEVELS:
            raise InvalidArgument(f"unknown optimization level {opt_level!r}")
        opt_level = _LEVELS[key]
    if isinstance(opt_level, int) and opt_level in levels:
        return levels[opt_level]
    raise InvalidArgument(f"unknown optimization level {opt_level!r}")


def _split(blob: bytes, n: int) -> list[bytes]:
    """``blob`` cut into ``n`` contiguous pieces (the last ones may be empty)."""
    if n == 1:
        return [blob]
    step = -(-len(blob) // n) if blob else 0
    return [blob[i * step : (i + 1) * step] for i in range(n)]


def _join(blobs: Sequence[bytes | memoryview]) -> bytes | memoryview:
    return blobs[0] if len(blobs) == 1 else b"".join(blobs)


def _scratch_dir() -> str | None:
    """Where ORT writes the artifacts we read straight back: memory (/dev/shm) if possible.

    The files live for one compile; on a disk-backed /tmp writing a few hundred
    MiB of weights there would cost more than the compile.
    """
    env = os.environ.get("NPU_SCRATCH_DIR")
    if env:
        return env
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


def base_session_options(opt_level: OptLevel, intra_op_threads: int = 1,
                         spinning: bool = True, tuning: SessionTuning | None = None) -> Any:
    """``tuning``: a background session's options beyond these (its level is the caller's
    ``opt_level``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort_level(opt_level)
    so.intra_op_num_threads = intra_op_threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3  # ORT warns about hardware-specific layouts: intended here
    if not spinning:
        no_spinning(so)
    if tuning is not None:
        tuning.apply(so)
    return so


def no_spinning(so: Any) -> None:
    """ONNX Runtime's pool threads block for work instead of spinning for it (both pools;
    with one intra-op thread there is no pool, so this changes nothing)."""
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")


def compile_with_artifacts(
    onnx_bytes: bytes,
    opt_level: OptLevel,
    n_model: int = 1,
    n_data: int = 1,
    *,
    intra_op_threads: int = 1,
    binding: OrtBinding | None = None,
    min_external_bytes: int = 0,
    prepack: bool = True,
    spinning: bool = True,
    tuning: SessionTuning | None = None,
) -> tuple[Any, list[bytes], list[bytes]]:
    """Compile ``onnx_bytes`` once; the session and its model/data cache blobs.
    ``binding``: the model's external data (:mod:`.reference_external`; it then holds the
    bytes to compile), which the data cache gets like every other initializer.
    ``min_external_bytes``: initializers smaller than this stay in the model blob (ONNX
    Runtime cannot infer shapes from a Reshape's shape tensor given from memory).
    ``prepack=False`` for a caller that only wants the blobs (the compile worker): ONNX
    Runtime then skips copying the weights into its packed layouts, which it does after
    the optimized model is written, so the blobs are the same (tests/drivers/
    test_reference_cache.py checks it); the session it returns runs slower (an
    embedder's batches 2x), so it is not one to keep. For the 32 MiB LLM of
    bench/contention.py that halves the compile (156 -> 77 ms, 119 -> 54 ms)."""
    import onnxruntime as ort

    if n_model < 1 or n_data < 0:
        raise InvalidArgument(f"cannot cache into {n_model} model and {n_data} data files")
    so = base_session_options(opt_level, intra_op_threads, spinning, tuning)
    if binding is not None:
        binding.apply(so)
        onnx_bytes = binding.onnx
    with tempfile.TemporaryDirectory(prefix="npu-cache-", dir=_scratch_dir()) as tmp:
        model_path = os.path.join(tmp, _MODEL_NAME)
        data_path = os.path.join(tmp, DATA_NAME)
        so.optimized_model_filepath = model_path
        if not prepack:
            so.add_session_config_entry("session.disable_prepacking", "1")
        if n_data > 0:
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", DATA_NAME
            )
            so.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes",
                str(min_external_bytes)
            )
        try:
            with native():  # (a background thread lowered only for native work: .lowering)
                session = ort.InferenceSession(
                    onnx_bytes, sess_options=so, providers=["CPUExecutionProvider"]
                )
        except Exception as exc:
            refuse_packed_model(onnx_bytes)  # the reason, if it is one, in words
            raise InvalidArgument(f"ONNX Runtime cannot prepare this model: {exc}") from None
        with open(model_path, "rb") as f:
            model_blob = f.read()
        data_blob = b""
        if n_data > 0 and os.path.exists(data_path):
            with open(data_path, "rb") as f:
                data_blob = f.read()
    data_blobs = _split(data_blob, n_data) if n_data > 0 else []
    return session, _split(model_blob, n_model), data_blobs


def artifacts_from_onnx(
    onnx_bytes: bytes, opt_level: OptLevel, n_model: int = 1, n_data: int = 1, *,
    binding: OrtBinding | None = None,
) -> tuple[list[bytes], list[bytes]]:
    """The model cache and data cache blobs for ``onnx_bytes`` at ``opt_level``."""
    _, model_blobs, data_blobs = compile_with_artifacts(onnx_bytes, opt_level, n_model, n_data,
                                                        binding=binding)
    return model_blobs, data_blobs


def check_external_refs(model: Any, data_len: int) -> int:
    """Refuse external data other than DATA_NAME within ``data_len`` (GeneralFailure naming
    the tensor and the location); the number of refs. Every tensor counts: initializers,
    node attributes, subgraphs, functions (the walk the host's own check uses)."""
    try:
        refs = external_refs(model)
    except ValueError as exc:
        raise GeneralFailure(f"cached model: {exc}") from None
    for ref in refs:
        if ref.location != DATA_NAME:
            raise GeneralFailure(f"cached model: tensor {ref.name!r} refers to external data "
                                 f"{ref.location!r}")
        end = ref.offset + (data_len - ref.offset if ref.length is None else ref.length)
        if end > data_len:
            raise GeneralFailure(f"cached model: tensor {ref.name!r} refers past the end of "
                                 "its data cache")
    return len(refs)


def session_from_artifacts(
    model_blobs: Sequence[bytes], data_blobs: Sequence[bytes | memoryview], *,
    intra_op_threads: int = 1, spinning: bool = True, tuning: SessionTuning | None = None
) -> Any:
    """An InferenceSession from verified cache blobs; GeneralFailure if they do not load."""
    import onnx
    import onnxruntime as ort
    from google.protobuf.message import DecodeError

    if not model_blobs:
        raise GeneralFailure("no model cache")
    model_bytes = bytes(_join(model_blobs))  # small (the weights are in the data blobs)
    data = _join(data_blobs) if data_blobs else b""
    model = onnx.ModelProto()
    try:
        model.ParseFromString(model_bytes)
    except (DecodeError, ValueError) as exc:
        raise GeneralFailure(f"model cache does not parse: {exc}") from None
    refs = check_external_refs(model, len(data))
    so = base_session_options("disabled", intra_op_threads, spinning, tuning)
    if refs:
        so.add_external_initializers_from_files_in_memory([DATA_NAME], [data], [len(data)])
    try:
        # 45-95 ms of native work for the bench's 32 MiB model, GIL released (weights
        # copied, prepacked): lowered on a thread lowered only around such work.
        with native():
            return ort.InferenceSession(
                model_bytes, sess_options=so, providers=["CPUExecutionProvider"]
            )
    except Exception as exc:
        raise GeneralFailure(f"ONNX Runtime cannot load the cached model: {exc}") from None


__all__ = [
    "DATA_NAME",
    "artifacts_from_onnx",
    "base_session_options",
    "check_external_refs",
    "compile_with_artifacts",
    "no_spinning",
    "ort_level",
    "session_from_artifacts",
]
