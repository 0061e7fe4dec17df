"""The Redis store of fleet entries, on a real redis-server (Unix socket, no TCP port)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("redis", reason="the [fleet] extra (redis) is not installed")

from npumanager.cache.fleet import FleetKey, FleetRefused
from npumanager.cache.fleet_store import FleetStore, FleetUnavailable
from npumanager.testing.redis_server import SKIP_REASON, RedisServer, redis_server_binary

pytestmark = pytest.mark.skipif(redis_server_binary() is None, reason=SKIP_REASON)

KEY = FleetKey.for_model("reference", "1", "cpu", b"model", {"preference": 1})


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as r:
        yield r


@pytest.fixture
def store(server: RedisServer) -> Iterator[FleetStore]:
    s = FleetStore(server.url, chunk_bytes=1000, max_entry_bytes=100_000)
    s._client.flushall()
    yield s
    s.close()


def test_missing_entry_is_none(store: FleetStore) -> None:
    assert store.get(KEY) is None


@pytest.mark.parametrize("size", [1, 999, 1000, 1001, 25_000])
def test_put_get_round_trip_across_chunk_boundaries(store: FleetStore, size: int) -> None:
    entry = bytes(i % 251 for i in range(size))
    store.put(KEY, entry)
    assert store.get(KEY) == entry


def test_republish_replaces_and_drops_the_old_chunks(store: FleetStore) -> None:
    store.put(KEY, b"a" * 5000)
    store.put(KEY, b"b" * 2500)
    assert store.get(KEY) == b"b" * 2500
    names = store._client.keys(store.prefix + "*")
    assert len(names) == 1 + 3  # manifest + 3 chunks of the new generation only
    assert store.delete(KEY) and store.get(KEY) is None
    assert store._client.keys(store.prefix + "*") == []


def test_entry_over_the_bound_is_refused_before_its_chunks_are_read(server: RedisServer) -> None:
    big = FleetStore(server.url, chunk_bytes=1000)
    big._client.flushall()
    big.put(KEY, b"x" * 50_000)
    small = FleetStore(server.url, chunk_bytes=1000, max_entry_bytes=10_000)
    with pytest.raises(FleetRefused, match="exceeds max_entry_bytes"):
        small.get(KEY)


def test_truncated_or_oversized_chunk_is_refused(store: FleetStore) -> None:
    store.put(KEY, b"y" * 2500)
    chunk = sorted(n for n in store._client.keys(store.prefix + "*") if n.endswith(b":1"))[0]
    store._client.set(chunk, b"y" * 999)
    with pytest.raises(FleetRefused, match="chunk 1 holds 999"):
        store.get(KEY)
    store._client.set(chunk, b"y" * 5000)  # a lying store: only chunk+1 bytes are read
    with pytest.raises(FleetRefused, match="chunk 1 holds 1001"):
        store.get(KEY)


def test_garbage_manifest_is_refused(store: FleetStore) -> None:
    store._client.set(store.prefix + KEY.digest(), b"garbage")
    with pytest.raises(FleetRefused, match="malformed manifest"):
        store.get(KEY)
    store._client.set(store.prefix + KEY.digest(), b"X" * 100)
    with pytest.raises(FleetRefused, match="malformed manifest"):
        store.get(KEY)


def test_ttl_expires_entries(store: FleetStore) -> None:
    store.put(KEY, b"z" * 10, ttl_s=60)
    ttls = [store._client.pttl(n) for n in store._client.keys(store.prefix + "*")]
    assert ttls and all(0 < t <= 60_000 for t in ttls)


def test_unreachable_store_is_unavailable_not_a_miss(tmp_path: object) -> None:
    s = FleetStore(f"unix://{tmp_path}/nothing.sock", connect_timeout_s=0.2, timeout_s=0.2)
    with pytest.raises(FleetUnavailable):
        s.get(KEY)
    with pytest.raises(FleetUnavailable):
        s.ping()
