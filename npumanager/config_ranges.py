"""Range checks of a loaded config: every key of defaults.toml has its allowed values here.

config.py checks that a value has its key's type; this module checks that it makes sense
(``channels = -1``, thresholds out of order, a port above 65535), so npud refuses to
start with one line naming the key, its section or [[driver]] entry, the value and what is
allowed, instead of a driver host that fails on it and is restarted without end, or a
bound that silently means something else. A value of the wrong type is skipped here: its
type error is reported instead. Tables whose entries their owners parse (importance rules,
``[thermal] devices`` and ``trip_points``, ``[[app]]``) are checked by those owners
(``npu serve --check-config`` runs them too: cli/check_config.py owner_problems).

Each check returns what is wrong as the end of a sentence ("must be >= 1, not -1"), or
None. :data:`RANGES` has one entry per (section, key); a test holds it to defaults.toml.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from npumanager.constants import ModelSize, Policy, ThermalStatus

#: What is wrong with a value (given its section or [[driver]] entry), or None.
Check = Callable[[Any, Mapping[str, Any]], str | None]

_MAX_U32 = (1 << 32) - 1
#: One Redis string holds at most 512 MiB (fleet entries are stored in chunks).
_REDIS_MAX_STRING = 512 << 20


def show(value: Any) -> str:
    """A value as the config file would write it."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(n: float) -> str:
    return str(int(n)) if float(n).is_integer() and abs(n) < 1e15 else str(n)


def at_least(low: float, note: str = "") -> Check:
    def check(value: Any, _where: Mapping[str, Any]) -> str | None:
        if _number(value) and value < low:
            return f"must be >= {_fmt(low)}{note}, not {show(value)}"
        return None
    return check


def above(low: float, note: str = "") -> Check:
    def check(value: Any, _where: Mapping[str, Any]) -> str | None:
        if _number(value) and not value > low:
            return f"must be > {_fmt(low)}{note}, not {show(value)}"
        return None
    return check


def zero_or_between(low: float, high: float, zero: str) -> Check:
    """0 (meaning ``zero``) or a number between ``low`` and ``high``."""
    def check(value: Any, _where: Mapping[str, Any]) -> str | None:
        if _number(value) and value != 0 and not low <= value <= high:
            return (f"must be 0 ({zero}) or between {_fmt(low)} and {_fmt(high)}, "
                    f"not {show(value)}")
        return None
    return check


def between(low: float, high: float, note: str = "") -> Check:
    def check(value: Any, _where: Mapping[str, Any]) -> str | None:
        if _number(value) and not low <= value <= high:
            return f"must be between {_fmt(low)} and {_fmt(high)}{note}, not {show(value)}"
        return None
    return check


def words(*allowed: str, fold: bool = True) -> Check:
    """A string among ``allowed`` (any case with ``fold``; ``-`` for ``_`` too)."""
    def check(value: Any, _where: Mapping[str, Any]) -> str | None:
        if not isinstance(value, str):
            return None
        got = value.strip().lower().replace("-", "_") if fold else value
        if got not in [w.lower() if fold else w for w in allowed]:
            return f"must be one of {', '.join(map(repr, allowed))}, not {value!r}"
        return None
    return check


def _nonempty(value: Any, _where: Mapping[str, Any]) -> str | None:
    if isinstance(value, str) and not value.strip():
        return "must not be empty"
    return None


def _socket_mode(value: Any, _where: Mapping[str, Any]) -> str | None:
    if not _number(value):
        return None
    if not 0 <= value <= 0o777 or value & 0o600 != 0o600:
        shown = oct(value) if value >= 0 else str(value)
        return ("must be a mode between 0o600 and 0o777 with the owner's read and write "
                f"bits (0o600) set (npud and its own tools connect as the owner), not {shown}")
    return None


def _group(value: Any, _where: Mapping[str, Any]) -> str | None:
    if _number(value) and value < 0:
        return f"must be a group name or a gid >= 0, not {show(value)}"
    return None


def _user(value: Any, _where: Mapping[str, Any]) -> str | None:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and int(value) < 0:
        return f"must be a user name or a uid >= 0, not {value!r}"
    return None


def _driver_name(value: Any, entry: Mapping[str, Any]) -> str | None:
    """It names a socket, DIR/drivers/NAME.sock, and a state dir."""
    if not isinstance(value, str):
        return None
    if not value or value in (".", "..") or "/" in value or "\0" in value \
            or value != value.strip():
        return ("must be a file name (not empty, '.' or '..', no '/', no surrounding "
                f"spaces): it names DIR/drivers/NAME.sock, not {value!r}")
    return None


def _backoff_max(value: Any, entry: Mapping[str, Any]) -> str | None:
    first = entry.get("restart_backoff_s")
    if _number(value) and isinstance(first, int | float) and _number(first) and value < first:
        return f"must be >= restart_backoff_s ({_fmt(first)}), not {show(value)}"
    return above(0)(value, entry)


def _size_table(low: int) -> Check:
    """``{ "0" = N, "1" = N, "2" = N }``: keys are size classes, values integers >= low."""
    def check(value: Any, _where: Mapping[str, Any]) -> str | None:
        if not isinstance(value, dict):
            return None
        sizes = [str(int(s)) for s in ModelSize]
        for k, v in value.items():
            if k not in sizes:
                return (f"has a key {k!r} that is not a size class (use "
                        f"{', '.join(map(repr, sizes))})")
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                return f"[{k!r}] must be an integer >= {low}, not {show(v)}"
        return None
    return check


def _status_key(key: str) -> bool:
    k = key.strip()
    return k.upper() in ThermalStatus.__members__ or (k.isdigit() and int(k) <= 6)


def _status_table(value_check: Callable[[Any], bool], allowed: str) -> Check:
    def check(value: Any, _where: Mapping[str, Any]) -> str | None:
        if not isinstance(value, dict):
            return None
        for k, v in value.items():
            if not _status_key(str(k)):
                names = ", ".join(s.name.lower() for s in ThermalStatus)
                return f"has a key {k!r} that is not a thermal status ({names} or 0-6)"
            if not value_check(v):
                return f"[{k!r}] must be {allowed}, not {show(v)}"
        return None
    return check


def _status_word(value: Any, where: Mapping[str, Any]) -> str | None:
    if isinstance(value, str) and not _status_key(value):
        names = ", ".join(s.name.lower() for s in ThermalStatus)
        return f"must be a thermal status ({names} or 0-6), not {value!r}"
    return None


def _thresholds(value: Any, _where: Mapping[str, Any]) -> str | None:
    """Every status LIGHT..SHUTDOWN, numbers, never decreasing up the ladder."""
    if not isinstance(value, dict):
        return None
    ladder = [s for s in ThermalStatus if s != ThermalStatus.NONE]
    given: dict[ThermalStatus, float] = {}
    for k, v in value.items():
        key = str(k).strip().upper()
        if key not in ThermalStatus.__members__ or key == "NONE":
            return (f"has a key {k!r} that is not a status with a threshold "
                    f"({', '.join(s.name.lower() for s in ladder)})")
        if not _number(v):
            return f"[{k!r}] must be a number, not {show(v)}"
        given[ThermalStatus[key]] = float(v)
    missing = [s.name.lower() for s in ladder if s not in given]
    if missing:
        return f"is missing {', '.join(missing)}"
    for low, high in itertools.pairwise(ladder):
        if given[high] < given[low]:
            return (f"must not decrease from light to shutdown, not {high.name.lower()} = "
                    f"{_fmt(given[high])} below {low.name.lower()} = {_fmt(given[low])}")
    return None


def _range_pair(value: Any, _where: Mapping[str, Any]) -> str | None:
    if not isinstance(value, list):
        return None
    if len(value) != 2 or not all(_number(v) for v in value) or not value[0] < value[1]:
        return f"must be [low, high] with low < high, not {value!r}"
    return None


def _list_of(allowed: tuple[str, ...] | None, *, distinct: bool = False) -> Check:
    def check(value: Any, _where: Mapping[str, Any]) -> str | None:
        if not isinstance(value, list):
            return None
        for v in value:
            if not isinstance(v, str):
                return f"must be a list of strings, not {value!r} (has {show(v)})"
            if allowed is not None and v not in allowed:
                return f"may hold {', '.join(map(repr, allowed))}, not {v!r}"
        if distinct and len(set(value)) != len(value):
            return f"must not name one twice, not {value!r}"
        return None
    return check


def _sched_policies(value: Any, _where: Mapping[str, Any]) -> str | None:
    if not isinstance(value, dict):
        return None
    known = ("other", "batch", "idle", "fifo", "rr")
    for k in value:
        if k not in known:
            return f"has a key {k!r} that is not a scheduling policy ({', '.join(known)})"
    return None


def _redis_url(value: Any, _where: Mapping[str, Any]) -> str | None:
    if isinstance(value, str) and value and not value.startswith(
            ("redis://", "rediss://", "unix://")):
        return f"must be \"\" (off) or a redis://, rediss:// or unix:// URL, not {value!r}"
    return None


def _listen(value: Any, _where: Mapping[str, Any]) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    _host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        return ("must be \"\" (off) or HOST:PORT with a port between 0 and 65535 "
                f"(0: any free one), not {value!r}")
    return None


_ANY: Check = lambda value, where: None  # noqa: E731 (a free-form key: checked by its owner)
_NO_BOUND = " (0 = no bound)"

#: (section, key) -> its check; every key of defaults.toml ("driver": each [[driver]]).
RANGES: dict[tuple[str, str], Check] = {
    ("manager", "socket_mode"): _socket_mode,
    ("manager", "admin_group"): _group,
    ("manager", "max_frame"): between(65536, _MAX_U32),
    ("manager", "max_connections_per_uid"): at_least(1),
    ("manager", "hello_timeout_s"): above(0),
    ("manager", "max_requests_per_uid"): at_least(1),
    ("manager", "unload_deadline_s"): above(0),
    ("manager", "grant_end_ack_s"): at_least(0, " (0 = do not wait)"),
    ("manager", "adopt_grace_s"): above(0),
    ("manager", "max_queue_wait_s"): at_least(0, " (0 = no limit)"),
    ("manager", "decision_log_size"): at_least(1),
    ("manager", "enforce_admission"): _ANY,
    ("manager", "log_format"): words("text", "json"),
    ("manager", "log_level"): words("debug", "info", "warning", "error"),
    ("manager", "driver_user"): _user,
    ("manager", "orphan_grace_s"): at_least(0),
    ("manager", "max_steps"): at_least(0, _NO_BOUND),
    ("manager", "max_jobs_per_uid"): at_least(0, _NO_BOUND),
    ("manager", "max_jobs_per_connection"): at_least(0, _NO_BOUND),
    ("manager", "max_models_per_uid"): at_least(0, _NO_BOUND),
    ("manager", "max_model_bytes_per_uid"): at_least(0, _NO_BOUND),
    ("manager", "max_prepare_bytes_per_uid"): at_least(0, _NO_BOUND),
    ("manager", "max_pools_per_uid"): at_least(0, _NO_BOUND),
    ("manager", "max_pools_per_connection"): at_least(0, _NO_BOUND),
    ("manager", "max_pool_bytes_per_uid"): at_least(0, _NO_BOUND),
    ("manager", "drivers"): _ANY,
    ("manager", "protect_foreground"): _ANY,  # config.CHOICES
    ("manager", "app_rt_priority"): between(0, 10),
    ("manager", "app_rt_max_threads"): at_least(1),
    ("manager", "app_rt_max_cpu_ms"): above(0),
    ("manager", "app_rt_window_s"): above(0),
    ("manager", "app_rt_cooldown_s"): at_least(0),
    ("manager", "app_rt_sample_s"): above(0),
    ("manager", "app_rt_importance"): between(100, 200, " (FOREGROUND to VISIBLE)"),
    ("policy", "name"): words(*(p.name for p in Policy)),
    ("policy", "max_budget"): at_least(1),
    ("policy", "weights"): _size_table(1),
    ("policy", "memory_budget_bytes"): at_least(0, " (0 = the drivers' memory)"),
    ("policy", "size_bytes"): _size_table(1),
    ("policy", "default_importance"): at_least(0),
    ("policy", "thermal_budget_scale"): _status_table(
        lambda v: _number(v) and 0 <= v <= 1, "a number between 0 and 1"),
    ("policy", "thermal_keep_rank"): _status_table(
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= -1,
        "an integer >= -1"),
    ("policy", "opportunistic_wait_from"): _status_word,
    ("driver", "name"): _driver_name,
    ("driver", "plugin"): _nonempty,
    ("driver", "channels"): at_least(1),
    ("driver", "restart_backoff_s"): above(0),
    ("driver", "restart_backoff_max_s"): _backoff_max,
    ("driver", "thermal_holdback_priority"): at_least(0),
    ("driver", "inline_limit_bytes"): at_least(0),
    ("driver", "grant_wait_s"): at_least(0),
    ("driver", "inline_run_us"): at_least(0, " (0 = always worker threads)"),
    ("driver", "inline_idle_run_us"): at_least(0, " (0 = never)"),
    ("driver", "max_model_bytes"): at_least(1),
    ("driver", "foreground_priority"): at_least(0),
    ("driver", "reserved_channels"): at_least(0),
    ("driver", "background_sched"): _ANY,  # config.CHOICES
    ("driver", "background_nice"): between(0, 19),
    ("driver", "background_step_nice"): between(-1, 19, " (-1 = as background_sched)"),
    ("driver", "background_load_nice"): between(-1, 19, " (-1 = as background_sched)"),
    ("driver", "background_compile"): _ANY,  # config.CHOICES
    ("driver", "background_ends"): _ANY,  # config.CHOICES
    ("driver", "background_load"): _ANY,  # config.CHOICES
    ("driver", "compile_raise"): _ANY,  # config.CHOICES
    ("driver", "compile_malloc"): _ANY,  # config.CHOICES
    ("driver", "load_cpus"): _ANY,  # config.CHOICES
    ("driver", "background_lower"): _ANY,  # config.CHOICES
    ("driver", "malloc_mmap_threshold_kb"): between(0, 32768, " (0 = glibc's own)"),
    ("driver", "switch_interval_us"): at_least(0, " (0 = Python's 5000)"),
    ("driver", "quiet_window_us"): at_least(0, " (0 = off)"),
    ("driver", "quiet_tail_us"): at_least(0, " (0 = none)"),
    ("driver", "hold_loads"): _ANY,  # a boolean (its type is checked at load)
    ("driver", "background_one_pass"): _ANY,  # a boolean (its type is checked at load)
    ("driver", "quiet_release"): _ANY,  # a boolean (its type is checked at load)
    ("driver", "background_host"): _ANY,  # a boolean (its type is checked at load)
    ("driver", "background"): _ANY,  # a table of [[driver]] keys, each checked as such
    ("driver", "burst_anticipate_us"): at_least(0, " (0 = off)"),
    ("driver", "background_follow_us"): between(0, 5000, " (0 = off)"),
    ("driver", "foreground_slice_us"): zero_or_between(100, 100_000, "the kernel's own"),
    ("driver", "background_slice_us"): zero_or_between(100, 100_000, "the kernel's own"),
    ("driver", "foreground_rt_priority"): between(0, 10, " (0 = off)"),
    ("driver", "foreground_rt_max_run_us"): at_least(100),
    ("driver", "background_cpus"): _ANY,  # config.CHOICES
    ("driver", "background_cgroup"): _ANY,  # config.CHOICES
    ("driver", "background_handback"): _ANY,  # a boolean (its type is checked at load)
    ("driver", "burst_poll_turns"): _ANY,  # a boolean (its type is checked at load)
    ("driver", "burst_anticipate_pauses"): _ANY,  # a boolean
    ("driver", "background_burst_here"): _ANY,  # config.CHOICES
    ("driver", "background_starve_ms"): at_least(0, " (0 = no bound)"),
    ("driver", "options"): _ANY,  # the plugin's
    ("thermal", "poll_interval_s"): at_least(0.001),
    ("thermal", "thresholds_c"): _thresholds,
    ("thermal", "hysteresis_c"): at_least(0),
    ("thermal", "min_dwell_s"): at_least(0, " (0 = no dwell)"),
    ("thermal", "forecast_s"): at_least(0),
    ("thermal", "trend_window_s"): at_least(0.001),
    ("thermal", "headroom_span_c"): at_least(0.001),
    ("thermal", "stale_after_s"): above(0),
    ("thermal", "valid_range_c"): _range_pair,
    ("thermal", "sources"): _list_of(("sysfs", "hwmon", "nvml", "driver"), distinct=True),
    ("thermal", "sysfs_root"): _nonempty,
    ("thermal", "zone_types"): _list_of(None),
    ("thermal", "trip_points"): _ANY,  # thermal.sources.parse_trip_map
    ("thermal", "hwmon_names"): _list_of(None),
    ("thermal", "nvml_thresholds"): _ANY,
    ("thermal", "devices"): _ANY,  # thermal.devices.parse_devices
    ("importance", "from_process"): _ANY,
    ("importance", "recheck_interval_s"): above(0),
    ("importance", "identity"): words("uid", "unit", fold=False),
    ("importance", "proc_root"): _nonempty,
    ("importance", "combine"): words("first", "least_important", fold=False),
    ("importance", "precedence"): _list_of(("sched", "nice", "cgroup"), distinct=True),
    ("importance", "sched_policy"): _sched_policies,
    ("importance", "nice"): _ANY,  # service.importance
    ("importance", "cgroup"): _ANY,  # service.importance
    ("cache", "max_entries"): at_least(1),
    ("cache", "max_entries_per_uid"): at_least(1),
    ("fleet", "redis_url"): _redis_url,
    ("fleet", "trusted_keys"): _list_of(None),
    ("fleet", "signing_key"): _ANY,
    ("fleet", "key_prefix"): _ANY,
    ("fleet", "connect_timeout_s"): above(0),
    ("fleet", "timeout_s"): above(0),
    ("fleet", "max_entry_bytes"): at_least(1),
    ("fleet", "chunk_bytes"): between(1, _REDIS_MAX_STRING, " (one Redis string)"),
    ("fleet", "ttl_s"): at_least(0, " (0 = never)"),
    ("metrics", "listen"): _listen,
}


def range_problems(data: Mapping[str, Any], *, only: Mapping[str, Any] | None = None
                   ) -> Iterator[tuple[str, str]]:
    """What is out of range in a merged config (``data``), as (section, one sentence), e.g.
    ``channels in [[driver]] #1 ('reference') must be >= 1, not -1``. With ``only`` (the
    user's file as parsed), sections the user did not write are skipped: the defaults are
    in range (a test says so), and a message should name only what the user wrote.
    [[driver]] entries are checked merged with the first default entry, so a cross-key
    check (``restart_backoff_max_s`` >= ``restart_backoff_s``) sees the effective pair."""
    for section, value in data.items():
        if section == "app" or (only is not None and section not in only):
            continue
        if section == "driver":
            entries = value if isinstance(value, list) else []
            yield from (("driver", p) for p in _driver_problems(entries))
            continue
        if not isinstance(value, dict):
            continue
        for key, v in value.items():
            check = RANGES.get((section, key))
            bad = check(v, value) if check is not None else None
            if bad is not None:
                yield section, f"{key} in [{section}] {bad}"


def _driver_problems(entries: list[Any]) -> Iterator[str]:
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        where = f"[[driver]] #{i + 1}"
        name = entry.get("name")
        if isinstance(name, str):
            where += f" ({name!r})"
            if name in seen:
                yield f"name in {where} is also the name of [[driver]] #{seen[name]}: " \
                      "each driver needs a name of its own (its socket)"
            seen.setdefault(name, i + 1)
        for key, v in entry.items():
            check = RANGES.get(("driver", key))
            bad = check(v, entry) if check is not None else None
            if bad is not None:
                yield f"{key} in {where} {bad}"
        own = entry.get("background")
        if isinstance(own, dict) and own:
            # The background lane's own keys, checked as its host sees them: merged over
            # the entry (a cross-key check meets the effective pair).
            merged = {**entry, **own}
            for key, v in own.items():
                check = RANGES.get(("driver", key))
                bad = check(v, merged) if check is not None else None
                if bad is not None:
                    yield f"{key} in [driver.background] of {where} {bad}"
    # A background lane's host takes NAME.background for its socket and state dir
    # (service/host_lanes.py): an entry of that name would share both with it.
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and entry.get("background_host") is True \
                and isinstance(entry.get("name"), str):
            lane = f"{entry['name']}.background"
            if lane in seen:
                yield (f"name in [[driver]] #{seen[lane]} ({lane!r}) is the name of the "
                       f"background lane of [[driver]] #{i + 1} ({entry['name']!r}, "
                       "background_host = true): its socket and state dir; rename one")
