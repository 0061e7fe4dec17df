"""The driver's persistent token -> keyed-hash map that makes cache files safe to load.

Cache files live in the app's directory, so anything that can write there can
change them. Before a driver deserializes (and then runs) what it read, it
checks a keyed BLAKE3 tag computed over the *in-memory* buffers it read (never
over the files again) against the tag it recorded when it wrote them.

The map is keyed by (uid, token), the uid being the kernel-verified uid of the
app's connection: the tag answers "is this what *this app* compiled", not "what
anyone compiled". An app cannot make another app load its files (uid B
compiling under uid A's token and swapping its files into A's directory only
records an entry of B's), and it cannot touch another uid's entries at all.

The map is SQLite in the driver's private state dir (0700, DB file 0600), in
WAL mode with a busy timeout, so several driver processes can share it. It
holds a random 32-byte key, the driver+backend version string, and per (uid,
token): the tag, the file counts and sizes, timestamps and hit counts. When the
version string changes, every entry is dropped and a new key is drawn, so old
tags can no longer verify anything. Eviction is least recently used within one
uid's share: past ``max_entries_per_uid`` a uid's record evicts that uid's own
oldest entries, and when the whole map is at ``max_entries`` it evicts its own
again (or records nothing); one uid never evicts another's entries.

The tag frames the uid and every buffer with its kind, index and length, so
bytes cannot be shifted between files, nor files between model and data cache,
nor an entry moved to another token or another uid.
"""

from __future__ import annotations

import hmac
import os
import secrets
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3

from npumanager.cachetoken import check_token
from npumanager.errors import GeneralFailure, InvalidArgument
from npumanager.paths import driver_state_dir, ensure_private_dir, secure_dir

DB_NAME = "cache-map.sqlite3"
SCHEMA_VERSION = "2"
KEY_SIZE = 32
_DOMAIN = b"npumanager/cache-entry/v2\x00"
_UID = struct.Struct("<Q")
_COUNTS = struct.Struct("<II")
_FRAME = struct.Struct("<BIQ")  # kind (1 model, 2 data), index, length
#: Inputs at least this large are hashed with BLAKE3's multi-threaded mode.
MULTITHREAD_MIN_BYTES = 8 << 20

Buffer = bytes | bytearray | memoryview


def verifier_dir(driver_name: str, state_root: Path | None = None) -> Path:
    """Where driver ``driver_name`` keeps its map: in its private state dir (owned by the
    user it runs as), STATE/drivers/NAME/cache."""
    if not driver_name or "/" in driver_name or driver_name in (".", ".."):
        raise InvalidArgument(f"bad driver name {driver_name!r}")
    return driver_state_dir(driver_name, state_root) / "cache"


def compute_tag(
    key: bytes, uid: int, token: bytes, model_bufs: Sequence[Buffer],
    data_bufs: Sequence[Buffer]
) -> bytes:
    """Keyed BLAKE3 over the framed buffers, multi-threaded for large inputs."""
    views = [
        [b if isinstance(b, bytes) else memoryview(b).cast("B") for b in bufs]
        for bufs in (model_bufs, data_bufs)
    ]
    total = sum(len(v) for vs in views for v in vs)
    # Threads pay off only on large inputs (measured: slower below a few MiB).
    threads = blake3.blake3.AUTO if total >= MULTITHREAD_MIN_BYTES else 1
    h = blake3.blake3(_DOMAIN, key=key, max_threads=threads)
    h.update(_UID.pack(uid))
    h.update(token)
    h.update(_COUNTS.pack(len(model_bufs), len(data_bufs)))
    for kind, vs in ((1, views[0]), (2, views[1])):
        for i, view in enumerate(vs):
            h.update(_FRAME.pack(kind, i, len(view)))
            h.update(view)
    return h.digest()


@dataclass(frozen=True)
class CacheEntry:
    """One row of the map, as ``npu cache ls`` shows it."""

    uid: int
    token: bytes
    n_model: int
    n_data: int
    model_bytes: int
    data_bytes: int
    created: float
    last_used: float
    hits: int

    @property
    def size(self) -> int:
        return self.model_bytes + self.data_bytes


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    uid INTEGER NOT NULL,
    token BLOB NOT NULL,
    tag BLOB NOT NULL,
    n_model INTEGER NOT NULL,
    n_data INTEGER NOT NULL,
    model_bytes INTEGER NOT NULL,
    data_bytes INTEGER NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (uid, token)
);
CREATE INDEX IF NOT EXISTS entries_last_used ON entries (last_used);
CREATE INDEX IF NOT EXISTS entries_uid_last_used ON entries (uid, last_used);
"""


class CacheVerifier:
    """Persistent token -> tag map of one driver (see the module docstring)."""

    def __init__(
        self,
        state_dir: Path,
        driver_version: str | None,
        max_entries: int = 4096,
        *,
        max_entries_per_uid: int = 512,
        now: Callable[[], float] = time.time,
        busy_timeout_s: float = 30.0,
    ) -> None:
        """``driver_version=None`` opens an existing map for administration (the CLI):
        it adopts the stored version and key and never resets the map."""
        if max_entries < 1 or max_entries_per_uid < 1:
            raise InvalidArgument("max_entries and max_entries_per_uid must be at least 1")
        self.admin = driver_version is None
        if self.admin and not (Path(state_dir) / DB_NAME).is_file():
            raise GeneralFailure(f"no cache map in {state_dir}")
        if self.admin:
            # An administrator (root) reads the map of a driver that runs as another user.
            owner = os.lstat(state_dir).st_uid if os.getuid() == 0 else None
            self.state_dir = secure_dir(Path(state_dir), "cache map dir", owner=owner)
        else:
            self.state_dir = ensure_private_dir(Path(state_dir))
        self.path = self.state_dir / DB_NAME
        self.driver_version = driver_version or ""
        self.max_entries = max_entries
        self.max_entries_per_uid = max_entries_per_uid
        self._now = now
        self._lock = threading.Lock()
        # Create the file ourselves so it is 0600 from the start; SQLite gives
        # its -wal and -shm files the database file's mode.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        try:
            self._db = sqlite3.connect(
                self.path,
                timeout=busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise GeneralFailure(f"cannot open cache map {self.path}: {exc}") from exc
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._enter_wal(busy_timeout_s)
            self._db.execute("PRAGMA synchronous = FULL")
            with self._write():
                if self._meta_if_any("schema") not in (None, SCHEMA_VERSION):
                    if self.admin:
                        raise GeneralFailure(
                            f"the cache map in {state_dir} has an older layout; its driver "
                            "starts it afresh when it next starts")
                    # An older layout (keyed by token alone): start over, with a new key.
                    self._db.execute("DROP TABLE IF EXISTS entries")
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        self._db.execute(stmt)
                if self.admin:
                    stored = self._meta("driver_version")
                    self.driver_version = stored if isinstance(stored, str) else ""
                else:
                    self._check_version_locked()
        except GeneralFailure:
            self._db.close()
            raise
        except sqlite3.Error as exc:
            self._db.close()
            raise GeneralFailure(f"cannot initialise cache map {self.path}: {exc}") from exc

    def _enter_wal(self, busy_timeout_s: float) -> None:
        """Switch the file to WAL mode, waiting out other connections doing the same.

        Changing the journal mode needs an exclusive lock, and SQLite answers
        "database is locked" at once instead of calling the busy handler, so several
        driver processes opening a new map together would fail. The mode is
        persistent: once one of them has switched it, the others find it set.
        """
        deadline = time.monotonic() + busy_timeout_s
        pause = 0.001
        while True:
            try:
                row = self._db.execute("PRAGMA journal_mode").fetchone()
                if row is not None and str(row[0]).lower() == "wal":
                    return
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    # --- transactions -------------------------------------------------------

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction (serializes writers across processes)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _meta_if_any(self, k: str) -> bytes | str | None:
        """Like _meta, on a database that may not have the meta table yet."""
        try:
            return self._meta(k)
        except sqlite3.OperationalError:
            return None

    def _meta(self, k: str) -> bytes | str | None:
        row = self._db.execute("SELECT v FROM meta WHERE k = ?", (k,)).fetchone()
        return None if row is None else row[0]

    def _check_version_locked(self) -> bytes:
        """Reset the map with a fresh key unless it belongs to our version; the key."""
        key = self._meta("key")
        if (
            self._meta("schema") == SCHEMA_VERSION
            and self._meta("driver_version") == self.driver_version
            and isinstance(key, bytes)
            and len(key) == KEY_SIZE
        ):
            return key
        key = secrets.token_bytes(KEY_SIZE)
        db = self._db
        db.execute("DELETE FROM entries")
        db.execute("DELETE FROM meta")
        db.executemany(
            "INSERT INTO meta (k, v) VALUES (?, ?)",
            [
                ("schema", SCHEMA_VERSION),
                ("driver_version", self.driver_version),
                ("key", key),
                ("reset_at", str(self._now())),
            ],
        )
        return key

    def _current_key(self) -> bytes | None:
        """Our key if the map still belongs to our version, else None."""
        if self._meta("driver_version") != self.driver_version:
            return None
        key = self._meta("key")
        return key if isinstance(key, bytes) and len(key) == KEY_SIZE else None

    # --- the driver's calls -------------------------------------------------

    def record(
        self, token: bytes, model_bufs: Sequence[Buffer], data_bufs: Sequence[Buffer], *,
        uid: int
    ) -> None:
        """Remember the tag of what ``uid`` just wrote (files fully written and synced).
        GeneralFailure if the map has no room left in ``uid``'s share."""
        if self.admin:
            raise GeneralFailure("a map opened for administration does not record")
        token = check_token(token)
        with self._lock:
            key = self._key_for_hashing()
        # Hash outside the lock: other threads keep using the map meanwhile.
        tag = compute_tag(key, uid, token, model_bufs, data_bufs)
        now = self._now()
        with self._lock:
            try:
                with self._write() as db:
                    # The key may have been rotated by another process meanwhile.
                    if self._check_version_locked() != key:
                        raise GeneralFailure("the cache map was reset while recording")
                    db.execute(
                        "INSERT INTO entries (uid, token, tag, n_model, n_data, model_bytes,"
                        " data_bytes, created, last_used, hits) VALUES (?,?,?,?,?,?,?,?,?,0)"
                        " ON CONFLICT(uid, token) DO UPDATE SET tag=excluded.tag,"
                        " n_model=excluded.n_model, n_data=excluded.n_data,"
                        " model_bytes=excluded.model_bytes, data_bytes=excluded.data_bytes,"
                        " created=excluded.created, last_used=excluded.last_used",
                        (
                            uid,
                            token,
                            tag,
                            len(model_bufs),
                            len(data_bufs),
                            sum(memoryview(b).nbytes for b in model_bufs),
                            sum(memoryview(b).nbytes for b in data_bufs),
                            now,
                            now,
                        ),
                    )
                    if not self._evict_own_locked(uid, token):
                        raise GeneralFailure(
                            f"the cache map is full ({self.max_entries} entries) with other "
                            f"uids' entries; uid {uid}'s compilation was not cached")
            except sqlite3.Error as exc:
                raise GeneralFailure(f"cannot record cache entry: {exc}") from exc

    def _evict_own_locked(self, uid: int, token: bytes) -> bool:
        """Evict ``uid``'s least recently used entries past its share, and while the map is
        over its bound; never another uid's. False if that evicted ``token`` itself."""
        db = self._db
        db.execute(
            "DELETE FROM entries WHERE uid = ? AND token NOT IN (SELECT token FROM entries"
            " WHERE uid = ? ORDER BY last_used DESC, created DESC LIMIT ?)",
            (uid, uid, self.max_entries_per_uid))
        (total,) = db.execute("SELECT count(*) FROM entries").fetchone()
        over = int(total) - self.max_entries
        if over > 0:
            db.execute(
                "DELETE FROM entries WHERE uid = ? AND token IN (SELECT token FROM entries"
                " WHERE uid = ? ORDER BY last_used ASC, created ASC LIMIT ?)",
                (uid, uid, over))
        row = db.execute("SELECT 1 FROM entries WHERE uid = ? AND token = ?",
                         (uid, token)).fetchone()
        return row is not None

    def _key_for_hashing(self) -> bytes:
        try:
            key = self._current_key()
            if key is None:
                with self._write():
                    key = self._check_version_locked()
        except sqlite3.Error as exc:
            raise GeneralFailure(f"cache map unavailable: {exc}") from exc
        return key

    def verify(
        self,
        token: bytes,
        model_bufs: Sequence[Buffer],
        data_bufs: Sequence[Buffer],
        *,
        uid: int,
        touch: bool = True,
    ) -> bool:
        """Whether these buffers are exactly what ``uid`` recorded for ``token``.

        On a match (and ``touch``), counts a hit and refreshes the LRU time.
        Any map error counts as a mismatch: the caller then compiles afresh.
        """
        try:
            token = check_token(token)
        except InvalidArgument:
            return False
        with self._lock:
            try:
                key = self._current_key()
                row = self._db.execute(
                    "SELECT tag FROM entries WHERE uid = ? AND token = ?", (uid, token)
                ).fetchone()
            except sqlite3.Error:
                return False
        if key is None or row is None:
            return False
        expected = bytes(row[0])
        tag = compute_tag(key, uid, token, model_bufs, data_bufs)  # outside the lock
        if not hmac.compare_digest(tag, expected):
            return False
        with self._lock:
            if touch:
                try:
                    with self._write() as db:
                        db.execute(
                            "UPDATE entries SET hits = hits + 1, last_used = ?"
                            " WHERE uid = ? AND token = ? AND tag = ?",
                            (self._now(), uid, token, expected),
                        )
                except sqlite3.Error:
                    pass  # a hit we could not count is still a hit
            return True

    # --- administration (CLI) -------------------------------------------------

    def lookup(self, token: bytes, *, uid: int) -> CacheEntry | None:
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLS} FROM entries WHERE uid = ? AND token = ?", (uid, bytes(token))
            ).fetchone()
        return None if row is None else _entry(row)

    def entries(self) -> list[CacheEntry]:
        """Every entry, most recently used first."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLS} FROM entries ORDER BY last_used DESC, created DESC"
            ).fetchall()
        return [_entry(r) for r in rows]

    def check(self) -> list[str]:
        """Problems with the map itself (empty = sound): SQLite's integrity check, then
        every entry's shape. Does not read any cache file."""
        with self._lock:
            try:
                rows = self._db.execute("PRAGMA integrity_check").fetchall()
                problems = [str(r[0]) for r in rows if r[0] != "ok"]
                if problems:
                    return problems
                bad = self._db.execute(
                    "SELECT hex(token) FROM entries WHERE length(token) != 32 OR n_model < 0"
                    " OR n_data < 0 OR model_bytes < 0 OR data_bytes < 0 OR uid < 0"
                    ).fetchall()
            except sqlite3.Error as exc:
                return [f"cannot read the map: {exc}"]
        key = self._meta("key")
        out = [f"entry {r[0][:16].lower()}: malformed" for r in bad]
        if key is None and not bad and not self.entries():
            return out  # never written: its driver makes the key at its first save
        if not isinstance(key, bytes) or len(key) != KEY_SIZE:
            out.append("the hashing key is missing or malformed")
        return out

    def remove(self, token: bytes, *, uid: int) -> bool:
        with self._lock, self._write() as db:
            cur = db.execute("DELETE FROM entries WHERE uid = ? AND token = ?",
                             (uid, bytes(token)))
            return cur.rowcount > 0

    def clear(self) -> int:
        """Drop every entry (the key stays); the number dropped."""
        with self._lock, self._write() as db:
            return db.execute("DELETE FROM entries").rowcount

    def gc(self, max_entries: int | None = None) -> int:
        """Evict least recently used entries past the bound; the number evicted."""
        bound = self.max_entries if max_entries is None else max_entries
        if bound < 0:
            raise InvalidArgument("max_entries must be >= 0")
        with self._lock, self._write():
            return self._evict_locked(bound)

    def _evict_locked(self, bound: int) -> int:
        """The administrator's bound over every uid (``npu cache gc``)."""
        return self._db.execute(
            "DELETE FROM entries WHERE rowid NOT IN"
            " (SELECT rowid FROM entries ORDER BY last_used DESC, created DESC LIMIT ?)",
            (bound,),
        ).rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> CacheVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CacheVerifier({str(self.path)!r}, {self.driver_version!r})"


_COLS = "uid, token, n_model, n_data, model_bytes, data_bytes, created, last_used, hits"


def _entry(row: Any) -> CacheEntry:
    uid, token, n_model, n_data, mb, db, created, last_used, hits = row
    return CacheEntry(
        uid=int(uid),
        token=bytes(token),
        n_model=int(n_model),
        n_data=int(n_data),
        model_bytes=int(mb),
        data_bytes=int(db),
        created=float(created),
        last_used=float(last_used),
        hits=int(hits),
    )


__all__ = ["DB_NAME", "CacheEntry", "CacheVerifier", "compute_tag", "verifier_dir"]
