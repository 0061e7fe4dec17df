"""`npu cache publish`: a builder compiles, signs and uploads; a node's tier then hits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("cryptography", reason="the [fleet] extra is not installed")
pytest.importorskip("redis", reason="the [fleet] extra is not installed")

from npumanager.cache.fleet import SigningKey
from npumanager.cli.main import main
from npumanager.drivers.base import CompileOptions
from npumanager.drivers.fleet_tier import FleetConfig, FleetTier
from npumanager.drivers.reference import ReferenceDriver
from npumanager.testing.redis_server import RedisServer
from tests.cache.models import LinearModel

MODEL = LinearModel(21)


@pytest.fixture
def keys(tmp_path: Path, builder_key: SigningKey) -> tuple[Path, Path]:
    priv = tmp_path / "builder.pem"
    return priv, builder_key.save(priv)


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    p = tmp_path / "model.onnx"
    p.write_bytes(MODEL.onnx_bytes)
    return p


def node_tier(url: str, pub: Path) -> FleetTier:
    return FleetTier(FleetConfig(redis_url=url, trusted_keys=(str(pub),)),
                     ReferenceDriver({}), (1, 1))


def test_publish_compiles_signs_uploads_and_a_node_hits(
        redis_server: RedisServer, keys: tuple[Path, Path], model_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    priv, pub = keys
    rc = main(["cache", "publish", str(model_file), "--key", str(priv),
               "--redis", redis_server.url, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["source"] == "compiled" and out["backend"] == "reference"
    tier = node_tier(redis_server.url, pub)
    art = tier.lookup(MODEL.onnx_bytes, CompileOptions())
    assert art is not None and art.key.digest() == out["key"]
    model = ReferenceDriver({}).load_artifacts(art.model_blobs, art.data_blobs,
                                               CompileOptions())
    assert MODEL.matches(model.run({"x": MODEL.x}))
    # Another preference is another key: the node misses until it is published too.
    assert tier.lookup(MODEL.onnx_bytes, CompileOptions(preference=0)) is None
    tier.close()


def test_publish_reads_keys_and_url_from_the_config(
        redis_server: RedisServer, keys: tuple[Path, Path], model_file: Path,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    priv, pub = keys
    cfg = tmp_path / "builder.toml"
    cfg.write_text(f'[fleet]\nredis_url = "{redis_server.url}"\nsigning_key = "{priv}"\n'
                   'key_prefix = "test:cfg:"\n')
    assert main(["cache", "publish", str(model_file), "--config", str(cfg),
                 "--preference", "0"]) == 0
    out = capsys.readouterr().out
    assert "published reference" in out
    assert re.search(r": [0-9.]+ (B|KiB|MiB) \(compiled", out), out  # was "1234 bytes"
    tier = FleetTier(FleetConfig(redis_url=redis_server.url, trusted_keys=(str(pub),),
                                 key_prefix="test:cfg:"), ReferenceDriver({}), (1, 1))
    assert tier.lookup(MODEL.onnx_bytes, CompileOptions(preference=0)) is not None
    tier.close()


def test_publish_takes_existing_cache_files(
        redis_server: RedisServer, keys: tuple[Path, Path], model_file: Path,
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A driver already wrote this app's cache files; the builder publishes them as they are."""
    from npumanager.drivers.reference_cache import artifacts_from_onnx
    from npumanager.nn import cache_file_names, driver_token

    priv, pub = keys
    token = bytes(range(32))
    driver = ReferenceDriver({})
    dtoken = driver_token(token, "reference", driver.version, 1, 100)
    mpaths, dpaths = cache_file_names(tmp_path, dtoken, 1, 1)
    m, d = artifacts_from_onnx(MODEL.onnx_bytes, "all")
    Path(mpaths[0]).write_bytes(m[0])
    Path(dpaths[0]).write_bytes(d[0])
    assert main(["cache", "publish", str(model_file), "--key", str(priv), "--redis",
                 redis_server.url, "--cache-dir", str(tmp_path), "--token", token.hex(),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "cache files"
    art = node_tier(redis_server.url, pub).lookup(MODEL.onnx_bytes, CompileOptions())
    assert art is not None and art.model_blobs == m and art.data_blobs == d


def test_publish_usage_errors_exit_2(keys: tuple[Path, Path], model_file: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    priv, _ = keys
    assert main(["cache", "publish", str(model_file), "--redis", "unix:///x"]) == 2
    assert "no signing key" in capsys.readouterr().err
    assert main(["cache", "publish", str(model_file), "--key", str(priv)]) == 2
    assert "no Redis" in capsys.readouterr().err
    assert main(["cache", "publish", str(model_file), "--key", str(priv), "--redis",
                 "unix:///x", "--token", "00" * 32]) == 2
    assert "go together" in capsys.readouterr().err


def test_publish_to_an_unreachable_redis_exits_1(keys: tuple[Path, Path], model_file: Path,
                                                 tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    priv, _ = keys
    assert main(["cache", "publish", str(model_file), "--key", str(priv), "--redis",
                 f"unix://{tmp_path}/none.sock"]) == 1
    assert "cannot publish" in capsys.readouterr().err
