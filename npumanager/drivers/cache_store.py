"""The driver side of NNAPI compilation caching, as one object the host calls.

:class:`DriverCache` ties the cache fds, the file I/O (:mod:`.cache_io`) and the
persistent verifier map (:class:`npumanager.cache.verifier.CacheVerifier`)
together in the only safe order:

Every entry belongs to a uid: the kernel-verified uid of the app whose
connection sent the fds. A load verifies against that uid's entry only.

- ``save``: lock every file of the entry exclusively, truncate and write each
  blob, fsync, then record the tag of the blobs *as written from memory*, then
  unlock. Recording under the lock means two writers cannot leave one's files
  with the other's tag. Any failure is swallowed (returns False): a failed save
  never changes a prepare result.
- ``load``: check the arguments (InvalidArgument), read each file once into
  memory and verify the keyed tag of those buffers against the map, both under
  a shared lock (GeneralFailure on mismatch), and only then return them for
  deserialization. The files are never read again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from npumanager.cache.verifier import CacheVerifier, verifier_dir
from npumanager.cachetoken import MAX_NUMBER_OF_CACHE_FILES, check_token
from npumanager.drivers.cache_io import (
    LOCK_TIMEOUT_S,
    check_fds,
    locked,
    read_cache_files,
    write_cache_files,
)
from npumanager.errors import GeneralFailure, InvalidArgument

log = logging.getLogger(__name__)

#: Default bound on the bytes one cache entry may hold when loaded.
DEFAULT_MAX_BYTES = 8 << 30


class DriverCache:
    """Save and verified load of cache entries for one driver."""

    def __init__(
        self,
        driver_name: str,
        driver_version: str,
        n_model: int,
        n_data: int,
        *,
        state_root: Path | None = None,
        state_dir: Path | None = None,
        max_entries: int = 4096,
        max_entries_per_uid: int = 512,
        max_bytes: int = DEFAULT_MAX_BYTES,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
    ) -> None:
        """``state_dir`` (the map's directory) defaults to ``STATE/drivers/NAME/cache``."""
        for kind, n in (("model", n_model), ("data", n_data)):
            if not 0 <= n <= MAX_NUMBER_OF_CACHE_FILES:
                raise InvalidArgument(f"{n} {kind} cache files; at most 32 allowed")
        self.n_model = n_model
        self.n_data = n_data
        self.max_bytes = max_bytes
        self.lock_timeout_s = lock_timeout_s
        directory = state_dir if state_dir is not None else verifier_dir(driver_name, state_root)
        self.verifier = CacheVerifier(directory, driver_version, max_entries,
                                      max_entries_per_uid=max_entries_per_uid)

    @property
    def enabled(self) -> bool:
        return self.n_model + self.n_data > 0

    def check_args(self, token: bytes, model_fds: Sequence[int], data_fds: Sequence[int]) -> bytes:
        """The token as bytes; InvalidArgument for a bad token or wrong file counts."""
        if len(model_fds) != self.n_model or len(data_fds) != self.n_data:
            raise InvalidArgument(
                f"expected {self.n_model} model and {self.n_data} data cache files, got "
                f"{len(model_fds)} and {len(data_fds)}"
            )
        return check_token(token)

    def save(
        self,
        token: bytes,
        model_fds: Sequence[int],
        data_fds: Sequence[int],
        model_blobs: Sequence[bytes],
        data_blobs: Sequence[bytes],
        *,
        uid: int,
    ) -> bool:
        """Write and record one entry of ``uid``; False (logged) on any failure, never
        raises."""
        try:
            raw = self.check_args(token, model_fds, data_fds)
            if len(model_blobs) != self.n_model or len(data_blobs) != self.n_data:
                raise GeneralFailure("the backend produced the wrong number of cache blobs")
            fds = [*model_fds, *data_fds]
            with locked(fds, exclusive=True, timeout_s=self.lock_timeout_s):
                write_cache_files(fds, [*model_blobs, *data_blobs], lock=False)
                self.verifier.record(raw, list(model_blobs), list(data_blobs), uid=uid)
        except Exception as exc:  # a failed save never changes the prepare result
            log.warning("compilation cache not saved: %s", exc)
            return False
        return True

    def load(
        self, token: bytes, model_fds: Sequence[int], data_fds: Sequence[int], *, uid: int
    ) -> tuple[list[bytes], list[bytes]]:
        """The verified model and data cache buffers of ``uid``'s entry for ``token``.

        InvalidArgument: bad token, wrong counts, a write-only or unreadable fd.
        GeneralFailure: caching unsupported, too large, or not what was recorded.
        """
        if not self.enabled:
            raise GeneralFailure("this driver does not support compilation caching")
        raw = self.check_args(token, model_fds, data_fds)
        fds = [*model_fds, *data_fds]
        check_fds(fds, need_read=True)
        # Verify while still holding the shared lock: a cooperating rewrite (multi-stage)
        # replaces files and tag together under the exclusive lock, so a reader sees
        # either the old files with the old tag or the new with the new, never a mix.
        with locked(fds, exclusive=False, timeout_s=self.lock_timeout_s):
            bufs = read_cache_files(fds, self.max_bytes, lock=False)
            model_bufs, data_bufs = bufs[: self.n_model], bufs[self.n_model :]
            ok = self.verifier.verify(raw, model_bufs, data_bufs, uid=uid)
        if not ok:
            raise GeneralFailure("the compilation cache does not match what this driver wrote")
        return model_bufs, data_bufs

    def close(self) -> None:
        self.verifier.close()


__all__ = ["DEFAULT_MAX_BYTES", "DriverCache"]
