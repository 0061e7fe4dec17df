"""The reference driver's cache hooks (``OrtModel.artifacts``, ``ReferenceDriver.load_artifacts``).

Thin glue between :mod:`npumanager.drivers.reference` and
:mod:`npumanager.drivers.reference_cache`, kept here so the reference driver
does not depend on the cache modules at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from npumanager.drivers.reference_cache import artifacts_from_onnx, session_from_artifacts
from npumanager.drivers.reference_external import ort_binding
from npumanager.errors import GeneralFailure, InvalidArgument

if TYPE_CHECKING:
    from npumanager.drivers.base import CompileOptions, PreparedModel
    from npumanager.drivers.compile_worker import CompileWorker
    from npumanager.drivers.ort_tuning import SessionTuning
    from npumanager.drivers.reference import OrtModel, ReferenceDriver



def _threads(driver: Any, options: CompileOptions) -> int:
    """The session's intra-op threads for the model's execution class."""
    name = "intra_op_threads_bg" if options.background else "intra_op_threads_fg"
    return int(getattr(driver, name, getattr(driver, "intra_op_threads", 1)))


def _spinning(driver: Any, options: CompileOptions) -> bool:
    """Whether the session's intra-op pool spins for work (ONNX Runtime's default)."""
    name = "intra_op_spinning_bg" if options.background else "intra_op_spinning_fg"
    return bool(getattr(driver, name, True))


def _tuning(driver: Any, options: CompileOptions) -> SessionTuning | None:
    """The session's options beyond the defaults (background sessions: .ort_tuning)."""
    tuning = getattr(driver, "tuning", None)
    return None if tuning is None else tuning(options)


def _io_bytes(session: Any) -> int:
    from npumanager.drivers.base import TensorInfo
    from npumanager.drivers.reference import _ORT_TYPES, _shape

    total = 0
    for t in list(session.get_inputs()) + list(session.get_outputs()):
        info = TensorInfo(t.name, _ORT_TYPES.get(t.type, "float32"), _shape(t.shape))
        total += info.static_nbytes() or 0
    return total


def reference_compile_with_artifacts(
    driver: ReferenceDriver, onnx_bytes: bytes, options: CompileOptions
) -> PreparedModel:
    """Compile once, keeping the cache blobs for the ``artifacts()`` call that follows."""
    from npumanager.drivers.reference_cache import compile_with_artifacts

    if str(driver.options.get("compile_mode", "eager")) != "eager":
        return driver.compile(onnx_bytes, options)
    counts = (int(driver.n_model_cache), int(driver.n_data_cache))
    if counts[0] < 1:
        return driver.compile(onnx_bytes, options)
    level = driver.session_options(options).graph_optimization_level
    binding = ort_binding(onnx_bytes, options.external_data)
    session, m, d = compile_with_artifacts(
        onnx_bytes, level, *counts, intra_op_threads=_threads(driver, options),
        binding=binding, spinning=_spinning(driver, options), tuning=_tuning(driver, options),
    )
    binding.session_created()
    model = driver.prepared(session, onnx_bytes, binding)
    model.cache_counts = counts
    model._cache_blobs = (m, d)  # type: ignore[attr-defined]
    return model


def reference_worker_compile(
    driver: ReferenceDriver, worker: CompileWorker, onnx: bytes | tuple[int, int],
    options: CompileOptions, caching: bool, max_bytes: int,
) -> PreparedModel | None:
    """The model compiled in ``worker`` and loaded from its blobs by the cache's loader;
    None for what the worker does not do (JIT / multi-stage modes, a cache with the
    weights inside the model file: loading that would parse them here, GIL held)."""
    counts = (int(driver.n_model_cache), int(driver.n_data_cache)) if caching else (1, 1)
    if str(driver.options.get("compile_mode", "eager")) != "eager" or min(counts) < 1:
        return None
    level = int(driver.session_options(options).graph_optimization_level)
    model_blobs, data_blobs = worker.compile(
        onnx, level=level, threads=_threads(driver, options), n_model=counts[0],
        n_data=counts[1], max_bytes=max_bytes)
    try:
        model = reference_load(driver, model_blobs, data_blobs, options)
    except GeneralFailure as exc:
        # What the worker wrote does not load here (an ONNX Runtime limit on optimized
        # models): compile in this process, as without a worker.
        import logging

        logging.getLogger("npumanager.drivers.reference").warning(
            "the compile worker's model does not load (%s); compiling in the host", exc)
        return None
    model.cache_counts = counts
    if caching:
        model._cache_blobs = (model_blobs, data_blobs)  # type: ignore[attr-defined]
    return model


def reference_artifacts(model: OrtModel) -> tuple[list[bytes], list[bytes]]:
    """Model and data cache blobs for a model the reference driver compiled."""
    stashed = getattr(model, "_cache_blobs", None)
    if stashed is not None:
        model._cache_blobs = None  # type: ignore[attr-defined]  # handed out once: free the copy
        return stashed  # type: ignore[no-any-return]
    onnx_bytes = getattr(model, "_serialized", None)
    session = model.session
    if onnx_bytes is None or session is None:
        raise GeneralFailure("this model has no source to cache (loaded from cache or released)")
    level = session.get_session_options().graph_optimization_level
    n_model, n_data = getattr(model, "cache_counts", (1, 1))
    return artifacts_from_onnx(onnx_bytes, level, n_model, n_data, binding=model.binding)


def reference_load(
    driver: ReferenceDriver,
    model_blobs: Sequence[bytes],
    data_blobs: Sequence[bytes | memoryview],
    options: CompileOptions,
) -> OrtModel:
    """An OrtModel from verified cache blobs."""
    from npumanager.drivers.onnx_types import onnx_specs, session_specs
    from npumanager.drivers.reference import OrtModel

    session = session_from_artifacts(
        model_blobs, data_blobs, intra_op_threads=_threads(driver, options),
        spinning=_spinning(driver, options), tuning=_tuning(driver, options),
    )
    weights = sum(len(b) for b in data_blobs) or sum(len(b) for b in model_blobs)
    try:  # the graph's own types (the model blob is the optimized ONNX graph)
        specs = onnx_specs(b"".join(model_blobs))
    except Exception:
        specs = session_specs(session)
    model = OrtModel(session, weights + 2 * _io_bytes(session) + (1 << 20), None, specs)
    model.queue = driver.queue
    return model


def reference_staged(
    driver: ReferenceDriver, onnx_bytes: bytes, options: CompileOptions, mode: str
) -> PreparedModel:
    """The reference driver's JIT / multi-stage model (driver option ``compile_mode``).

    Options: ``recompile_after`` (executions before the multi-stage recompile,
    default 8). JIT compiles at the level the preference asks for; multi-stage
    starts at "basic" and ends there too.
    """
    from npumanager.drivers.reference_cache import base_session_options, compile_with_artifacts
    from npumanager.drivers.staged import DEFAULT_RECOMPILE_AFTER, StagedModel, onnx_signature

    threads, spinning = _threads(driver, options), _spinning(driver, options)
    tuning = _tuning(driver, options)
    counts = (int(driver.n_model_cache), int(driver.n_data_cache))
    full = "basic" if options.preference == 0 else "all"
    if tuning is not None and tuning.level is not None:
        full = tuning.level
    # Checked now (a reference the host did not bind fails the prepare, not a later
    # execution) and kept for every later compile.
    binding = ort_binding(onnx_bytes, options.external_data)

    def compile_fn(
        level: str, want: bool
    ) -> tuple[PreparedModel, tuple[list[bytes], list[bytes]] | None]:
        import onnxruntime as ort

        blobs: tuple[list[bytes], list[bytes]] | None = None
        if want and counts[0] > 0:
            session, m, d = compile_with_artifacts(
                onnx_bytes, level, *counts, intra_op_threads=threads, binding=binding,
                spinning=spinning, tuning=tuning,
            )
            blobs = (m, d)
        else:
            so = base_session_options(level, threads, spinning, tuning)
            binding.apply(so)
            try:
                session = ort.InferenceSession(
                    binding.onnx, sess_options=so, providers=["CPUExecutionProvider"],
                )
            except Exception as exc:
                raise InvalidArgument(f"ONNX Runtime cannot prepare this model: {exc}") from None
        model = driver.prepared(session, onnx_bytes, binding)
        model.cache_counts = counts
        return model, blobs

    inputs, outputs, weights = onnx_signature(onnx_bytes)
    return StagedModel(
        mode,
        compile_fn,
        inputs=inputs,
        outputs=outputs,
        memory_bytes=weights + (1 << 20),
        recompile_after=int(driver.options.get("recompile_after", DEFAULT_RECOMPILE_AFTER)),
        full_level=full,
    )


__all__ = [
    "reference_artifacts",
    "reference_compile_with_artifacts",
    "reference_load",
    "reference_staged",
    "reference_worker_compile",
]
