"""Fixtures of the fleet tests: a real redis-server, a builder key, a reference driver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from npumanager.testing.redis_server import SKIP_REASON, RedisServer, redis_server_binary


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.skip(SKIP_REASON)
    pytest.importorskip("redis", reason="the [fleet] extra (redis) is not installed")
    with RedisServer() as r:
        yield r


@pytest.fixture(scope="module")
def builder_key() -> object:
    pytest.importorskip("cryptography", reason="the [fleet] extra is not installed")
    from npumanager.cache.fleet import SigningKey

    return SigningKey.generate()
