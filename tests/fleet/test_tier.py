"""The driver's fleet tier: a builder's signed artifact loads on a node; anything else misses."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

pytest.importorskip("cryptography", reason="the [fleet] extra is not installed")
pytest.importorskip("redis", reason="the [fleet] extra is not installed")

from npumanager.cache.fleet import SigningKey, raw_public_key, seal_entry
from npumanager.drivers.base import CompileOptions
from npumanager.drivers.fleet_tier import (
    FleetConfig,
    FleetTier,
    build_entry,
    driver_identity,
    fleet_key,
    open_tier,
)
from npumanager.drivers.reference import ReferenceDriver
from npumanager.errors import InvalidArgument
from npumanager.testing.redis_server import RedisServer
from tests.cache.models import LinearModel

MODEL = LinearModel(7)
OPTS = CompileOptions(preference=1, priority=100)
COUNTS = (1, 1)


@pytest.fixture(scope="module")
def driver() -> ReferenceDriver:
    return ReferenceDriver({})


@pytest.fixture
def cfg(redis_server: RedisServer, builder_key: SigningKey) -> Iterator[FleetConfig]:
    c = FleetConfig(redis_url=redis_server.url,
                    trusted_keys=(raw_public_key(builder_key.public_key),))
    store = c.store()
    store._client.flushall()
    store.close()
    yield c


@pytest.fixture
def tier(cfg: FleetConfig, driver: ReferenceDriver) -> Iterator[FleetTier]:
    t = FleetTier(cfg, driver, COUNTS)
    yield t
    t.close()


def publish(cfg: FleetConfig, driver: ReferenceDriver, signer: SigningKey,
            model: LinearModel = MODEL) -> None:
    key, entry, _ = build_entry(driver, COUNTS, model.onnx_bytes, OPTS, signer)
    store = cfg.store()
    store.put(key, entry)
    store.close()


def test_published_artifact_loads_and_computes_the_model(
        cfg: FleetConfig, tier: FleetTier, driver: ReferenceDriver,
        builder_key: SigningKey) -> None:
    assert tier.lookup(MODEL.onnx_bytes, OPTS) is None
    assert tier.stats["miss"] == 1
    publish(cfg, driver, builder_key)
    art = tier.lookup(MODEL.onnx_bytes, OPTS)
    assert art is not None and tier.stats["hit"] == 1
    model = driver.load_artifacts(art.model_blobs, art.data_blobs, OPTS)
    assert MODEL.matches(model.run({"x": MODEL.x}))
    # Other options or another model are other keys: misses.
    assert tier.lookup(MODEL.onnx_bytes, CompileOptions(preference=0)) is None
    assert tier.lookup(LinearModel(8).onnx_bytes, OPTS) is None


def test_entry_signed_by_an_untrusted_key_misses_and_is_logged_once(
        cfg: FleetConfig, tier: FleetTier, driver: ReferenceDriver,
        caplog: pytest.LogCaptureFixture) -> None:
    publish(cfg, driver, SigningKey.generate())
    with caplog.at_level(logging.WARNING, "npumanager.drivers.fleet"):
        assert tier.lookup(MODEL.onnx_bytes, OPTS) is None
        assert tier.lookup(MODEL.onnx_bytes, OPTS) is None
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1 and "unknown key" in refusals[0].getMessage()
    assert tier.stats["refused"] == 2


def test_tampered_entry_in_redis_misses(cfg: FleetConfig, tier: FleetTier,
                                       driver: ReferenceDriver, builder_key: SigningKey,
                                       caplog: pytest.LogCaptureFixture) -> None:
    publish(cfg, driver, builder_key)
    store = cfg.store()
    key = fleet_key(driver_identity(driver), MODEL.onnx_bytes, OPTS, COUNTS)
    entry = bytearray(store.get(key) or b"")
    entry[-10] ^= 0x01  # a weight byte
    store.put(key, bytes(entry))
    with caplog.at_level(logging.WARNING, "npumanager.drivers.fleet"):
        assert tier.lookup(MODEL.onnx_bytes, OPTS) is None
    assert "does not match its signed hash" in caplog.text
    store.put(key, bytes(entry[: len(entry) // 2]))  # truncated
    assert tier.lookup(MODEL.onnx_bytes, OPTS) is None
    assert "blob bytes" in caplog.text
    store.close()


def test_signed_entry_moved_to_another_models_key_misses(
        cfg: FleetConfig, tier: FleetTier, driver: ReferenceDriver,
        builder_key: SigningKey, caplog: pytest.LogCaptureFixture) -> None:
    """Someone with write access to Redis copies model B's genuine entry under model A's key."""
    other = LinearModel(9)
    _, entry_b, _ = build_entry(driver, COUNTS, other.onnx_bytes, OPTS, builder_key)
    store = cfg.store()
    store.put(fleet_key(driver_identity(driver), MODEL.onnx_bytes, OPTS, COUNTS), entry_b)
    with caplog.at_level(logging.WARNING, "npumanager.drivers.fleet"):
        assert tier.lookup(MODEL.onnx_bytes, OPTS) is None
    assert "another key" in caplog.text
    store.close()


def test_wrong_blob_count_misses(cfg: FleetConfig, tier: FleetTier, driver: ReferenceDriver,
                                 builder_key: SigningKey) -> None:
    key = fleet_key(driver_identity(driver), MODEL.onnx_bytes, OPTS, COUNTS)
    store = cfg.store()
    store.put(key, seal_entry(key, [b"a", b"b"], [b"c"], builder_key))
    assert tier.lookup(MODEL.onnx_bytes, OPTS) is None and tier.stats["refused"] == 1
    store.close()


def test_unreachable_redis_misses_and_warns_once_per_outage(
        tmp_path: object, driver: ReferenceDriver, builder_key: SigningKey,
        caplog: pytest.LogCaptureFixture) -> None:
    cfg = FleetConfig(redis_url=f"unix://{tmp_path}/gone.sock",
                      trusted_keys=(raw_public_key(builder_key.public_key),),
                      connect_timeout_s=0.2, timeout_s=0.2)
    t = FleetTier(cfg, driver, COUNTS)
    with caplog.at_level(logging.WARNING, "npumanager.drivers.fleet"):
        assert t.lookup(MODEL.onnx_bytes, OPTS) is None
        assert t.lookup(MODEL.onnx_bytes, OPTS) is None
    assert caplog.text.count("unavailable") == 1 and t.stats["unavailable"] == 2


def test_config_section_off_or_broken_gives_no_tier(driver: ReferenceDriver,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    assert open_tier({}, driver, COUNTS) is None
    assert open_tier({"redis_url": "unix:///x"}, driver, COUNTS) is None  # nobody trusted
    with caplog.at_level(logging.ERROR, "npumanager.drivers.fleet"):
        assert open_tier({"redis_url": "unix:///x", "trusted_keys": ["/nonexistent.pem"]},
                         driver, COUNTS) is None
    assert "fleet cache tier disabled" in caplog.text
    with pytest.raises(InvalidArgument, match="trusted_keys"):
        FleetConfig.from_section({"trusted_keys": "one.pem"})


def test_identity_names_backend_version_and_cpu(driver: ReferenceDriver) -> None:
    backend, version, device = driver_identity(driver)
    assert backend == "reference" and version == driver.version
    assert "onnxruntime" in device and "|" in device
