"""Plugin discovery and the load-time HAL check (pluggy-style)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from npumanager.drivers.base import (
    check_driver_class,
    instantiate,
    load_driver_class,
)
from npumanager.drivers.reference import ReferenceDriver
from npumanager.errors import DriverRefused
from npumanager.testing.fake_driver import (
    FakeDriver,
    IncompleteDriver,
    OldHalDriver,
    TooManyCacheFilesDriver,
)


def test_reference_driver_is_found_through_the_entry_point_group() -> None:
    assert load_driver_class("reference") is ReferenceDriver


def test_module_path_plugins_load() -> None:
    assert load_driver_class("npumanager.testing.fake_driver:FakeDriver") is FakeDriver


def test_unknown_plugin_names_the_installed_ones() -> None:
    with pytest.raises(DriverRefused, match="reference"):
        load_driver_class("no-such-driver")
    # A misspelt one is told the name it was near (npud's ready line, `npu status`).
    with pytest.raises(DriverRefused, match=r"'refrence' in entry-point group "
                                            r"'npumanager.drivers'; did you mean 'reference'\?"):
        load_driver_class("refrence")


def test_wrong_hal_version_is_refused_naming_driver_and_versions() -> None:
    with pytest.raises(DriverRefused, match=r"'old'.*HAL version 0.*speaks HAL version 1"):
        check_driver_class("old", OldHalDriver)


def test_missing_methods_are_named() -> None:
    with pytest.raises(DriverRefused, match=r"'incomplete'.*missing capabilities\(\).*compile\(\)"):
        check_driver_class("incomplete", IncompleteDriver)


def test_more_than_32_cache_files_is_refused() -> None:
    with pytest.raises(DriverRefused, match="33 model cache files"):
        instantiate("npumanager.testing.fake_driver:TooManyCacheFilesDriver", {})
    assert TooManyCacheFilesDriver  # the class exists for vendors to see the failure


def test_fake_driver_instantiates_with_options() -> None:
    driver, counts = instantiate("npumanager.testing.fake_driver:FakeDriver",
                                 {"cache_files": [2, 1]})
    assert counts == (2, 1)
    assert isinstance(driver, FakeDriver)


@pytest.mark.slow
def test_driver_host_refuses_a_bad_plugin_at_start(runtime_dir: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "npu.toml"
    cfg.write_text('[[driver]]\nname = "old"\n'
                   'plugin = "npumanager.testing.fake_driver:OldHalDriver"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "npumanager", "driver", "old", "--runtime-dir", str(runtime_dir),
         "--config", str(cfg), "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1
    assert "DriverRefused" in proc.stderr and "'npumanager.testing.fake_driver:OldHalDriver'" \
        in proc.stderr and "HAL version 0" in proc.stderr
    assert not (runtime_dir / "drivers" / "old.sock").exists()


def test_a_host_knows_its_device_number_and_gives_its_plugin_its_state_dir(
        tmp_path: Path) -> None:
    from npumanager.cli.driver import plugin_options
    from npumanager.config import Config
    from npumanager.drivers.messages import params_from
    from npumanager.hal.host_config import HostConfig

    cfg_path = tmp_path / "npu.toml"
    cfg_path.write_text('[[driver]]\nname = "a"\nplugin = "reference"\n'
                        '[[driver]]\nname = "b"\nplugin = "reference"\n'
                        'options = { intra_op_threads = 2 }\n')
    cfg = Config.load(cfg_path)
    a, b = HostConfig.from_config(cfg, "a"), HostConfig.from_config(cfg, "b")
    # WorkInfo.device_number is the device's index in nn.devices(): the entry's position.
    assert (a.device_number, b.device_number) == (0, 1)
    assert params_from(b).device_number == 1
    state = tmp_path / "state" / "drivers" / "b"
    assert plugin_options(b, state) == {"state_dir": str(state), "intra_op_threads": 2}
    b.options["state_dir"] = "/elsewhere"  # a configured one wins
    assert plugin_options(b, state)["state_dir"] == "/elsewhere"
