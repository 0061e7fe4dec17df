"""Two nodes, one Redis: node B's driver loads what node A's builder published, without
compiling; a tampered or unsigned entry is refused (a logged miss) and B compiles.

Real processes throughout: redis-server on a Unix socket, `npu cache publish` on the
builder, node B's driver host (`npu driver`, with [fleet] in its config), and the app on
node B through `npumanager.nn`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="the [fleet] extra is not installed")
pytest.importorskip("redis", reason="the [fleet] extra is not installed")

from npumanager import nn
from npumanager.cache.fleet import SigningKey, seal_entry
from npumanager.drivers.base import CompileOptions
from npumanager.drivers.fleet_tier import FleetConfig, driver_identity, fleet_key
from npumanager.drivers.reference import ReferenceDriver
from npumanager.testing.daemon import to_toml
from npumanager.testing.driver_host import DriverProcess, running_driver
from npumanager.testing.redis_server import RedisServer
from tests.cache.models import LinearModel

pytestmark = pytest.mark.slow

TOKEN = b"an-app-token-of-exactly-32-byte!"
MODEL = LinearModel(31)


@pytest.fixture
def keys(tmp_path: Path, builder_key: SigningKey) -> tuple[Path, Path]:
    priv = tmp_path / "builder.pem"
    return priv, builder_key.save(priv)


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[object]:
    s = FleetConfig(redis_url=redis_server.url).store()
    s._client.flushall()
    yield s
    s.close()


@pytest.fixture
def node_b(redis_server: RedisServer, keys: tuple[Path, Path], runtime_dir: Path,
           state_dir: Path, tmp_path: Path, store: object) -> Iterator[DriverProcess]:
    cfg = tmp_path / "node-b.toml"
    cfg.write_text(to_toml({"fleet": {"redis_url": redis_server.url,
                                      "trusted_keys": [str(keys[1])]}}))
    with running_driver("reference", runtime_dir, state_dir, config=cfg,
                        args=["--no-enforce-admission"]) as d:
        yield d


def publish(redis_url: str, priv: Path, model_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "npumanager", "cache", "publish", str(model_path),
                    "--key", str(priv), "--redis", redis_url], check=True,
                   capture_output=True)


def prepare(rt: Path, app: Path) -> tuple[bool, bool]:
    with nn.device("reference", rt) as dev:
        model = dev.prepare_model(MODEL.onnx_bytes, cache_dir=app, token=TOKEN)
        try:
            assert MODEL.matches(model.execute({"x": MODEL.x}))
            return bool(model.loaded_from_cache), bool(model.loaded_from_fleet)
        finally:
            model.release()


def test_node_b_loads_what_the_builder_published_without_compiling(
        redis_server: RedisServer, keys: tuple[Path, Path], node_b: DriverProcess,
        runtime_dir: Path, tmp_path: Path) -> None:
    model_path = tmp_path / "model.onnx"
    model_path.write_bytes(MODEL.onnx_bytes)
    publish(redis_server.url, keys[0], model_path)  # node A, the builder
    app = tmp_path / "app"
    app.mkdir()
    assert prepare(runtime_dir, app) == (True, True)  # a fleet hit: no compile on B
    # It went through the local verified path: the app's files now give a local hit.
    assert prepare(runtime_dir, app) == (True, False)


def _put(store: object, entry: bytes) -> None:
    key = fleet_key(driver_identity(ReferenceDriver({})), MODEL.onnx_bytes, CompileOptions(),
                    (1, 1))
    store.put(key, entry)  # type: ignore[attr-defined]


def test_unsigned_or_tampered_entries_are_refused_and_node_b_compiles(
        node_b: DriverProcess, runtime_dir: Path, tmp_path: Path, store: object,
        builder_key: SigningKey) -> None:
    from npumanager.drivers.reference_cache import artifacts_from_onnx

    key = fleet_key(driver_identity(ReferenceDriver({})), MODEL.onnx_bytes, CompileOptions(),
                    (1, 1))
    m, d = artifacts_from_onnx(MODEL.onnx_bytes, "all")
    good = seal_entry(key, m, d, builder_key)
    tampered = bytearray(good)
    tampered[-5] ^= 0x01
    for i, entry in enumerate([seal_entry(key, m, d, SigningKey.generate()),  # unknown key
                               bytes(tampered), good[: len(good) // 2]]):
        _put(store, entry)
        app = tmp_path / f"app{i}"
        app.mkdir()
        assert prepare(runtime_dir, app) == (False, False)  # compiled, right outputs


def test_a_model_with_external_data_never_asks_the_fleet(
        node_b: DriverProcess, runtime_dir: Path, tmp_path: Path, store: object) -> None:
    # The fleet key hashes the model bytes, and those do not cover the weights in the
    # files the app sent: an entry for the same model.onnx with other weights would be a
    # wrong answer, so the driver compiles without a lookup.
    import numpy as np

    from npumanager.testing.external_models import save_external_model

    def getranges() -> int:
        stats = store._client.info("commandstats")  # type: ignore[attr-defined]
        return int(stats.get("cmdstat_getrange", {}).get("calls", 0))

    path = save_external_model(tmp_path / "m", scale=3.0, bias=0.5)
    x = np.ones((1, 4), np.float32)
    before = getranges()
    app = tmp_path / "app"
    app.mkdir()
    with nn.device("reference", runtime_dir) as dev:
        model = dev.prepare_model(path, cache_dir=app, token=TOKEN)
        try:
            assert (model.loaded_from_cache, model.loaded_from_fleet) == (False, False)
            np.testing.assert_allclose(model.execute({"x": x})["y"], x * 3.0 + 0.5)
        finally:
            model.release()
    assert getranges() == before
