"""The persistent (uid, token) -> keyed tag map."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

from npumanager.cache.verifier import DB_NAME, CacheVerifier, compute_tag, verifier_dir
from npumanager.errors import GeneralFailure, InvalidArgument

T1 = bytes([1]) * 32
T2 = bytes([2]) * 32
#: The app (U) and another local user (B).
U, B = 1001, 1002


class Ticker:
    """A wall clock that moves one second per reading."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_private_dir_and_file_modes(state_dir: Path) -> None:
    d = state_dir / "drivers" / "reference" / "cache"
    with CacheVerifier(d, "v1"):
        assert os.stat(d).st_mode & 0o777 == 0o700
        assert os.stat(d / DB_NAME).st_mode & 0o777 == 0o600
    assert verifier_dir("reference", state_dir) == d
    with pytest.raises(InvalidArgument):
        verifier_dir("../x", state_dir)


def test_record_verify_and_every_kind_of_mismatch(state_dir: Path) -> None:
    with CacheVerifier(state_dir, "v1") as v:
        v.record(T1, [b"model"], [b"weights"], uid=U)
        assert v.verify(T1, [b"model"], [b"weights"], uid=U)
        assert not v.verify(T2, [b"model"], [b"weights"], uid=U)  # another token
        assert not v.verify(T1, [b"modeL"], [b"weights"], uid=U)  # flipped byte
        assert not v.verify(T1, [b"model!"], [b"weights"], uid=U)  # appended
        assert not v.verify(T1, [b"mode"], [b"weights"], uid=U)  # truncated
        assert not v.verify(T1, [b""], [b"weights"], uid=U)  # emptied
        assert not v.verify(T1, [b"mod"], [b"elweights"], uid=U)  # bytes shifted between files
        assert not v.verify(T1, [b"weights"], [b"model"], uid=U)  # files swapped
        assert not v.verify(T1, [b"model", b""], [b"weights"], uid=U)  # wrong file count
        assert v.verify(T1, [b"model"], [b"weights"], uid=U, touch=False)  # no hit counted
        assert not v.verify(b"short", [b"model"], [b"weights"], uid=U)
        (e,) = v.entries()
        assert (e.token, e.n_model, e.n_data, e.model_bytes, e.data_bytes) == (T1, 1, 1, 5, 7)
        assert e.hits == 1 and e.size == 12


def test_survives_restart_and_version_change_resets(state_dir: Path) -> None:
    with CacheVerifier(state_dir, "drv 1 + ort 1.0") as v:
        v.record(T1, [b"m"], [b"d"], uid=U)
    with CacheVerifier(state_dir, "drv 1 + ort 1.0") as v:
        assert v.verify(T1, [b"m"], [b"d"], uid=U)
    db = sqlite3.connect(state_dir / DB_NAME)
    old_key = db.execute("SELECT v FROM meta WHERE k='key'").fetchone()[0]
    db.close()
    with CacheVerifier(state_dir, "drv 1 + ort 1.1") as v:
        assert v.entries() == []
        assert not v.verify(T1, [b"m"], [b"d"], uid=U)
    db = sqlite3.connect(state_dir / DB_NAME)
    new_key = db.execute("SELECT v FROM meta WHERE k='key'").fetchone()[0]
    db.close()
    assert new_key != old_key and len(new_key) == 32
    # Going back does not resurrect anything either: the key rotated again.
    with CacheVerifier(state_dir, "drv 1 + ort 1.0") as v:
        assert not v.verify(T1, [b"m"], [b"d"], uid=U)


def test_tag_is_keyed_and_framed() -> None:
    k1, k2 = b"k" * 32, b"K" * 32
    assert compute_tag(k1, U, T1, [b"ab"], [b"c"]) != compute_tag(k2, U, T1, [b"ab"], [b"c"])
    assert compute_tag(k1, U, T1, [b"ab"], [b"c"]) != compute_tag(k1, U, T1, [b"a"], [b"bc"])
    assert compute_tag(k1, U, T1, [b"ab", b""], []) != compute_tag(k1, U, T1, [b"ab"], [b""])
    big = os.urandom(9 << 20)  # above MULTITHREAD_MIN_BYTES: the multi-threaded path
    assert compute_tag(k1, U, T1, [memoryview(big)], []) == compute_tag(k1, U, T1, [big], [])


def test_lru_eviction_past_bound(state_dir: Path) -> None:
    tokens = [bytes([i]) * 32 for i in range(5)]
    with CacheVerifier(state_dir, "v", max_entries=3, now=Ticker()) as v:
        for t in tokens[:3]:
            v.record(t, [t], [], uid=U)
        assert v.verify(tokens[0], [tokens[0]], [], uid=U)  # 0 is now the most recent
        v.record(tokens[3], [tokens[3]], [], uid=U)  # evicts 1, the least recently used
        assert {e.token for e in v.entries()} == {tokens[0], tokens[2], tokens[3]}
        assert v.entries()[0].token == tokens[3]
        assert v.gc(1) == 2
        assert [e.token for e in v.entries()] == [tokens[3]]
        assert v.lookup(tokens[3], uid=U) is not None and v.lookup(tokens[0], uid=U) is None
        assert v.remove(tokens[3], uid=U) and not v.remove(tokens[3], uid=U)
        v.record(tokens[4], [b"x"], [], uid=U)
        assert v.clear() == 1 and v.entries() == []


def test_entries_belong_to_a_uid(state_dir: Path) -> None:
    with CacheVerifier(state_dir, "v") as v:
        v.record(T1, [b"a-model"], [b"a-weights"], uid=U)
        # B's files under U's token are B's entry; U's answer does not change.
        v.record(T1, [b"b-model"], [b"b-weights"], uid=B)
        assert v.verify(T1, [b"a-model"], [b"a-weights"], uid=U)
        assert not v.verify(T1, [b"b-model"], [b"b-weights"], uid=U)
        assert not v.verify(T1, [b"a-model"], [b"a-weights"], uid=B)
        assert v.verify(T1, [b"b-model"], [b"b-weights"], uid=B)
        assert sorted((e.uid, e.token) for e in v.entries()) == [(U, T1), (B, T1)]
        assert v.remove(T1, uid=B) and v.lookup(T1, uid=U) is not None
    k = bytes(32)
    assert compute_tag(k, U, T1, [b"m"], []) != compute_tag(k, B, T1, [b"m"], [])


def test_a_uid_evicts_only_its_own_entries(state_dir: Path) -> None:
    tokens = [bytes([i]) * 32 for i in range(1, 20)]
    with CacheVerifier(state_dir, "v", max_entries=6, max_entries_per_uid=3,
                       now=Ticker()) as v:
        v.record(T1, [b"u"], [], uid=U)
        for t in tokens:  # B floods the map
            v.record(t, [t], [], uid=B)
        assert [e.token for e in v.entries() if e.uid == B] == tokens[:-4:-1]
        assert v.verify(T1, [b"u"], [], uid=U), "B evicted U's entry"
        # The whole map full of other uids' entries: a newcomer's record evicts nobody
        # and is not recorded (its compile is simply not cached).
        for t in tokens[:2]:
            v.record(t, [t], [], uid=2001)
        assert len(v.entries()) == 6
        with pytest.raises(GeneralFailure, match=r"full .* with other uids' entries"):
            v.record(T2, [b"new"], [], uid=3001)
        assert len(v.entries()) == 6 and v.verify(T1, [b"u"], [], uid=U)
        # A uid with entries of its own makes room among them.
        v.record(T2, [b"u2"], [], uid=U)
        assert v.verify(T2, [b"u2"], [], uid=U) and not v.verify(T1, [b"u"], [], uid=U)
        assert len(v.entries()) == 6


def test_a_map_of_the_older_layout_starts_afresh(state_dir: Path) -> None:
    db = sqlite3.connect(state_dir / DB_NAME)
    db.executescript("""
        CREATE TABLE meta (k TEXT PRIMARY KEY, v BLOB NOT NULL);
        CREATE TABLE entries (token BLOB PRIMARY KEY, tag BLOB NOT NULL, n_model INTEGER NOT
            NULL, n_data INTEGER NOT NULL, model_bytes INTEGER NOT NULL, data_bytes INTEGER
            NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL, hits INTEGER NOT NULL);
        INSERT INTO meta VALUES ('schema', '1'), ('driver_version', 'v');
        INSERT INTO entries VALUES (x'01', x'02', 1, 0, 1, 0, 0, 0, 0);
    """)
    db.close()
    os.chmod(state_dir / DB_NAME, 0o600)
    with pytest.raises(GeneralFailure, match="older layout"):
        CacheVerifier(state_dir, None)  # the CLI leaves it alone
    with CacheVerifier(state_dir, "v") as v:
        assert v.entries() == []
        v.record(T1, [b"m"], [], uid=U)
        assert v.verify(T1, [b"m"], [], uid=U)


def test_rerecord_replaces_tag(state_dir: Path) -> None:
    with CacheVerifier(state_dir, "v") as v:
        v.record(T1, [b"stage1"], [b"w"], uid=U)
        v.record(T1, [b"stage2"], [b"w"], uid=U)
        assert not v.verify(T1, [b"stage1"], [b"w"], uid=U)
        assert v.verify(T1, [b"stage2"], [b"w"], uid=U)
        assert len(v.entries()) == 1


def test_many_connections_at_once(state_dir: Path) -> None:
    """Several maps on one DB (as several driver processes) record and verify concurrently."""
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            with CacheVerifier(state_dir, "v") as v:
                for j in range(20):
                    t = bytes([i, j]) * 16
                    v.record(t, [t], [b"d"], uid=U)
                    assert v.verify(t, [t], [b"d"], uid=U)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with CacheVerifier(state_dir, "v") as v:
        assert len(v.entries()) == 80


def test_new_map_opened_by_many_at_once(tmp_path: Path) -> None:
    """Driver processes opening a map that does not exist yet all get it.

    Switching the new file to WAL needs an exclusive lock and SQLite refuses it at
    once, without its busy handler, while another connection holds the file: one
    opener in ~30 failed with "database is locked" (CI) before the switch waited.
    """
    errors: list[BaseException] = []

    def opener(d: Path) -> None:
        try:
            with CacheVerifier(d, "v") as v:
                v.record(T1, [b"m"], [], uid=U)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    for n in range(40):
        d = tmp_path / f"s{n}"
        d.mkdir(mode=0o700)
        threads = [threading.Thread(target=opener, args=(d,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_max_entries_must_be_positive(state_dir: Path) -> None:
    with pytest.raises(InvalidArgument):
        CacheVerifier(state_dir, "v", max_entries=0)
