"""A driver host started by hand runs the entry npud would run for the same file
(service/protection.resolve_hand_started), and npud names what differs in a host it did not
start (service/host_entries.py); without processes. "on"/"off" (flag or file) are the same
for both; "auto" follows the npud serving the runtime dir where one answers, else is decided
in the host's process as npud's start would, and its line says npud decides for itself."""

from __future__ import annotations

import json
from pathlib import Path

from npumanager.config import Config
from npumanager.hal.host_config import HostConfig, entry_differences, entry_summary
from npumanager.service import host_entries
from npumanager.service.protection import Protection, resolve, resolve_hand_started, state_of
from tests.service.test_protection import ROOT, ROOT_NO_NICE, SET, load, picked

OFF = {"foreground_rt_priority": 0, "switch_interval_us": 0, "background_host": False}
NPUD = "the npud on /run/npu/npu.sock (pid 7)"
ALONE = ("; no npud serves this runtime dir to ask, and npud decides \"auto\" by its own "
         "privileges: where they differ, pass --protect-foreground as `npu status` shows "
         "npud's")


def host(cfg: Config) -> HostConfig:
    """What `npu driver reference` runs for ``cfg`` (cli/driver.py: its one device)."""
    [hc] = HostConfig.group(cfg, "reference")
    return hc


def test_on_and_off_give_the_entry_npud_gives_for_the_same_file(tmp_path: Path) -> None:
    for text in ("", '[manager]\nprotect_foreground = "on"\n',
                 '[manager]\nprotect_foreground = "off"\n'):
        cfg = load(tmp_path, text)
        for flag in ("on", "off", None):
            if flag is None and not text:
                continue  # ("auto": below)
            hand, p = resolve_hand_started(cfg, flag, None, priv=ROOT_NO_NICE)
            served, q = resolve(cfg, flag, True, priv=ROOT_NO_NICE)
            assert host(hand) == HostConfig.from_config(served, "reference"), (text, flag)
            assert p == q and p.line() == q.line(), (text, flag)
    hand, p = resolve_hand_started(load(tmp_path), "on", None, priv=ROOT_NO_NICE)
    assert picked(host(hand), SET) == SET
    assert p.line() == 'foreground protection: on (protect_foreground = "on")'
    hand, p = resolve_hand_started(load(tmp_path), "off", (True, NPUD))  # the flag wins
    assert picked(host(hand), OFF) == OFF and not p.on


def test_auto_follows_the_npud_that_serves_the_runtime_dir() -> None:
    cfg = Config.load(None)
    for on in (True, False):
        for priv in (ROOT, ROOT_NO_NICE):  # (its own privilege does not count)
            hand, p = resolve_hand_started(cfg, None, (on, NPUD), priv=priv)
            assert picked(host(hand), SET) == (SET if on else OFF)
            assert p == Protection("auto", on, f"as {NPUD} runs")
            assert p.line() == (f"foreground protection: {'on' if on else 'off'} "
                                f"(auto: as {NPUD} runs)")


def test_auto_without_an_npud_is_decided_here_and_says_npud_decides_for_itself() -> None:
    cfg = Config.load(None)
    hand, p = resolve_hand_started(cfg, None, None, priv=ROOT)
    assert picked(host(hand), SET) == SET
    assert p.line() == ("foreground protection: on (auto: this process can put threads at "
                        "SCHED_FIFO" + ALONE + ")")
    hand, p = resolve_hand_started(cfg, None, None, priv=ROOT_NO_NICE)
    assert picked(host(hand), OFF) == OFF and p.unable
    # The cause is this process's; the fix is the flag (npud's unit is not the host's).
    assert p.line() == ("foreground protection: off (auto: this process lacks CAP_SYS_NICE"
                        + ALONE + ")")


def test_state_of_reads_npuds_line() -> None:
    for p in (Protection("auto", True, "npud can put threads at SCHED_FIFO"),
              Protection("off", False), Protection("auto", False, "npud lacks x. Fix: y")):
        assert state_of(p.line()) is p.on
    assert state_of("") is None and state_of("foreground protection: maybe") is None


def summary_of(cfg: Config, lane: str = "") -> str:
    """What such a host says it runs (drivers/npud_link.py: hal.attach_manager's reply)."""
    return json.dumps(entry_summary(HostConfig.from_config(cfg, "reference", lane)))


def test_npud_names_the_keys_a_host_runs_otherwise() -> None:
    cfg = Config.load(None)
    on, _ = resolve(cfg, "on", True)
    assert host_entries.differences(on, "reference", "", summary_of(on)) == []
    diffs = host_entries.differences(on, "reference", "", summary_of(cfg))
    assert diffs == ["switch_interval_us = 0 (npud's: 500)",
                     "foreground_rt_priority = 0 (npud's: 1)",
                     "background_host = false (npud's: true)"]
    # The lane's own keys, for a lane an earlier npud left running with protection off.
    lane = host_entries.differences(on, "reference", "background", summary_of(cfg, "lane"))
    assert "background_step_nice = -1 (npud's: 19)" in lane
    # A host that does not say (an older version): not compared; garbage: said so.
    assert host_entries.differences(on, "reference", "", "") == []
    long = json.dumps({**json.loads(summary_of(on)), "name": "x" * 10_000})
    [said] = host_entries.differences(on, "reference", "", long)
    assert said == f"name = \"{'x' * 76}... (npud's: \"reference\")"
    for garbage in ("[1]", "{", "[" * 100_000):
        assert host_entries.differences(on, "reference", "", garbage) == \
            ["its entry (unreadable)"]


def test_the_fix_is_the_flag_only_where_only_protection_keys_differ() -> None:
    cfg = Config.load(None)
    on, p = resolve(cfg, "on", True)
    diffs = host_entries.differences(on, "reference", "", summary_of(cfg))
    assert host_entries.fix(diffs, "reference", "", p.line()) == (
        'These are keys foreground protection sets (on (protect_foreground = "on") in '
        "npud): to match, restart the host with `npu driver reference --config FILE "
        "--protect-foreground on`, or stop it: npud then starts its own.")
    other = Config.load(None, {"driver": [{"name": "reference", "plugin": "reference",
                                           "channels": 2}]})
    diffs = host_entries.differences(cfg, "reference", "", summary_of(other))
    assert diffs == ["channels = 2 (npud's: 3)"]
    assert host_entries.fix(diffs, "reference", "", p.line()).startswith(
        "To match, restart the host with npud's config file and no overrides")
    assert host_entries.fix(diffs, "reference", "background", "") == \
        "To match, stop it: npud then starts its own."
    assert host_entries.summary(diffs) == {"entry_differs": ["channels"]}


def test_a_hosts_summary_carries_no_table_and_nothing_npud_sets() -> None:
    cfg = Config.load(None, {"fleet": {"redis": "redis://:secret@h/0"},
                             "driver": [{"name": "reference", "plugin": "reference",
                                         "options": {"model_dir": "/srv/m"}}]})
    hc = HostConfig.from_config(cfg, "reference")
    hc.background_cgroup_dir = "/sys/fs/cgroup/x"
    text = json.dumps(entry_summary(hc))
    for absent in ("secret", "/srv/m", "/sys/fs/cgroup/x", "background_cgroup_dir",
                   "enforce_admission"):
        assert absent not in text, absent
    other = HostConfig.from_config(Config.load(None), "reference")
    assert [d.split(" = ")[0] for d in entry_differences(entry_summary(other),
                                                         entry_summary(hc))] == \
        ["options", "fleet"]
