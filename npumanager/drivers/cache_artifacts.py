"""The reference driver's cache hooks (``OrtModel.artifacts``, ``ReferenceDriver.load_artifacts``).

Thin glue between :mod:`npumanager.drivers.reference` and
:mod:`npumanager.drivers.reference_cache`, kept here so the reference driver
does not depend on the cache modules at import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from npumanager.drivers.reference_cache import artifacts_from_onnx, session_from_artifacts
from npumanager.errors import GeneralFailure

if TYPE_CHECKING:
    from npumanager.drivers.base import CompileOptions
    from npumanager.drivers.reference import OrtModel, ReferenceDriver


def _io_bytes(session: Any) -> int:
    from npumanager.drivers.base import TensorInfo
    from npumanager.drivers.reference import _ORT_TYPES, _shape

    total = 0
    for t in list(session.get_inputs()) + list(session.get_outputs()):
        info = TensorInfo(t.name, _ORT_TYPES.get(t.type, "float32"), _shape(t.shape))
        total += info.static_nbytes() or 0
    return total


def reference_artifacts(model: OrtModel) -> tuple[list[bytes], list[bytes]]:
    """Model and data cache blobs for a model the reference driver compiled."""
    onnx_bytes = getattr(model, "_serialized", None)
    session = model.session
    if onnx_bytes is None or session is None:
        raise GeneralFailure("this model has no source to cache (loaded from cache or released)")
    level = session.get_session_options().graph_optimization_level
    n_model, n_data = getattr(model, "cache_counts", (1, 1))
    return artifacts_from_onnx(onnx_bytes, level, n_model, n_data)


def reference_load(
    driver: ReferenceDriver,
    model_blobs: list[bytes],
    data_blobs: list[bytes],
    options: CompileOptions,
) -> OrtModel:
    """An OrtModel from verified cache blobs."""
    from npumanager.drivers.reference import OrtModel

    session = session_from_artifacts(
        model_blobs, data_blobs, intra_op_threads=getattr(driver, "intra_op_threads", 1)
    )
    weights = sum(len(b) for b in data_blobs) or sum(len(b) for b in model_blobs)
    return OrtModel(session, weights + 2 * _io_bytes(session) + (1 << 20), None)


__all__ = ["reference_artifacts", "reference_load"]
