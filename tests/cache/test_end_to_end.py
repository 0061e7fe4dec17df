"""Compilation caching end to end: nn client -> SCM_RIGHTS -> real driver host process."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager import nn
from npumanager.errors import InvalidArgument
from npumanager.testing.driver_host import running_driver
from npumanager.testing.filewatch import DirectoryWatch
from tests.cache.models import LinearModel

pytestmark = pytest.mark.slow

APP_TOKEN = b"my-app-token-of-exactly-32-bytes"
A = LinearModel(1)
B = LinearModel(2)


def files(app: Path, token: bytes, dev: nn.Device) -> list[Path]:
    t = nn.driver_token(
        token, dev.name, dev.version, nn.ExecutionPreference.FAST_SINGLE_ANSWER, 100
    )
    m, d = nn.cache_file_names(app, t, *dev.get_number_of_cache_files_needed())
    return [Path(p) for p in m + d]


@pytest.fixture
def app(tmp_path: Path) -> Path:
    d = tmp_path / "app-cache"
    d.mkdir()
    return d


def prepare(dev: nn.Device, model: LinearModel, app: Path, token: bytes = APP_TOKEN) -> bool:
    m = dev.prepare_model(model.onnx_bytes, cache_dir=app, token=token)
    try:
        out = m.execute({"x": model.x})
        assert model.matches(out)
        return bool(m.loaded_from_cache)
    finally:
        m.release()


@pytest.fixture
def driver_env(runtime_dir: Path, state_dir: Path) -> Iterator[tuple[Path, Path]]:
    with running_driver("reference", runtime_dir, state_dir, args=["--no-enforce-admission"]):
        yield runtime_dir, state_dir


def test_second_run_skips_compilation_and_tampering_falls_back(
    driver_env: tuple[Path, Path], app: Path
) -> None:
    rt, _ = driver_env
    with nn.device("reference", rt) as dev:
        assert dev.get_number_of_cache_files_needed() == (1, 1)
        assert not prepare(dev, A, app)
        assert prepare(dev, A, app)
        paths = files(app, APP_TOKEN, dev)
        assert all(p.exists() and p.stat().st_mode & 0o777 == 0o600 for p in paths)
        # A flipped bit in the model cache: fallback compile, right outputs, then a hit.
        data = bytearray(paths[0].read_bytes())
        data[len(data) // 2] ^= 0x10
        paths[0].write_bytes(bytes(data))
        assert not prepare(dev, A, app)
        assert prepare(dev, A, app)
        # Another model's cache copied over this token's files.
        other = b"another-app-token-of-32-bytes..."
        assert not prepare(dev, B, app, other)
        for src, dst in zip(files(app, other, dev), paths, strict=True):
            shutil.copyfile(src, dst)
        assert not prepare(dev, A, app)  # A's outputs (asserted inside), never B's
        assert prepare(dev, A, app)
        with pytest.raises(InvalidArgument):
            dev.prepare_model(A.onnx_bytes, cache_dir=app, token=b"short")


def test_cache_survives_a_driver_restart(runtime_dir: Path, state_dir: Path, app: Path) -> None:
    args = ["--no-enforce-admission"]
    with (
        running_driver("reference", runtime_dir, state_dir, args=args),
        nn.device("reference", runtime_dir) as dev,
    ):
        assert not prepare(dev, A, app)
    with (
        running_driver("reference", runtime_dir, state_dir, args=args),
        nn.device("reference", runtime_dir) as dev,
    ):
        assert prepare(dev, A, app)


def test_multistage_driver_rewrites_the_cache(
    runtime_dir: Path, state_dir: Path, app: Path, tmp_path: Path
) -> None:
    config = tmp_path / "npu.toml"
    config.write_text(
        '[[driver]]\nname = "reference"\nplugin = "reference"\n'
        'options = { compile_mode = "multistage", recompile_after = 2 }\n'
    )
    with (
        running_driver(
            "reference", runtime_dir, state_dir, config=config, args=["--no-enforce-admission"]
        ),
        nn.device("reference", runtime_dir) as dev,
    ):
        m = dev.prepare_model(A.onnx_bytes, cache_dir=app, token=APP_TOKEN)
        assert not m.loaded_from_cache and m.cache_written
        model_file = files(app, APP_TOKEN, dev)[0]
        written_at = model_file.stat().st_mtime_ns
        with DirectoryWatch(model_file.parent) as watch:
            for _ in range(4):  # the second execution starts the background recompile
                assert A.matches(m.execute({"x": A.x}))
            # The driver rewrites the entry in the background (stage 2) under its locks.
            assert watch.wait_until(lambda: model_file.stat().st_mtime_ns != written_at, 30)
        m.release()
        assert prepare(dev, A, app)


def test_several_clients_prepare_the_same_token_at_once(
    driver_env: tuple[Path, Path], app: Path
) -> None:
    import threading

    rt, _ = driver_env
    results: list[bool] = []
    errors: list[BaseException] = []

    def client() -> None:
        try:
            with nn.device("reference", rt) as dev:
                for _ in range(3):
                    results.append(prepare(dev, A, app))  # asserts A's outputs inside
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 12 and any(results)
    with nn.device("reference", rt) as dev:
        assert prepare(dev, A, app)


def test_jit_driver_compiles_and_caches_at_first_execution(
    runtime_dir: Path, state_dir: Path, app: Path, tmp_path: Path
) -> None:
    config = tmp_path / "npu.toml"
    config.write_text(
        '[[driver]]\nname = "reference"\nplugin = "reference"\noptions = { compile_mode = "jit" }\n'
    )
    with (
        running_driver(
            "reference", runtime_dir, state_dir, config=config, args=["--no-enforce-admission"]
        ),
        nn.device("reference", runtime_dir) as dev,
    ):
        m = dev.prepare_model(A.onnx_bytes, cache_dir=app, token=APP_TOKEN)
        assert not m.loaded_from_cache and not m.cache_written  # nothing compiled yet
        model_file = files(app, APP_TOKEN, dev)[0]
        assert model_file.stat().st_size == 0
        with DirectoryWatch(model_file.parent) as watch:
            assert A.matches(m.execute({"x": A.x}))  # compiles now, caches in the background
            assert watch.wait_until(lambda: model_file.stat().st_size > 0, 30)
        m.release()
        assert prepare(dev, A, app)


def test_a_home_relative_cache_dir_caches_and_an_unusable_one_is_said(
        driver_env: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The README's `cache_dir="~/.cache/myapp"` named a directory "~" under the cwd: never
    there, so every prepare compiled, said only in an info line. Now "~" is the home, and a
    directory that cannot hold the files is a warning, once."""
    import logging

    rt, _ = driver_env
    (tmp_path / ".cache" / "myapp").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    missing = tmp_path / "no-such-dir"
    with nn.device("reference", rt) as dev, caplog.at_level(logging.INFO, "npumanager.nn"):
        assert not prepare(dev, A, Path("~/.cache/myapp"))
        assert prepare(dev, A, Path("~/.cache/myapp"))
        assert not prepare(dev, A, missing)
        assert not prepare(dev, A, missing)
    said = [r for r in caplog.records if str(missing) in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO], said
    assert said[0].getMessage() == (f"reference: cache_dir {missing}: no such directory; "
                                    "compiling without caching")
