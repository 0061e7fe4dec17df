"""A config value of the right type but out of its key's range is refused when the config
is loaded, with one line naming the key, its section or [[driver]] entry, the value and
what is allowed: ``channels in [[driver]] #1 ('reference') must be >= 1, not -1``. One
case per key of defaults.toml (the keys with no range of their own are listed, and a test
holds the two lists to defaults.toml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config, _defaults, file_problems
from npumanager.config_ranges import RANGES, range_problems
from npumanager.errors import InvalidArgument
from tests.cli.conftest import npu, npu_process

#: (section, key) -> (a value out of range, the end of its message).
BAD: dict[tuple[str, str], tuple[Any, str]] = {
    ("manager", "socket_mode"): (0o444, "must be a mode between 0o600 and 0o777 "
                                 "with the owner's read and write bits (0o600) set "
                                 "(npud and its own tools connect as the owner), not 0o444"),
    ("manager", "admin_group"): (-1, "must be a group name or a gid >= 0, not -1"),
    ("manager", "max_frame"): (100, "must be between 65536 and 4294967295, not 100"),
    ("manager", "max_connections_per_uid"): (0, "must be >= 1, not 0"),
    ("manager", "hello_timeout_s"): (0, "must be > 0, not 0"),
    ("manager", "max_requests_per_uid"): (0, "must be >= 1, not 0"),
    ("manager", "unload_deadline_s"): (-1.0, "must be > 0, not -1.0"),
    ("manager", "grant_end_ack_s"): (-1.0, "must be >= 0 (0 = do not wait), not -1.0"),
    ("manager", "adopt_grace_s"): (0.0, "must be > 0, not 0.0"),
    ("manager", "max_queue_wait_s"): (-5, "must be >= 0 (0 = no limit), not -5"),
    ("manager", "decision_log_size"): (0, "must be >= 1, not 0"),
    ("manager", "log_format"): ("xml", "must be one of 'text', 'json', not 'xml'"),
    ("manager", "log_level"): ("loud", "must be one of 'debug', 'info', 'warning', 'error', "
                               "not 'loud'"),
    ("manager", "driver_user"): ("-3", "must be a user name or a uid >= 0, not '-3'"),
    ("manager", "orphan_grace_s"): (-1.0, "must be >= 0, not -1.0"),
    **{("manager", k): (-1, "must be >= 0 (0 = no bound), not -1") for k in (
        "max_steps", "max_jobs_per_uid", "max_jobs_per_connection", "max_models_per_uid",
        "max_model_bytes_per_uid", "max_prepare_bytes_per_uid", "max_pools_per_uid",
        "max_pools_per_connection", "max_pool_bytes_per_uid")},
    ("manager", "app_rt_priority"): (11, "must be between 0 and 10, not 11"),
    ("manager", "app_rt_max_threads"): (0, "must be >= 1, not 0"),
    ("manager", "app_rt_max_cpu_ms"): (0.0, "must be > 0, not 0.0"),
    ("manager", "app_rt_window_s"): (0.0, "must be > 0, not 0.0"),
    ("manager", "app_rt_cooldown_s"): (-1.0, "must be >= 0, not -1.0"),
    ("manager", "app_rt_sample_s"): (0.0, "must be > 0, not 0.0"),
    ("policy", "name"): ("FAIR", "must be one of 'STATUS_QUO', 'TURN_TAKING', 'BUDGET', "
                         "'MEMORY', not 'FAIR'"),
    ("policy", "max_budget"): (0, "must be >= 1, not 0"),
    ("policy", "weights"): ({"2": 0}, "['2'] must be an integer >= 1, not 0"),
    ("policy", "memory_budget_bytes"): (-1, "must be >= 0 (0 = the drivers' memory), not -1"),
    ("policy", "size_bytes"): ({"3": 5}, "has a key '3' that is not a size class (use '0', "
                                         "'1', '2')"),
    ("policy", "default_importance"): (-100, "must be >= 0, not -100"),
    ("policy", "thermal_budget_scale"): ({"moderate": 1.5},
                                         "['moderate'] must be a number between 0 and 1, "
                                         "not 1.5"),
    ("policy", "thermal_keep_rank"): ({"severe": -2}, "['severe'] must be an integer >= -1, "
                                                      "not -2"),
    ("policy", "opportunistic_wait_from"): ("warm", "must be a thermal status (none, light, "
                                                    "moderate, severe, critical, emergency, "
                                                    "shutdown or 0-6), not 'warm'"),
    ("driver", "name"): ("a/b", "must be a file name (not empty, '.' or '..', no '/', no "
                                "surrounding spaces): it names DIR/drivers/NAME.sock, "
                                "not 'a/b'"),
    ("driver", "plugin"): ("", "must not be empty"),
    ("driver", "channels"): (-1, "must be >= 1, not -1"),
    ("driver", "restart_backoff_s"): (0, "must be > 0, not 0"),
    ("driver", "restart_backoff_max_s"): (0.1, "must be >= restart_backoff_s (0.2), not 0.1"),
    ("driver", "thermal_holdback_priority"): (-1, "must be >= 0, not -1"),
    ("driver", "inline_limit_bytes"): (-1, "must be >= 0, not -1"),
    ("driver", "grant_wait_s"): (-0.5, "must be >= 0, not -0.5"),
    ("driver", "inline_run_us"): (-1, "must be >= 0 (0 = always worker threads), not -1"),
    ("driver", "inline_idle_run_us"): (-1, "must be >= 0 (0 = never), not -1"),
    ("driver", "max_model_bytes"): (0, "must be >= 1, not 0"),
    ("driver", "foreground_priority"): (-1, "must be >= 0, not -1"),
    ("driver", "reserved_channels"): (-1, "must be >= 0, not -1"),
    ("driver", "background_nice"): (25, "must be between 0 and 19, not 25"),
    ("driver", "background_step_nice"): (
        20, "must be between -1 and 19 (-1 = as background_sched), not 20"),
    ("driver", "background_load_nice"): (
        -2, "must be between -1 and 19 (-1 = as background_sched), not -2"),
    ("driver", "malloc_mmap_threshold_kb"): (
        65536, "must be between 0 and 32768 (0 = glibc's own), not 65536"),
    ("driver", "switch_interval_us"): (-1, "must be >= 0 (0 = Python's 5000), not -1"),
    ("driver", "quiet_window_us"): (-5, "must be >= 0 (0 = off), not -5"),
    ("driver", "quiet_tail_us"): (-5, "must be >= 0 (0 = none), not -5"),
    ("driver", "burst_anticipate_us"): (-5, "must be >= 0 (0 = off), not -5"),
    ("driver", "background_follow_us"): (
        5001, "must be between 0 and 5000 (0 = off), not 5001"),
    ("driver", "foreground_slice_us"): (
        50, "must be 0 (the kernel's own) or between 100 and 100000, not 50"),
    ("driver", "background_slice_us"): (
        -1, "must be 0 (the kernel's own) or between 100 and 100000, not -1"),
    ("driver", "background_starve_ms"): (-1, "must be >= 0 (0 = no bound), not -1"),
    ("driver", "foreground_rt_priority"): (11, "must be between 0 and 10 (0 = off), not 11"),
    ("driver", "foreground_rt_max_run_us"): (50, "must be >= 100, not 50"),
    ("manager", "app_rt_importance"): (300, "must be between 100 and 200 (FOREGROUND to "
                                            "VISIBLE), not 300"),
    ("thermal", "poll_interval_s"): (0, "must be >= 0.001, not 0"),
    ("thermal", "thresholds_c"): ({"moderate": 50.0}, "must not decrease from light to "
                                  "shutdown, not moderate = 50 below light = 60"),
    ("thermal", "hysteresis_c"): (-1.0, "must be >= 0, not -1.0"),
    ("thermal", "min_dwell_s"): (-1.0, "must be >= 0 (0 = no dwell), not -1.0"),
    ("thermal", "forecast_s"): (-1.0, "must be >= 0, not -1.0"),
    ("thermal", "trend_window_s"): (0.0, "must be >= 0.001, not 0.0"),
    ("thermal", "headroom_span_c"): (0.0, "must be >= 0.001, not 0.0"),
    ("thermal", "stale_after_s"): (0.0, "must be > 0, not 0.0"),
    ("thermal", "valid_range_c"): ([200.0, -40.0], "must be [low, high] with low < high, "
                                                   "not [200.0, -40.0]"),
    ("thermal", "sources"): (["driver", "disk"], "may hold 'sysfs', 'hwmon', 'nvml', "
                                                 "'driver', not 'disk'"),
    ("thermal", "sysfs_root"): ("", "must not be empty"),
    ("thermal", "zone_types"): ([1], "must be a list of strings, not [1] (has 1)"),
    ("thermal", "hwmon_names"): ([True], "must be a list of strings, not [True] (has true)"),
    ("importance", "recheck_interval_s"): (0, "must be > 0, not 0"),
    ("importance", "identity"): ("user", "must be one of 'uid', 'unit', not 'user'"),
    ("importance", "proc_root"): (" ", "must not be empty"),
    ("importance", "combine"): ("most", "must be one of 'first', 'least_important', "
                                        "not 'most'"),
    ("importance", "precedence"): (["nice", "nice"], "must not name one twice, "
                                                     "not ['nice', 'nice']"),
    ("importance", "sched_policy"): ({"deadline": "cached"}, "has a key 'deadline' that is "
                                     "not a scheduling policy (other, batch, idle, fifo, "
                                     "rr)"),
    ("cache", "max_entries"): (0, "must be >= 1, not 0"),
    ("cache", "max_entries_per_uid"): (0, "must be >= 1, not 0"),
    ("fleet", "redis_url"): ("http://x", 'must be "" (off) or a redis://, rediss:// or '
                                         "unix:// URL, not 'http://x'"),
    ("fleet", "trusted_keys"): ([3], "must be a list of strings, not [3] (has 3)"),
    ("fleet", "connect_timeout_s"): (0, "must be > 0, not 0"),
    ("fleet", "timeout_s"): (-1.0, "must be > 0, not -1.0"),
    ("fleet", "max_entry_bytes"): (0, "must be >= 1, not 0"),
    ("fleet", "chunk_bytes"): (1 << 30, "must be between 1 and 536870912 (one Redis string), "
                                        "not 1073741824"),
    ("fleet", "ttl_s"): (-1.0, "must be >= 0 (0 = never), not -1.0"),
    ("metrics", "listen"): ("127.0.0.1:70000", 'must be "" (off) or HOST:PORT with a port '
                            "between 0 and 65535 (0: any free one), not '127.0.0.1:70000'"),
}
#: Keys with no range of their own: true/false, a word from config.CHOICES (the type
#: check's), or a table its owner parses (cli/check_config.py runs those owners).
FREE = {("manager", "enforce_admission"), ("manager", "drivers"),
        ("manager", "protect_foreground"),
        ("driver", "background_sched"), ("driver", "background_compile"),
        ("driver", "background_cpus"), ("driver", "background_cgroup"), ("driver", "options"),
        ("driver", "background_ends"), ("driver", "background_load"),
        ("driver", "compile_raise"),
        ("driver", "background_lower"), ("driver", "compile_malloc"), ("driver", "load_cpus"),
        ("driver", "hold_loads"), ("driver", "background_one_pass"),
        ("driver", "quiet_release"), ("driver", "background_host"),
        ("driver", "background"), ("driver", "burst_poll_turns"),
        ("driver", "burst_anticipate_pauses"),
        ("driver", "background_handback"), ("driver", "background_burst_here"),
        ("thermal", "trip_points"), ("thermal", "nvml_thresholds"), ("thermal", "devices"),
        ("importance", "from_process"), ("importance", "nice"), ("importance", "cgroup"),
        ("fleet", "signing_key"), ("fleet", "key_prefix")}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml(v)}' for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def _config(tmp_path: Path, section: str, key: str, value: Any) -> Path:
    cfg = tmp_path / "npud.toml"
    if section == "driver":
        entry = {"name": "reference", "plugin": "reference", key: value}
        body = "[[driver]]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in entry.items())
    else:
        body = f"[{section}]\n{key} = {_toml(value)}\n"
    cfg.write_text(body)
    return cfg


def test_every_key_has_a_range_or_is_listed_free() -> None:
    defaults = _defaults()
    keys = {(s, k) for s, v in defaults.items() if isinstance(v, dict) for k in v}
    keys |= {("driver", k) for k in defaults["driver"][0]}
    assert keys == set(RANGES), keys ^ set(RANGES)
    assert set(BAD) | FREE == keys and not set(BAD) & FREE, (set(BAD) | FREE) ^ keys
    assert list(range_problems(defaults)) == []


@pytest.mark.parametrize("section,key", sorted(BAD), ids=lambda x: x)
def test_a_value_out_of_range_is_named(tmp_path: Path, section: str, key: str) -> None:
    value, why = BAD[(section, key)]
    cfg = _config(tmp_path, section, key, value)
    if section != "driver":
        where = f"[{section}]"
    else:
        where = "[[driver]] #1" + (f" ({value!r})" if key == "name" else " ('reference')")
    with pytest.raises(InvalidArgument) as exc:
        Config.load(cfg)
    assert str(exc.value) == f"config file {cfg}: {key} in {where} {why}"


@pytest.mark.parametrize("body", [
    "[manager]\nsocket_mode = 0o600\nmax_frame = 65536\nmax_steps = 0\nadmin_group = 0\n",
    "[policy]\nname = \"turn-taking\"\nthermal_keep_rank = { \"5\" = -1, severe = 1000000 }\n",
    "[[driver]]\nname = \"r\"\nchannels = 1\nreserved_channels = 0\nbackground_nice = 19\n"
    "restart_backoff_s = 1.0\nrestart_backoff_max_s = 1.0\n",
    "[[driver]]\nname = \"r\"\nforeground_slice_us = 100\n",
    "[[driver]]\nname = \"r\"\nforeground_slice_us = 100000\n",
    "[[driver]]\nname = \"r\"\nforeground_slice_us = 0\n",
    "[[driver]]\nname = \"r\"\nforeground_rt_priority = 10\n",
    "[[driver]]\nname = \"r\"\nforeground_rt_priority = 0\n",
    "[thermal]\nthresholds_c = { light = 50.0, moderate = 50.0 }\nsources = []\n",
    "[metrics]\nlisten = \":0\"\n[fleet]\nredis_url = \"unix:///run/redis.sock\"\n",
])
def test_edges_of_the_ranges_load(tmp_path: Path, body: str) -> None:
    cfg = tmp_path / "npud.toml"
    cfg.write_text(body)
    Config.load(cfg)


def test_every_problem_is_found_not_only_the_first(tmp_path: Path) -> None:
    """file_problems (npu serve --check-config) lists them all, in file order by kind:
    unknown keys, then types, then ranges; a wrong type is not also out of range."""
    cfg = tmp_path / "npud.toml"
    cfg.write_text("[manager]\nmax_frme = 1\nhello_timeout_s = -1\nmax_steps = \"x\"\n"
                   "[[driver]]\nname = \"a\"\nchannels = 0\n[[driver]]\nname = \"a\"\n")
    check = file_problems(cfg)
    assert check.data is not None and check.sections == {"manager", "driver"}
    assert [p.removeprefix(f"config file {cfg}: ") for p in check.problems] == [
        "unknown key 'max_frme' in [manager]; did you mean 'max_frame'? (every key is "
        "listed in npumanager/defaults.toml)",
        "max_steps in [manager] must be an integer, not 'x' (a string)",
        "hello_timeout_s in [manager] must be > 0, not -1",
        "channels in [[driver]] #1 ('a') must be >= 1, not 0",
        "name in [[driver]] #2 ('a') is also the name of [[driver]] #1: each driver needs "
        "a name of its own (its socket)",
    ]


def test_npud_refuses_to_start_with_one_line(tmp_path: Path, runtime_dir: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, "driver", "channels", -1)
    rc, out, err = npu(capsys, "serve", "--runtime-dir", str(runtime_dir), "--config",
                       str(cfg))
    assert rc == 1 and "ready" not in out, (out, err)
    assert err == (f"npu serve: InvalidArgument: config file {cfg}: channels in [[driver]] "
                   "#1 ('reference') must be >= 1, not -1\n"), err
    # The console script in a process of its own, as systemd runs it: the same one line.
    cfg = _config(tmp_path, "manager", "max_queue_wait_s", -5)
    proc = npu_process("serve", "--runtime-dir", str(runtime_dir), "--config", str(cfg))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == (f"npu serve: InvalidArgument: config file {cfg}: max_queue_wait_s "
                           "in [manager] must be >= 0 (0 = no limit), not -5\n"), proc.stderr


def test_a_driver_named_like_another_ones_background_lane_is_refused(tmp_path: Path) -> None:
    """background_host's second process takes NAME.background (socket, state dir)."""
    cfg = tmp_path / "npud.toml"
    cfg.write_text("[[driver]]\nname = \"ref.background\"\n"
                   "[[driver]]\nname = \"ref\"\nbackground_host = true\n")
    check = file_problems(cfg)
    assert [p.removeprefix(f"config file {cfg}: ") for p in check.problems] == [
        "name in [[driver]] #1 ('ref.background') is the name of the background lane of "
        "[[driver]] #2 ('ref', background_host = true): its socket and state dir; rename one",
    ]
    cfg.write_text("[[driver]]\nname = \"ref.background\"\n[[driver]]\nname = \"ref\"\n")
    assert file_problems(cfg).problems == []  # (no lane: no clash)


def test_the_background_lane_table_takes_driver_keys_checked_as_such(tmp_path: Path) -> None:
    """[driver.background] (the background lane's own keys, background_host): each is a
    [[driver]] key, typed and ranged as one; the keys that make it the same device's
    second host cannot be set there."""
    cfg = tmp_path / "npud.toml"
    cfg.write_text("[[driver]]\nname = \"a\"\nbackground_host = true\n"
                   "[driver.background]\nchanels = 1\nplugin = \"x\"\n"
                   "background_sched = 3\nchannels = 0\n")
    check = file_problems(cfg)
    assert [p.removeprefix(f"config file {cfg}: ") for p in check.problems] == [
        "unknown key 'chanels' in [driver.background] of [[driver]] #1; did you mean "
        "'channels'?",
        "plugin in [driver.background] of [[driver]] #1: the background lane keeps its "
        "entry's plugin (it is the same device's second host)",
        "background_sched in [driver.background] of [[driver]] #1 must be a string, not 3 "
        "(an integer)",
        "channels in [driver.background] of [[driver]] #1 ('a') must be >= 1, not 0",
    ]
    cfg.write_text("[[driver]]\nname = \"a\"\nbackground_host = true\nchannels = 2\n"
                   "[driver.background]\nchannels = 1\nbackground_sched = \"normal\"\n")
    loaded = Config.load(cfg)
    from npumanager.hal.host_config import HostConfig

    main, lane = (HostConfig.from_config(loaded, "a", lane) for lane in ("", "background"))
    assert (main.channels, main.background_sched, main.lane) == (2, "idle", "")
    assert (lane.channels, lane.background_sched, lane.lane) == (1, "normal", "background")
    assert lane.background_host and lane.lane_name == "a.background"
