"""BlobCache: nnCache limits, eviction policies, file format, persistence."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from npumanager.cache import BlobCache, ClockScheduler
from npumanager.cache.blobcache import BLOB_CACHE_MAGIC, FILE_MAGIC
from npumanager.cache.crc import crc32c_nn, crc32c_nn_table
from npumanager.errors import InvalidArgument
from npumanager.testing.clock import VirtualClock

KIB = 1024


def mem(
    max_total: int = 100, policy: tuple[str, str] = ("lru", "halve"), **kw: object
) -> BlobCache:
    return BlobCache(None, 10, 50, max_total, policy, seed=1, **kw)  # type: ignore[arg-type]


# --- CRC ---------------------------------------------------------------------------


def _bitwise(data: bytes) -> int:
    # nnCache's crc32c(): r ^= byte; 8 x (r & 1 ? (r >> 1) ^ poly : r >> 1); init 0, no xorout.
    r = 0
    for b in data:
        r ^= b
        for _ in range(8):
            r = (r >> 1) ^ 0x82F63B78 if r & 1 else r >> 1
    return r


@pytest.mark.parametrize("data", [b"", b"a", b"123456789", bytes(32), bytes(range(256)) * 3])
def test_crc32c_matches_nncache_definition(data: bytes) -> None:
    assert crc32c_nn(data) == _bitwise(data) == crc32c_nn_table(data)


def test_crc32c_standard_check_value() -> None:
    # With the standard init/xorout the same polynomial gives CRC-32C's check value.
    assert crc32c_nn_table(b"123456789", 0xFFFFFFFF) ^ 0xFFFFFFFF == 0xE3069283
    assert crc32c_nn(b"123456789") == 0x58E3FA20


# --- limits --------------------------------------------------------------------------


def test_set_get_and_replace() -> None:
    c = mem()
    assert c.get(b"k") is None
    c.set(b"k", b"v1")
    assert c.get(b"k") == b"v1"
    c.set(b"k", b"value2")
    assert c.get(b"k") == b"value2" and c.total_size == 7 and len(c) == 1


@pytest.mark.parametrize(
    "key,value",
    [(b"k" * 11, b"v"), (b"k", b"v" * 51), (b"", b"v"), (b"k", b"")],
    ids=["key-too-large", "value-too-large", "empty-key", "empty-value"],
)
def test_rejected_sets_keep_the_old_value(key: bytes, value: bytes) -> None:
    c = mem()
    c.set(key[:1] or b"k", b"old")
    c.set(key, value)
    assert c.get(key[:1] or b"k") == b"old"
    assert c.get(key) in (None, b"old")


def test_combined_size_over_total_is_ignored() -> None:
    c = BlobCache(None, 10, 50, 40, ("lru", "fit"))
    c.set(b"a", b"x")
    c.set(b"k" * 10, b"v" * 31)  # 41 > 40 total although each part is within its limit
    assert c.get(b"k" * 10) is None and c.get(b"a") == b"x"


def test_get_with_oversized_key() -> None:
    assert mem().get(b"k" * 11) is None


# --- eviction ------------------------------------------------------------------------


def fill(c: BlobCache, n: int, size: int = 10) -> list[bytes]:
    keys = [bytes([ord("a") + i]) for i in range(n)]
    for k in keys:
        c.set(k, b"v" * (size - 1))  # key (1) + value = size
    return keys


def test_lru_halve() -> None:
    c = mem(100, ("lru", "halve"))
    keys = fill(c, 10)  # exactly 100
    for k in keys[:5]:
        assert c.get(k) is not None  # make a..e recent
    c.set(b"z", b"v" * 9)  # over: evict least recent down to 50, then insert
    assert c.total_size == 60
    assert set(c.keys()) == {*keys[:5], b"z"}


def test_lru_fit_evicts_just_enough() -> None:
    c = mem(100, ("lru", "fit"))
    keys = fill(c, 10)
    c.set(b"z", b"v" * 19)  # needs 20: target 80 -> the two least recent go
    assert set(c.keys()) == {*keys[2:], b"z"} and c.total_size == 100


def test_lru_fit_halve_takes_the_smaller_target() -> None:
    c = mem(100, ("lru", "fit_halve"))
    keys = fill(c, 10)
    c.set(b"z", b"v" * 9)  # fit target 90, halve 50 -> 50
    assert set(c.keys()) == {*keys[5:], b"z"} and c.total_size == 60


def test_replacing_counts_the_replaced_entry_for_fit() -> None:
    c = mem(100, ("lru", "fit"))
    keys = fill(c, 10)
    c.get(keys[0])
    c.set(keys[0], b"v" * 19)  # grows by 10: target 100 - (20 - 10) = 90 -> one victim
    assert c.get(keys[0]) == b"v" * 19
    assert len(c) == 9 and c.total_size == 100 and keys[1] not in c


def test_random_halve_is_seeded_and_halves() -> None:
    kept = []
    for _ in range(2):
        c = mem(100, ("random", "halve"))
        fill(c, 10)
        c.set(b"z", b"v" * 9)
        assert c.total_size <= 60 and b"z" in c
        kept.append(c.keys())
    assert kept[0] == kept[1]  # same seed, same victims


def test_halve_not_cleanable_drops_new_entry() -> None:
    # HALVE is cleanable only above max/2: a 45-byte cache cannot take a 60-byte entry.
    c = BlobCache(None, 10, 60, 100, ("lru", "halve"))
    c.set(b"a", b"v" * 44)
    c.set(b"b", b"v" * 59)
    assert c.keys() == [b"a"]
    # FIT is cleanable whenever non-empty: the old entry goes.
    c = BlobCache(None, 10, 60, 100, ("lru", "fit"))
    c.set(b"a", b"v" * 44)
    c.set(b"b", b"v" * 59)
    assert c.keys() == [b"b"]


@pytest.mark.parametrize("policy", [("mru", "halve"), ("lru", "double"), ("lru",)])
def test_bad_policy(policy: tuple[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        BlobCache(None, 1, 1, 1, policy)


# --- file format and persistence -----------------------------------------------------


def populated(path: Path, **kw: object) -> BlobCache:
    c = BlobCache(path, 12 * KIB, 64 * KIB, 2 * 1024 * KIB, ("lru", "halve"), "BUILD.1", **kw)  # type: ignore[arg-type]
    for k, v in [(b"bb", b"2" * 5), (b"a", b"1" * 3), (b"ab", b"3" * 7), (b"ccc", os.urandom(999))]:
        c.set(k, v)
    return c


def test_format_layout(tmp_path: Path) -> None:
    c = populated(tmp_path / "cache")
    assert c.save()
    data = (tmp_path / "cache").read_bytes()
    assert data[:4] == FILE_MAGIC
    payload = data[8:]
    assert struct.unpack("@I", data[4:8])[0] == crc32c_nn(payload)
    magic, version, dev, n, bid_len = struct.unpack_from("@IIInI", payload)
    assert (magic, version, dev, n, bid_len) == (BLOB_CACHE_MAGIC, 3, 1, 4, 7)
    assert payload[28:35] == b"BUILD.1"
    # Entries sorted by key length, then bytes, each 4-byte aligned.
    off = (32 + 7 + 3) & ~3
    keys = []
    for _ in range(n):
        ks, vs = struct.unpack_from("@NN", payload, off)
        keys.append(payload[off + 16 : off + 16 + ks])
        off += (16 + ks + vs + 3) & ~3
    assert keys == [b"a", b"ab", b"bb", b"ccc"]
    assert len(payload) == ((32 + 92 + 3) & ~3) + sum(
        (16 + len(k) + len(c.get(k) or b"") + 3) & ~3 for k in keys
    )
    assert os.stat(tmp_path / "cache").st_mode & 0o777 == 0o400
    c.close()


def test_round_trip(tmp_path: Path) -> None:
    c = populated(tmp_path / "cache")
    expected = {k: c.get(k) for k in c}
    c.close()  # close saves
    c2 = BlobCache(
        tmp_path / "cache", 12 * KIB, 64 * KIB, 2 * 1024 * KIB, ("lru", "halve"), "BUILD.1"
    )
    assert {k: c2.get(k) for k in c2} == expected
    # Saving again over the read-only file works (atomic replace).
    c2.set(b"new", b"value")
    assert c2.save()
    c2.close()
    c3 = BlobCache(tmp_path / "cache", 12 * KIB, 64 * KIB, 2 * 1024 * KIB, build_id="BUILD.1")
    assert c3.get(b"new") == b"value" and len(c3) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["cache"]  # no temp files left


def test_loaded_entries_obey_current_limits(tmp_path: Path) -> None:
    populated(tmp_path / "cache").close()
    c = BlobCache(tmp_path / "cache", 12 * KIB, 100, 2 * 1024 * KIB, build_id="BUILD.1")
    assert c.get(b"ccc") is None and c.get(b"a") == b"111"


def test_build_id_mismatch_is_an_empty_cache(tmp_path: Path) -> None:
    populated(tmp_path / "cache").close()
    c = BlobCache(tmp_path / "cache", 12 * KIB, 64 * KIB, 2 * 1024 * KIB, build_id="BUILD.2")
    assert len(c) == 0 and c.get(b"a") is None


@pytest.mark.parametrize("where", ["magic", "crc", "payload", "truncated", "empty", "count"])
def test_corrupted_file_is_an_empty_cache(tmp_path: Path, where: str) -> None:
    p = tmp_path / "cache"
    populated(p).close()
    data = bytearray(p.read_bytes())
    if where == "magic":
        data[0] ^= 1
    elif where == "crc":
        data[5] ^= 1
    elif where == "payload":
        data[-40] ^= 1
    elif where == "truncated":
        data = data[:-50]
    elif where == "empty":
        data = bytearray()
    else:  # a valid CRC over a header claiming more entries than there are
        struct.pack_into("@n", data, 8 + 16, 1000)
        struct.pack_into("@I", data, 4, crc32c_nn(bytes(data[8:])))
    os.chmod(p, 0o600)
    p.write_bytes(bytes(data))
    c = BlobCache(p, 12 * KIB, 64 * KIB, 2 * 1024 * KIB, build_id="BUILD.1")
    assert len(c) == 0


def test_oversized_file_is_ignored(tmp_path: Path) -> None:
    # ~1.1 KiB: more than any save of a 20-byte cache writes (334 bytes at most).
    populated(tmp_path / "cache").close()
    c = BlobCache(tmp_path / "cache", 12 * KIB, 64 * KIB, 20, build_id="BUILD.1")
    assert len(c) == 0


def test_deferred_save_once_per_delay(tmp_path: Path) -> None:
    clock = VirtualClock()
    sched = ClockScheduler(clock)
    p = tmp_path / "cache"
    c = BlobCache(p, 10, 50, 100, build_id="B", scheduler=sched, save_delay_s=4.0)
    c.set(b"a", b"1")
    c.set(b"b", b"2")
    assert sched.pending == 1 and not p.exists()
    clock.advance(3.9)
    assert sched.run_due() == 0 and not p.exists()
    clock.advance(0.1)
    assert sched.run_due() == 1 and p.exists()
    assert BlobCache(p, 10, 50, 100, build_id="B").get(b"b") == b"2"
    c.set(b"c", b"3")  # the next set schedules the next save
    assert sched.pending == 1
    c.close()  # close cancels it and saves now
    assert sched.pending == 0
    assert BlobCache(p, 10, 50, 100, build_id="B").get(b"c") == b"3"


def test_memory_only_cache_never_writes(tmp_path: Path) -> None:
    c = mem()
    c.set(b"a", b"1")
    assert not c.save()
    c.close()


def test_lazy_load(tmp_path: Path) -> None:
    p = tmp_path / "cache"
    populated(p).close()
    c = BlobCache(p, 12 * KIB, 64 * KIB, 2 * 1024 * KIB, build_id="BUILD.1")
    os.chmod(p, 0o600)
    p.unlink()  # nothing was read yet
    assert len(c) == 0
    c.close()


def test_build_id_length_bound() -> None:
    with pytest.raises(InvalidArgument):
        BlobCache(None, 1, 1, 1, build_id="x" * 92)


def test_a_full_cache_of_tiny_entries_loads_again(tmp_path: Path) -> None:
    # 10 entries, 85 bytes of keys and values flatten to a 404-byte file: more than
    # Android's 2 x max_total_size (400). The cache's own save must load again.
    p = tmp_path / "cache"
    c = BlobCache(p, 5, 30, 200, ("random", "halve"), build_id="b", seed=1)
    for i in range(10):
        c.set(bytes([i]) * (1 + i % 4), b"\x00" * (1 + 3 * i))
    before = {k: c.get(k) for k in c}
    c.close()
    assert p.stat().st_size > 2 * 200
    again = BlobCache(p, 5, 30, 200, ("random", "halve"), build_id="b")
    assert {k: again.get(k) for k in again} == before
