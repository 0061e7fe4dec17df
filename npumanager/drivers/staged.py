"""JIT and multi-stage compilation, with cache rewrites under file locks.

A driver option (``compile_mode``) chooses how ``prepare_model`` compiles:

- ``eager`` (default): compile fully at prepare.
- ``jit``: prepare only reads the model's signature; the full compile happens at
  the first execution (which waits for it). The cache is written then, in the
  background.
- ``multistage``: prepare compiles quickly (basic optimizations) and that stage
  is what the prepare writes to the cache. After ``recompile_after``
  executions a background thread recompiles with full optimization, swaps the
  new model in (runs in flight finish on the old one) and rewrites the cache.

Later writes go through a :class:`CacheRewriter`, which dups the cache fds at
prepare time (the host closes its own when the prepare returns) and writes via
``DriverCache.save``: exclusive ``flock`` on every file of the entry, truncate,
write, fsync, re-record the verifier tag, unlock. Readers verify under the
shared lock, so none sees a half-written entry or a file/tag mix, and two
writers never interleave.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np

from npumanager.drivers.base import PreparedModel, TensorInfo
from npumanager.drivers.cache_io import dup_fds
from npumanager.drivers.onnx_types import graph_specs
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.fds import close_fds

log = logging.getLogger(__name__)

MODES = ("eager", "jit", "multistage")
DEFAULT_RECOMPILE_AFTER = 8

Blobs = tuple[list[bytes], list[bytes]]
#: (optimization level, want cache artifacts) -> (model, artifacts or None)
CompileFn = Callable[[str, bool], tuple[PreparedModel, Blobs | None]]
#: DriverCache.save's signature: (token, model fds, data fds, model blobs, data blobs) -> saved
SaveFn = Callable[[bytes, list[int], list[int], list[bytes], list[bytes]], bool]


def check_mode(mode: object) -> str:
    m = str(mode).lower().replace("-", "").replace("_", "")
    if m not in MODES:
        raise InvalidArgument(f"compile_mode must be one of {MODES}, not {mode!r}")
    return m


class CacheRewriter:
    """The cache entry of one prepare, kept (as dup'd fds) for later rewrites."""

    def __init__(
        self, save: SaveFn, token: bytes, model_fds: Sequence[int], data_fds: Sequence[int]
    ) -> None:
        self._save = save
        self._token = bytes(token)
        self._model = dup_fds(model_fds)
        try:
            self._data = dup_fds(data_fds)
        except GeneralFailure:
            close_fds(self._model)
            raise
        self._lock = threading.Lock()
        self._closed = False
        self.writes = 0

    def write(self, model_blobs: list[bytes], data_blobs: list[bytes]) -> bool:
        """Rewrite the entry (locks, write, fsync, re-record); False on any failure."""
        with self._lock:
            if self._closed:
                return False
            try:
                ok = bool(self._save(self._token, self._model, self._data, model_blobs, data_blobs))
            except Exception as exc:
                log.warning("cache rewrite failed: %s", exc)
                return False
            self.writes += ok
            return ok

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                close_fds(self._model + self._data)


class StagedModel(PreparedModel):
    """A prepared model compiled at first use (JIT) or in two stages (multi-stage)."""

    def __init__(
        self,
        mode: str,
        compile_fn: CompileFn,
        *,
        inputs: list[TensorInfo],
        outputs: list[TensorInfo],
        memory_bytes: int,
        recompile_after: int = DEFAULT_RECOMPILE_AFTER,
        fast_level: str = "basic",
        full_level: str = "all",
    ) -> None:
        self.mode = check_mode(mode)
        if self.mode == "eager":
            raise InvalidArgument("an eager compile needs no StagedModel")
        if recompile_after < 1:
            raise InvalidArgument("recompile_after must be at least 1")
        self._compile = compile_fn
        self.recompile_after = recompile_after
        self.fast_level, self.full_level = fast_level, full_level
        self.inputs, self.outputs, self.memory_bytes = inputs, outputs, memory_bytes
        self._lock = threading.Lock()
        self._inner: PreparedModel | None = None
        self._blobs: Blobs | None = None
        self._rewriter: CacheRewriter | None = None
        self._background: threading.Thread | None = None
        self._released = False
        self.stage = 0  # 0 not compiled, 1 fast, 2 fully optimized
        self.runs = 0
        if self.mode == "multistage":
            inner, _ = compile_fn(fast_level, False)
            self._adopt(inner, None, 1)

    def _adopt(self, inner: PreparedModel, blobs: Blobs | None, stage: int) -> None:
        self._inner, self._blobs, self.stage = inner, blobs, stage
        self.inputs, self.outputs = inner.inputs, inner.outputs
        self.memory_bytes = max(self.memory_bytes, inner.memory_bytes)

    # --- the host's hooks -------------------------------------------------------------

    def attach_cache(self, rewriter: CacheRewriter) -> None:
        """Keep the prepare's cache entry for the rewrites to come."""
        with self._lock:
            if self._released:
                rewriter.close()
                return
            if self._rewriter is not None:
                self._rewriter.close()
            self._rewriter = rewriter
            pending = self.mode == "jit" and self.stage == 2
        if pending:  # a JIT compile already ran (an execution came first)
            self._start(self._write_current)

    def artifacts(self) -> Blobs:
        """The current stage's cache blobs (a JIT model has none until it runs)."""
        with self._lock:
            inner, blobs, stage = self._inner, self._blobs, self.stage
        if inner is None:
            raise NotImplementedError("JIT: the model compiles, and is cached, at first execution")
        if blobs is None:
            blobs = inner.artifacts()
            with self._lock:
                if self.stage == stage and self._blobs is None:
                    self._blobs = blobs
        return blobs

    # --- execution ---------------------------------------------------------------------

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inner = self._inner if self._inner is not None else self._jit_compile()
        out = inner.run(inputs)
        with self._lock:
            self.runs += 1
            due = (
                self.mode == "multistage"
                and self.stage == 1
                and self.runs >= self.recompile_after
                and self._background is None
                and not self._released
            )
        if due:
            self._start(self._recompile)
        return out

    def _jit_compile(self) -> PreparedModel:
        with self._lock:
            if self._inner is not None:
                return self._inner
            if self._released:
                raise GeneralFailure("the model was released")
            want = self._rewriter is not None
            inner, blobs = self._compile(self.full_level, want)
            self._adopt(inner, blobs, 2)
        if want:
            self._start(self._write_current)
        return inner

    def _recompile(self) -> None:
        with self._lock:
            want = self._rewriter is not None
        inner, blobs = self._compile(self.full_level, want)
        with self._lock:
            if self._released:
                inner.release()
                return
            # Runs in flight keep the old model; it is freed once they drop it.
            self._adopt(inner, blobs, 2)
        if want:
            self._write_current()

    def _write_current(self) -> None:
        blobs = self.artifacts()
        with self._lock:
            rewriter = self._rewriter
        if rewriter is not None and rewriter.write(*blobs):
            log.info("%s: cache rewritten at stage %d", self.mode, self.stage)

    def _start(self, fn: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                fn()
            except Exception as exc:  # a background stage never breaks the model
                log.warning("%s background work failed: %s", self.mode, exc)

        with self._lock:
            previous = self._background
        if previous is not None:
            previous.join()
        t = threading.Thread(target=guarded, name=f"npu-{self.mode}", daemon=True)
        with self._lock:
            self._background = t
        t.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for background recompiles/rewrites; whether none is running."""
        with self._lock:
            t = self._background
        if t is not None:
            t.join(timeout)
            return not t.is_alive()
        return True

    def abort(self) -> None:
        inner = self._inner
        if inner is not None:
            inner.abort()

    def release(self) -> None:
        with self._lock:
            self._released = True
            inner, self._inner = self._inner, None
            rewriter, self._rewriter = self._rewriter, None
            self._blobs = None
        if rewriter is not None:
            rewriter.close()
        if inner is not None:
            inner.release()


def onnx_signature(onnx_bytes: bytes) -> tuple[list[TensorInfo], list[TensorInfo], int]:
    """Inputs, outputs and weight bytes read from the ONNX graph, without compiling."""
    import onnx
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(onnx_bytes)
    except (DecodeError, ValueError) as exc:
        raise InvalidArgument(f"not an ONNX model: {exc}") from None
    g = model.graph
    weights = 0
    for t in g.initializer:
        n = int(np.prod(t.dims, dtype=np.int64)) if t.dims else 1
        try:
            weights += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except (KeyError, ValueError, TypeError):
            weights += 4 * n
    inputs, outputs = graph_specs(model)
    return inputs, outputs, weights


__all__ = [
    "DEFAULT_RECOMPILE_AFTER",
    "MODES",
    "CacheRewriter",
    "StagedModel",
    "check_mode",
    "onnx_signature",
]
