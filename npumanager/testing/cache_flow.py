"""The NNAPI prepare flow (runtime + driver) over the driver's cache, for suites and benches.

Load from cache first (files opened without O_CREAT); any failure falls back to
a full compile that rewrites the files; only a failed compile reaches the caller.
Every entry belongs to the app's uid (``uid``, :data:`APP_UID` unless told).
This is what the client and the driver host do, run in one process so a test
can tamper with the files between the steps.
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
#: The uid of the app these flows play (the driver host takes it from SO_PEERCRED).
APP_UID = 1001


def entry_paths(cache: DriverCache, app: str | os.PathLike[str], token: bytes
                ) -> tuple[list[str], list[str]]:
    """The model and data cache file paths of ``token`` in the app's cache dir."""
    return cache_file_names(app, token, cache.n_model, cache.n_data)


def try_load(driver: Driver, cache: DriverCache, token: bytes,
             cache_dir: str | os.PathLike[str], *, uid: int = APP_UID
             ) -> PreparedModel | None:
    model_paths, data_paths = entry_paths(cache, cache_dir, token)
    fds = open_cache_files(model_paths + data_paths, create=False)
    if fds is None:
        return None
    try:
        m, d = cache.load(token, fds[: cache.n_model], fds[cache.n_model :], uid=uid)
        return driver.load_artifacts(m, d, OPTS)
    except (GeneralFailure, InvalidArgument):
        return None
    finally:
        close_fds(fds)


def compile_and_save(driver: Driver, cache: DriverCache, model: bytes, token: bytes,
                     cache_dir: str | os.PathLike[str], *, uid: int = APP_UID
                     ) -> tuple[PreparedModel, bool]:
    # As the host does: one compile that also yields the artifacts, when the driver can.
    compile_fn = getattr(driver, "compile_with_artifacts", None) or driver.compile
    prepared = compile_fn(model, OPTS)
    model_paths, data_paths = entry_paths(cache, cache_dir, token)
    fds = open_cache_files(model_paths + data_paths, create=True)
    saved = False
    if fds is not None:
        try:
            blobs_m, blobs_d = prepared.artifacts()
            saved = cache.save(token, fds[: cache.n_model], fds[cache.n_model :], blobs_m,
                               blobs_d, uid=uid)
        finally:
            close_fds(fds)
    return prepared, saved


def prepare(driver: Driver, cache: DriverCache, model: bytes, token: bytes,
            cache_dir: Path | str, *, uid: int = APP_UID) -> tuple[PreparedModel, bool]:
    """(model, loaded_from_cache) for the app of ``uid``."""
    loaded = try_load(driver, cache, token, cache_dir, uid=uid)
    if loaded is not None:
        return loaded, True
    return compile_and_save(driver, cache, model, token, cache_dir, uid=uid)[0], False


__all__ = ["APP_UID", "OPTS", "compile_and_save", "entry_paths", "prepare", "try_load"]
