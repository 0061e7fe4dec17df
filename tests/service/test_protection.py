"""``[manager] protect_foreground`` (service/protection.py): what each mode makes of a
config, without processes. "on" makes the recommended set the default of the keys it names;
a key the file sets always wins; other plugins and multi-device entries are left alone;
"auto" is all or nothing on whether npud can serve the FIFO keys; the flag beats the file;
a wrong value is refused naming the key and the words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config
from npumanager.errors import InvalidArgument
from npumanager.hal.host_config import HostConfig
from npumanager.service.protection import Protection, effective, expand, mode_of, resolve
from npumanager.service.rt_privilege import DROP_IN, Privilege

ROOT = Privilege(cap_sys_nice=True, euid=0, rtprio=0)
ROOT_NO_NICE = Privilege(cap_sys_nice=False, euid=0, rtprio=0)
FILTERED = Privilege(cap_sys_nice=True, euid=0, rtprio=0, refused="EPERM")
SET = {"foreground_rt_priority": 1, "switch_interval_us": 500, "background_host": True}
LANE = {"background_burst_here": "normal", "background_step_nice": 19,
        "background_load_nice": 19}


def load(tmp_path: Path, text: str = "") -> Config:
    path = tmp_path / "npud.toml"
    path.write_text(text)
    return Config.load(path)


def main(cfg: Config) -> HostConfig:
    return HostConfig.from_config(cfg, "reference")


def lane(cfg: Config) -> HostConfig:
    return HostConfig.from_config(cfg, "reference", lane="background")


def picked(hc: HostConfig, keys: dict[str, Any]) -> dict[str, Any]:
    return {k: getattr(hc, k) for k in keys}


def test_on_gives_the_recommended_set_to_a_file_that_sets_none_of_it(tmp_path: Path) -> None:
    for cfg in (Config.load(None), load(tmp_path, "[policy]\nmax_budget = 8\n")):
        out, p = effective(cfg, "on", fifo_ok=False)  # ("on" does not ask)
        assert p == Protection("on", True)
        assert out.section("manager")["app_rt_priority"] == 2
        assert picked(main(out), SET) == SET
        # The lane: the entry's keys, its own over them.
        assert picked(lane(out), {**SET, **LANE}) == {**SET, **LANE}
        assert main(out).background_burst_here == "off"  # (the main host's untouched)
        assert main(out).background_step_nice == -1
        assert main(out).background_load_nice == -1
        # The input config is not changed.
        assert cfg.section("manager")["app_rt_priority"] == 0
        assert main(cfg).background_host is False


def test_off_and_auto_without_fifo_imply_nothing(tmp_path: Path) -> None:
    cfg = load(tmp_path, "[[driver]]\nname = \"reference\"\nchannels = 2\n")
    for mode, ok in (("off", True), ("off", False), ("auto", False)):
        out, p = effective(cfg, mode, ok)
        assert out is cfg and not p.on, (mode, ok)
    out, p = effective(cfg, "auto", True)
    assert p.on and main(out).background_host and main(out).channels == 2


def test_explicit_keys_win_including_the_defaults_values(tmp_path: Path) -> None:
    cfg = load(tmp_path, """
[manager]
app_rt_priority = 0

[[driver]]
name = "reference"
background_host = false
switch_interval_us = 0
""")
    out, _ = expand(cfg)
    assert out.section("manager")["app_rt_priority"] == 0  # that part off
    hc = main(out)
    assert (hc.background_host, hc.switch_interval_us, hc.foreground_rt_priority) == \
        (False, 0, 1)
    # No lane: its keys are not written either.
    assert out.drivers()[0]["background"] == {}
    # The lane's own keys set in the file win too; the others come from the set.
    cfg = load(tmp_path, """
[[driver]]
name = "reference"
foreground_rt_priority = 3
[driver.background]
background_step_nice = 10
background_load_nice = -1
channels = 1
""")
    out, _ = expand(cfg)
    assert picked(lane(out), {"foreground_rt_priority": 0, "background_step_nice": 0,
                              "background_load_nice": 0, "background_burst_here": "",
                              "channels": 0}) == {
        "foreground_rt_priority": 3, "background_step_nice": 10,
        "background_load_nice": -1,  # (its default's value, set: the load stays idle)
        "background_burst_here": "normal", "channels": 1}
    assert main(out).foreground_rt_priority == 3


def test_a_config_built_from_data_counts_what_differs_from_the_defaults() -> None:
    """Without the file's own tables (Config(data)), a value other than the default is
    what the user set."""
    data = Config.load(overrides={"manager": {"app_rt_priority": 5}}).data
    out, _ = expand(Config(data))
    assert out.section("manager")["app_rt_priority"] == 5
    assert main(out).background_host  # (false is the default: counted as not set)


def test_other_plugins_and_multi_device_entries_are_left_as_they_are(tmp_path: Path) -> None:
    cfg = load(tmp_path, """
[[driver]]
name = "ov"
plugin = "openvino"

[[driver]]
name = "multi"
plugin = "reference"
[driver.options]
devices = ["a", "b"]

[[driver]]
name = "reference"
""")
    out, p = effective(cfg, "on", True)
    entries = {d["name"]: d for d in out.drivers()}
    template = Config().drivers()[0]
    for name in ("ov", "multi"):
        assert {k: entries[name][k] for k in SET} == {k: template[k] for k in SET}, name
        assert entries[name]["background"] == {}
    assert {k: entries["reference"][k] for k in SET} == SET
    assert p.skipped == ("[[driver]] 'multi' serves 2 devices (options.devices): a "
                         "background lane is for an entry serving one device, so foreground "
                         "protection leaves it as it is",)
    # The expanded config still makes hosts (a lane on a multi-device entry is refused).
    assert [h.name for h in HostConfig.group(out, "multi")] == ["multi:a", "multi:b"]
    assert out.section("manager")["app_rt_priority"] == 2  # (the manager's key: for apps)


def test_auto_is_all_or_nothing_on_fifo() -> None:
    cfg = Config.load(None)
    out, p = resolve(cfg, None, use_drivers=True, priv=ROOT)
    assert p.on and p.why == "npud can put threads at SCHED_FIFO" and main(out).background_host
    assert p.line() == ("foreground protection: on (auto: npud can put threads at "
                        "SCHED_FIFO)")
    for priv, cause in ((ROOT_NO_NICE, "npud lacks CAP_SYS_NICE"),
                        (FILTERED, "the kernel refuses SCHED_FIFO to npud although it has "
                                   "CAP_SYS_NICE (EPERM: a seccomp filter such as systemd's "
                                   "RestrictRealtime=yes")):
        out, p = resolve(cfg, None, use_drivers=True, priv=priv)
        assert out is cfg and not p.on and p.unable, priv
        assert p.why.startswith(cause), p.why
        assert DROP_IN in p.why and 'protect_foreground = "on"' in p.why
        assert p.line().startswith("foreground protection: off (auto: " + cause)
    # A pure manager: off, without reading any privilege.
    out, p = resolve(cfg, None, use_drivers=False, priv=None)
    assert out is cfg and (p.on, p.why, p.unable) == (False, "npud runs no drivers", False)
    # Not root with an RLIMIT_RTPRIO: the hosts could, an app's thread not (another uid's).
    _, p = resolve(cfg, None, use_drivers=True, priv=Privilege(False, 1000, 99))
    assert not p.on


def test_the_flag_beats_the_file_and_on_ignores_privilege(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[manager]\nprotect_foreground = "off"\n')
    assert mode_of(cfg) == "off" and mode_of(cfg, "on") == "on"
    assert mode_of(Config.load(None)) == "auto"
    _, p = resolve(cfg, None, use_drivers=True, priv=ROOT)
    assert (p.mode, p.on) == ("off", False)
    assert p.line() == 'foreground protection: off (protect_foreground = "off")'
    out, p = resolve(cfg, "on", use_drivers=True, priv=ROOT_NO_NICE)
    assert (p.mode, p.on) == ("on", True) and main(out).background_host
    _, p = resolve(load(tmp_path, '[manager]\nprotect_foreground = "on"\n'), "auto",
                   use_drivers=True, priv=ROOT_NO_NICE)
    assert (p.mode, p.on) == ("auto", False)


@pytest.mark.parametrize("value, want", [
    ('"yes"', "protect_foreground in [manager] must be one of 'auto', 'on', 'off', not 'yes'"),
    ("true", "protect_foreground in [manager] must be a string, not true (true or false)"),
])
def test_a_wrong_value_is_refused_naming_the_key_and_the_words(
        tmp_path: Path, value: str, want: str) -> None:
    path = tmp_path / "npud.toml"
    path.write_text(f"[manager]\nprotect_foreground = {value}\n")
    with pytest.raises(InvalidArgument) as err:
        Config.load(path)
    assert str(err.value) == f"config file {path}: {want}"
    with pytest.raises(ValueError, match="protect_foreground must be one of"):
        effective(Config.load(None), "maybe", True)


def test_check_config_resolves_with_the_files_own_keys(tmp_path: Path) -> None:
    """`npu serve --check-config` checks the config npud would run: a key the file sets to
    its default's value (app_rt_priority = 0) still wins over "on"."""
    from npumanager.cli import check_config as cc

    path = tmp_path / "npud.toml"
    path.write_text("[manager]\napp_rt_priority = 0\n")
    cfg, problems = cc.check(str(path), tmp_path / "rt")
    assert cfg is not None and problems == []
    assert cfg.user == {"manager": {"app_rt_priority": 0}}
    out, _ = resolve(cfg, "on", use_drivers=True, priv=ROOT_NO_NICE)
    assert out.section("manager")["app_rt_priority"] == 0
    assert "protection: on" in "\n".join(cc.summary(cfg, tmp_path / "rt", False, "on"))
