"""BlobCache: Android's nnCache/BlobCache key-value cache, for drivers that cache on their own.

Behaviour follows nnCache (``frameworks/ml/nn/driver/cache``):

- Limits: a ``set`` whose key exceeds ``max_key_size``, whose value exceeds
  ``max_value_size``, or whose key+value exceeds ``max_total_size`` is ignored
  (an old value for that key stays); so are empty keys and values.
- Eviction when an insert would exceed ``max_total_size``: if the cache is
  *cleanable* (HALVE: total > max/2; FIT and FIT_HALVE: total > 0) victims are
  removed until the total is at most the target (HALVE: max/2; FIT:
  max - (new - replaced); FIT_HALVE: the smaller), then the insert is retried;
  otherwise the new entry is dropped. Victims: RANDOM (uniform over entries) or
  LRU (lowest access counter; the counter advances on every set and every get
  that returns data).
- File: ``nn$$`` + CRC32C (Castagnoli, init 0, no final XOR) of the payload;
  the payload header (native byte order) holds the magic ``_Bb$``, version 3,
  device version 1, the entry count and the build id; entries (key size, value
  size, key, value, zero padding to 4 bytes) sorted by key length then bytes.
  A file from another build id or format version loads as an empty cache (no
  error); a corrupted or oversized file too (larger than a save of a full
  cache could write; Android uses 2 x max_total_size, which that can exceed).
- Persistence: loaded lazily on first use; the first ``set`` after a save
  schedules one save ``save_delay_s`` later (driven by a :class:`Scheduler`, so
  tests use a virtual clock); ``close`` saves. Saves are atomic: a temp file is
  written, fsynced, made read-only (0400) and renamed over the old file.
  Unlike Android (which writes in place), a crash never leaves a torn file.
"""

from __future__ import annotations

import logging
import os
import random
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from npumanager.cache.crc import crc32c_nn
from npumanager.clock import Clock
from npumanager.errors import InvalidArgument
from npumanager.version import __version__

log = logging.getLogger(__name__)

FILE_MAGIC = b"nn$$"
FILE_HEADER_SIZE = 8
BLOB_CACHE_MAGIC = (ord("_") << 24) | (ord("B") << 16) | (ord("b") << 8) | ord("$")
BLOB_CACHE_VERSION = 3
BLOB_CACHE_DEVICE_VERSION = 1
#: Android's PROPERTY_VALUE_MAX: room reserved for the build id.
PROPERTY_VALUE_MAX = 92
DEFAULT_SAVE_DELAY_S = 4.0

# struct Header { u32 magic, version, device_version; size_t num_entries;
#                 int build_id_length; char build_id[]; } -- native layout.
_HEADER = struct.Struct("@IIInI")
_HEADER_SIZE = struct.calcsize("@IIInI0n")  # sizeof(Header): padded to size_t alignment
_BUILD_ID_OFFSET = _HEADER.size  # offsetof(Header, mBuildId)
_ENTRY = struct.Struct("@NN")  # struct EntryHeader { size_t key_size, value_size; }
_CRC = struct.Struct("@I")

SELECTS = ("random", "lru")
CAPACITIES = ("halve", "fit", "fit_halve")


def _align4(n: int) -> int:
    return (n + 3) & ~3


# --- deferred save scheduling --------------------------------------------------


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Cancellable: ...


class ThreadScheduler:
    """Real time: a daemon ``threading.Timer`` per call."""

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Cancellable:
        t = threading.Timer(delay_s, fn)
        t.daemon = True
        t.start()
        return t


@dataclass
class _Pending:
    due: float
    fn: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class ClockScheduler:
    """Runs callbacks when told, by a :class:`~npumanager.clock.Clock` (tests: VirtualClock)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._pending: list[_Pending] = []

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Cancellable:
        p = _Pending(self.clock.now() + delay_s, fn)
        self._pending.append(p)
        return p

    def run_due(self) -> int:
        """Run every callback whose time has come; how many ran."""
        now = self.clock.now()
        due = [p for p in self._pending if p.due <= now and not p.cancelled]
        self._pending = [p for p in self._pending if p.due > now and not p.cancelled]
        for p in sorted(due, key=lambda p: p.due):
            p.fn()
        return len(due)

    @property
    def pending(self) -> int:
        return sum(1 for p in self._pending if not p.cancelled)


# --- the cache -----------------------------------------------------------------


class _Entry:
    __slots__ = ("recency", "value")

    def __init__(self, value: bytes, recency: int) -> None:
        self.value = value
        self.recency = recency


def _sort_key(key: bytes) -> tuple[int, bytes]:
    # Blob::operator<: shorter first, then memcmp.
    return len(key), key


def _parse_policy(policy: tuple[str, str]) -> tuple[str, str]:
    try:
        select, capacity = (str(p).lower() for p in policy)
    except (TypeError, ValueError):
        raise InvalidArgument(f"policy must be (select, capacity), got {policy!r}") from None
    if select not in SELECTS:
        raise InvalidArgument(f"unknown eviction select {select!r}; one of {SELECTS}")
    if capacity not in CAPACITIES:
        raise InvalidArgument(f"unknown eviction capacity {capacity!r}; one of {CAPACITIES}")
    return select, capacity


class BlobCache:
    """A bounded key/value cache persisted to one file (see the module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        max_key_size: int,
        max_value_size: int,
        max_total_size: int,
        policy: tuple[str, str] = ("random", "halve"),
        build_id: str | bytes = f"npumanager {__version__}",
        *,
        scheduler: Scheduler | None = None,
        save_delay_s: float = DEFAULT_SAVE_DELAY_S,
        seed: int | None = None,
    ) -> None:
        for name, v in (
            ("max_key_size", max_key_size),
            ("max_value_size", max_value_size),
            ("max_total_size", max_total_size),
        ):
            if not isinstance(v, int) or v < 0:
                raise InvalidArgument(f"{name} must be a non-negative int, got {v!r}")
        bid = build_id.encode() if isinstance(build_id, str) else bytes(build_id)
        if len(bid) >= PROPERTY_VALUE_MAX:
            raise InvalidArgument(f"build_id is limited to {PROPERTY_VALUE_MAX - 1} bytes")
        self.path = Path(path) if path is not None else None
        self.max_key_size = max_key_size
        self.max_value_size = max_value_size
        self.max_total_size = max_total_size
        self.select, self.capacity = _parse_policy(policy)
        self.build_id = bid
        self.save_delay_s = save_delay_s
        self._scheduler: Scheduler = scheduler or ThreadScheduler()
        self._rand = random.Random(seed)
        self._lock = threading.RLock()
        self._entries: dict[bytes, _Entry] = {}
        self._total = 0
        self._access = 0
        self._loaded = False
        self._closed = False
        self._save_pending: Cancellable | None = None

    # --- nnCache's public operations ------------------------------------------

    def set(self, key: bytes, value: bytes) -> None:
        """Insert or replace; ignored if it breaks a limit (see the module docstring)."""
        key, value = bytes(key), bytes(value)
        with self._lock:
            self._ensure_loaded()
            self._set_locked(key, value)
            if self.path is not None and self._save_pending is None and not self._closed:
                self._save_pending = self._scheduler.call_later(
                    self.save_delay_s, self._deferred_save
                )

    def get(self, key: bytes) -> bytes | None:
        """The value for ``key``, or None."""
        key = bytes(key)
        with self._lock:
            self._ensure_loaded()
            if len(key) > self.max_key_size:
                return None
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._access += 1
            entry.recency = self._access
            return entry.value

    def save(self) -> bool:
        """Write the file now (atomically); False if there is no file or it failed."""
        with self._lock:
            if self.path is None:
                return False
            self._ensure_loaded()
            return self._save_locked()

    def close(self) -> None:
        """Cancel the deferred save and save now if the cache was used (as terminate does)."""
        with self._lock:
            if self._closed:
                return
            if self._save_pending is not None:
                self._save_pending.cancel()
                self._save_pending = None
            if self._loaded and self.path is not None:
                self._save_locked()
            self._closed = True

    def __enter__(self) -> BlobCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- introspection ----------------------------------------------------------

    @property
    def total_size(self) -> int:
        with self._lock:
            self._ensure_loaded()
            return self._total

    def __len__(self) -> int:
        with self._lock:
            self._ensure_loaded()
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        """Membership (does not count as an access for LRU)."""
        with self._lock:
            self._ensure_loaded()
            return isinstance(key, bytes) and key in self._entries

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.keys())

    def keys(self) -> list[bytes]:
        """Keys in file order (by length, then bytes)."""
        with self._lock:
            self._ensure_loaded()
            return sorted(self._entries, key=_sort_key)

    # --- insertion and eviction (BlobCache.cpp) ---------------------------------

    def _set_locked(self, key: bytes, value: bytes) -> None:
        k, v = len(key), len(value)
        if k > self.max_key_size or v > self.max_value_size or k + v > self.max_total_size:
            return
        if k == 0 or v == 0:
            return
        while True:
            old = self._entries.get(key)
            if old is None:
                new_total = self._total + k + v
                if new_total > self.max_total_size:
                    if self._cleanable() and self._clean(k + v, 0):
                        continue
                    return
                self._access += 1
                self._entries[key] = _Entry(value, self._access)
                self._total = new_total
            else:
                new_total = self._total + v - len(old.value)
                if new_total > self.max_total_size:
                    if self._cleanable() and self._clean(k + v, k + len(old.value)):
                        continue
                    return
                self._access += 1
                old.value = value
                old.recency = self._access
                self._total = new_total
            return

    def _cleanable(self) -> bool:
        if self.capacity == "halve":
            return self._total > self.max_total_size // 2
        return self._total > 0

    def _down_to(self, new_size: int, replaced: int) -> int:
        fit = self.max_total_size - (new_size - replaced)
        if self.capacity == "halve":
            return self.max_total_size // 2
        if self.capacity == "fit":
            return fit
        return min(fit, self.max_total_size // 2)

    def _clean(self, new_size: int, replaced: int) -> bool:
        """Evict victims until the total is at most the target; whether any went."""
        down_to = self._down_to(new_size, replaced)
        order = sorted(self._entries, key=_sort_key) if self.select == "random" else []
        cleaned = False
        while self._total > down_to and self._entries:
            if self.select == "random":
                victim = order.pop(self._rand.randrange(len(order)))
            else:
                victim = min(self._entries.items(), key=lambda kv: kv[1].recency)[0]
            entry = self._entries.pop(victim)
            self._total -= len(victim) + len(entry.value)
            cleaned = True
        return cleaned

    # --- file format ------------------------------------------------------------

    def flatten(self) -> bytes:
        """The payload (what follows the 8-byte file header)."""
        with self._lock:
            keys = sorted(self._entries, key=_sort_key)
            size = _align4(_HEADER_SIZE + PROPERTY_VALUE_MAX)
            size += sum(_align4(_ENTRY.size + len(k) + len(self._entries[k].value)) for k in keys)
            buf = bytearray(size)
            _HEADER.pack_into(
                buf,
                0,
                BLOB_CACHE_MAGIC,
                BLOB_CACHE_VERSION,
                BLOB_CACHE_DEVICE_VERSION,
                len(keys),
                len(self.build_id),
            )
            buf[_BUILD_ID_OFFSET : _BUILD_ID_OFFSET + len(self.build_id)] = self.build_id
            off = _align4(_HEADER_SIZE + len(self.build_id))
            for k in keys:
                v = self._entries[k].value
                _ENTRY.pack_into(buf, off, len(k), len(v))
                start = off + _ENTRY.size
                buf[start : start + len(k)] = k
                buf[start + len(k) : start + len(k) + len(v)] = v
                off += _align4(_ENTRY.size + len(k) + len(v))  # padding stays zero
            return bytes(buf)

    def _unflatten(self, payload: bytes) -> bool:
        """Load entries from a payload; False (and empty) if it is malformed.
        A payload from another version or build id is an empty cache, not an error."""
        self._entries.clear()
        self._total = 0
        if len(payload) < _HEADER_SIZE:
            return False
        magic, version, device_version, n, bid_len = _HEADER.unpack_from(payload, 0)
        if magic != BLOB_CACHE_MAGIC:
            return False
        bid = payload[_BUILD_ID_OFFSET : _BUILD_ID_OFFSET + max(bid_len, 0)]
        if (
            version != BLOB_CACHE_VERSION
            or device_version != BLOB_CACHE_DEVICE_VERSION
            or bid_len != len(self.build_id)
            or bid != self.build_id
        ):
            return True
        off = _align4(_HEADER_SIZE + bid_len)
        for _ in range(n):
            if off + _ENTRY.size > len(payload):
                self._entries.clear()
                self._total = 0
                return False
            k, v = _ENTRY.unpack_from(payload, off)
            total = _align4(_ENTRY.size + k + v)
            if off + total > len(payload):
                self._entries.clear()
                self._total = 0
                return False
            start = off + _ENTRY.size
            # Re-inserted through set, so the current limits apply.
            self._set_locked(payload[start : start + k], payload[start + k : start + k + v])
            off += total
        return True

    def _max_file_size(self) -> int:
        """The largest file a save can write. Android refuses a file over 2 x
        max_total_size, but a full cache of many tiny entries flattens to more than that
        (each entry has a 2 x size_t header and padding; an entry holds at least 2 bytes):
        its own save could write a file its load then ignored (found by
        tests/cache/test_blobcache_props.py: 10 entries, 85 bytes, a 404-byte file)."""
        most_entries = self.max_total_size // 2
        flattened = (FILE_HEADER_SIZE + _align4(_HEADER_SIZE + PROPERTY_VALUE_MAX)
                     + self.max_total_size + most_entries * (_ENTRY.size + 3))
        return max(2 * self.max_total_size, flattened)

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self.path is None:
            return
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > self._max_file_size():
                    log.warning("blob cache %s is too large (%d bytes); ignored", self.path, size)
                    return
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot read blob cache %s: %s", self.path, exc)
            return
        if len(data) < FILE_HEADER_SIZE or data[:4] != FILE_MAGIC:
            log.warning("blob cache %s has a bad magic; ignored", self.path)
            return
        payload = data[FILE_HEADER_SIZE:]
        if _CRC.unpack_from(data, 4)[0] != crc32c_nn(payload):
            log.warning("blob cache %s failed its CRC check; ignored", self.path)
            return
        if not self._unflatten(payload):
            log.warning("blob cache %s is malformed; ignored", self.path)

    def _deferred_save(self) -> None:
        with self._lock:
            self._save_pending = None
            if not self._closed and self.path is not None:
                self._save_locked()

    def _save_locked(self) -> bool:
        assert self.path is not None
        payload = self.flatten()
        data = FILE_MAGIC + _CRC.pack(crc32c_nn(payload)) + payload
        directory = self.path.parent
        tmp = directory / f".{self.path.name}.{os.getpid()}.{self._rand.getrandbits(32):08x}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            log.warning("cannot create blob cache %s: %s", tmp, exc)
            return False
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                os.fchmod(fd, 0o400)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot write blob cache %s: %s", self.path, exc)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass
        return True


__all__ = [
    "BLOB_CACHE_MAGIC",
    "FILE_MAGIC",
    "BlobCache",
    "ClockScheduler",
    "Scheduler",
    "ThreadScheduler",
]
