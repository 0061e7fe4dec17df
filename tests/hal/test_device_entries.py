"""[[driver]] entries expanded into devices (API.md "Devices and budgets")."""

from __future__ import annotations

import pytest

from npumanager.config import Config
from npumanager.errors import InvalidArgument
from npumanager.hal.host_config import HostConfig, device_entries


def _cfg(*drivers: dict[str, object]) -> Config:
    return Config.load(None, {"driver": list(drivers)})


def test_an_entry_listing_several_devices_is_one_host_serving_each() -> None:
    cfg = _cfg({"name": "ref", "plugin": "reference"},
               {"name": "ov", "plugin": "openvino", "options": {"devices": ["CPU", "GPU"]}},
               {"name": "one", "plugin": "openvino", "options": {"devices": ["NPU"]}})
    entries = device_entries(cfg)
    assert [(e["name"], e.get("host", ""), e["options"].get("devices"))
            for e in entries] == [("ref", "", None), ("ov:CPU", "ov", ["CPU"]),
                                  ("ov:GPU", "ov", ["GPU"]), ("one", "", ["NPU"])]
    group = HostConfig.group(cfg, "ov")
    assert [(h.name, h.host_name, h.device_number, h.plugin) for h in group] == [
        ("ov:CPU", "ov", 1, "openvino"), ("ov:GPU", "ov", 2, "openvino")]
    assert [h.name for h in HostConfig.group(cfg, "ov:GPU")] == ["ov:GPU"]
    assert HostConfig.from_config(cfg, "one").device_number == 3
    assert [h.host_name for h in HostConfig.group(cfg, "ref")] == ["ref"]


@pytest.mark.parametrize("devices", [["CPU", "CPU"], ["CPU", ""], ["CPU", "a/b"]])
def test_bad_device_lists_are_refused(devices: list[str]) -> None:
    with pytest.raises(InvalidArgument, match="distinct device names"):
        device_entries(_cfg({"name": "ov", "plugin": "openvino",
                             "options": {"devices": devices}}))


def test_background_host_is_for_an_entry_serving_one_device() -> None:
    with pytest.raises(InvalidArgument, match="background_host is for an entry serving one"):
        device_entries(_cfg({"name": "ov", "plugin": "openvino", "background_host": True,
                             "options": {"devices": ["CPU", "GPU"]}}))
    cfg = _cfg({"name": "ref", "plugin": "reference", "background_host": True})
    assert len(device_entries(cfg)) == 1  # one device, as without it
    hc = HostConfig.from_config(cfg, "ref")
    assert (hc.background_host, hc.lane, hc.lane_name) == (True, "", "ref")
    hc.lane = "background"  # (npud sets it for the second process)
    assert hc.lane_name == "ref.background"
