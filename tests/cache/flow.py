"""The NNAPI prepare flow (runtime + driver) over the cache modules, for tests and the bench.

Load from cache first (files opened without O_CREAT); any failure falls back to
a full compile that rewrites the files; only a failed compile reaches the caller.
"""

from __future__ import annotations

import os
from pathlib import Path

from npumanager.drivers.base import CompileOptions, Driver, PreparedModel
from npumanager.drivers.cache_store import DriverCache
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.fds import close_fds
from npumanager.nn.cache_files import cache_file_names, open_cache_files

OPTS = CompileOptions()


def try_load(
    driver: Driver, cache: DriverCache, token: bytes, cache_dir: str | os.PathLike[str]
) -> PreparedModel | None:
    model_paths, data_paths = cache_file_names(cache_dir, token, cache.n_model, cache.n_data)
    fds = open_cache_files(model_paths + data_paths, create=False)
    if fds is None:
        return None
    try:
        m, d = cache.load(token, fds[: cache.n_model], fds[cache.n_model :], uid=1001)
        return driver.load_artifacts(m, d, OPTS)
    except (GeneralFailure, InvalidArgument):
        return None
    finally:
        close_fds(fds)


def compile_and_save(
    driver: Driver,
    cache: DriverCache,
    onnx_bytes: bytes,
    token: bytes,
    cache_dir: str | os.PathLike[str],
) -> tuple[PreparedModel, bool]:
    # As the host does: one compile that also yields the artifacts, when the driver can.
    compile_fn = getattr(driver, "compile_with_artifacts", None) or driver.compile
    model = compile_fn(onnx_bytes, OPTS)
    model_paths, data_paths = cache_file_names(cache_dir, token, cache.n_model, cache.n_data)
    fds = open_cache_files(model_paths + data_paths, create=True)
    saved = False
    if fds is not None:
        try:
            blobs_m, blobs_d = model.artifacts()
            saved = cache.save(token, fds[: cache.n_model], fds[cache.n_model :], blobs_m, blobs_d,
                               uid=1001)
        finally:
            close_fds(fds)
    return model, saved


def prepare(
    driver: Driver, cache: DriverCache, onnx_bytes: bytes, token: bytes, cache_dir: Path | str
) -> tuple[PreparedModel, bool]:
    """(model, loaded_from_cache)."""
    model = try_load(driver, cache, token, cache_dir)
    if model is not None:
        return model, True
    return compile_and_save(driver, cache, onnx_bytes, token, cache_dir)[0], False
