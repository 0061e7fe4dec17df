"""`npu serve --check-config [PATH]`: validate a config as `npu serve` would, without
starting anything.

Three stages, every problem of each reported (not only the first):

1. the file (config.file_problems): TOML syntax, unknown keys, types, ranges;
2. the owners of each section that stage 1 found clean, run as npud runs them at start
   (ManagerParams, the [[app]] table, process importance rules, the thermal monitor and
   its device sensors, the driver entries expanded into devices and host configs);
3. what `npu serve` would meet outside the file: each driver's plugin is installed and
   its optional extra importable (else: which extra to install), each built-in plugin's
   ``options`` (drivers/option_specs.py: known keys, types, ranges), optional extras of
   [thermal] and [fleet], the driver user (as root), the runtime dir and the length of
   every socket path in it, and the metrics address (well formed, its port free now).

A clean config prints a short summary of what differs from the defaults and exits 0: the
foreground protection in force (``protect_foreground``; for "auto", what it resolves to in
the checking process: service/protection.py), and notes for what npud would only warn about
(the protection's SCHED_FIFO keys set where this process lacks CAP_SYS_NICE:
service/rt_privilege.py).
"""

from __future__ import annotations

import errno
import grp
import importlib.util
import json
import os
import socket
import stat
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npumanager.config import Config, _defaults, file_problems, suggest
from npumanager.drivers.base import ENTRY_POINT_GROUP
from npumanager.drivers.option_specs import option_problems
from npumanager.errors import NpuError
from npumanager.hal.host_config import HostConfig, device_entries
from npumanager.paths import dir_problem, driver_socket, manager_socket, not_a_directory

if TYPE_CHECKING:
    from npumanager.service.protection import Protection

#: Built-in plugins whose backend is an optional extra: plugin -> (module, extra).
PLUGIN_EXTRAS = {"openvino": ("openvino", "openvino"), "torch": ("torch", "torch"),
                 "reference": ("onnxruntime", "")}
#: Longest AF_UNIX socket path Linux binds (sizeof sun_path).
SUN_PATH_MAX = 108


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _extra(module: str, extra: str) -> str:
    return (f"the {extra} extra, which is not installed (module {module!r} is not "
            f"importable): pip install 'npumanager[{extra}]'")


def owner_problems(cfg: Config, clean: Callable[[str], bool]) -> Iterator[str]:
    """What npud's start would refuse in sections ``clean`` says stage 1 passed."""
    from npumanager.clock import MonotonicClock
    from npumanager.service.apps import AppTable
    from npumanager.service.importance import ProcessImportance
    from npumanager.service.policy import ManagerParams
    from npumanager.thermal.monitor import ThermalMonitor
    from npumanager.thermal.sources import parse_trip_map

    def run(check: Callable[[], object]) -> Iterator[str]:
        try:
            check()
        except (NpuError, ValueError, LookupError) as exc:
            yield str(exc)

    if clean("manager") and clean("policy"):
        yield from run(lambda: ManagerParams.from_config(cfg))
    if clean("importance"):
        yield from run(lambda: ProcessImportance(cfg.section("importance")))
        if clean("app") and (cfg.apps() or cfg.section("importance").get("identity") == "unit"):
            yield from run(lambda: AppTable.from_config(cfg))
    devices: list[str] = []
    if clean("driver"):
        try:
            listed = device_entries(cfg)
            devices = [str(d["name"]) for d in listed]
            for d in cfg.drivers():
                HostConfig.group(cfg, str(d["name"]))
        except (NpuError, ValueError) as exc:
            yield str(exc)
    if clean("thermal"):
        section = cfg.section("thermal")
        try:
            monitor = ThermalMonitor(section, MonotonicClock(), dict, sources=[])
            parse_trip_map(section.get("trip_points", {}))
            unknown = [n for n in monitor.device_thermal.devices if n not in devices]
            if devices and unknown and drivers_on(cfg):
                yield (f"[thermal] devices names {', '.join(unknown)}; npud's devices are "
                       f"{', '.join(devices)}")
        except NpuError as exc:
            yield str(exc)


def drivers_on(cfg: Config) -> bool:
    return bool(cfg.section("manager").get("drivers", True)) and bool(cfg.drivers())


def plugin_problems(cfg: Config) -> Iterator[str]:
    """Each [[driver]]'s plugin installed, its backend importable; the other extras."""
    known = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    for i, d in enumerate(cfg.drivers()):
        plugin, where = str(d["plugin"]), f"[[driver]] #{i + 1} ({d['name']!r})"
        options = d.get("options")
        if isinstance(options, dict):  # (not a table: stage 1 said so)
            for problem in option_problems(plugin, options):
                yield f"{where} options: {problem}"
        if ":" in plugin:  # module:Class
            module = plugin.partition(":")[0]
            if not _installed(module):
                yield f"plugin {plugin!r} in {where}: module {module!r} is not importable"
            continue
        if plugin not in known:
            yield (f"plugin {plugin!r} in {where} is not an installed driver plugin"
                   f"{suggest(plugin, list(known))} (installed: "
                   f"{', '.join(sorted(known)) or 'none'})")
            continue
        module, extra = PLUGIN_EXTRAS.get(plugin, (known[plugin].module, ""))
        if not _installed(module):
            yield (f"plugin {plugin!r} in {where} needs {_extra(module, extra)}" if extra
                   else f"plugin {plugin!r} in {where}: module {module!r} is not importable")
    if "nvml" in cfg.section("thermal").get("sources", []) and not _installed("pynvml"):
        yield f"[thermal] sources names \"nvml\", which needs {_extra('pynvml', 'nvml')}"
    fleet = cfg.section("fleet")
    if fleet.get("redis_url") and fleet.get("trusted_keys"):
        for module in ("redis", "cryptography"):
            if not _installed(module):
                yield f"[fleet] (redis_url and trusted_keys set) needs {_extra(module, 'fleet')}"
                break
        for key in fleet.get("trusted_keys", []):
            if isinstance(key, str) and not key.startswith("ed25519:") \
                    and not os.access(key, os.R_OK):
                yield f"[fleet] trusted_keys: key file {key!r} cannot be read"


def metrics_problems(listen: str) -> Iterator[str]:
    """The metrics address (``--metrics`` or ``[metrics] listen``): well formed, and a
    port npud could bind now (bound and let go at once, as its HTTP server binds it:
    SO_REUSEADDR, so only a listener holds it, not a closed connection's TIME_WAIT)."""
    from npumanager.errors import InvalidArgument
    from npumanager.service.metrics import parse_listen

    try:
        host, port = parse_listen(listen)
    except InvalidArgument as exc:
        yield str(exc)
        return
    if port == 0:
        return  # any free port
    where = f"metrics listen address {listen!r}"
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        yield f"{where}: host {host!r} cannot be resolved ({exc})"
        return
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                yield (f"{where}: port {port} is in use (another process listens on it): "
                       f"stop it, or choose another port (port 0 picks a free one)")
            elif exc.errno == errno.EACCES:
                yield (f"{where}: port {port} needs privileges npud lacks (ports below "
                       f"1024 as non-root): choose a port from 1024 up")
            elif exc.errno == errno.EADDRNOTAVAIL:
                yield f"{where}: {host} is not an address of this machine"
            else:
                yield f"{where}: cannot bind it: {exc.strerror or exc}"


def socket_problems(cfg: Config, rt: Path, use_drivers: bool) -> Iterator[str]:
    """Socket paths too long to bind (npu serve refuses them before it starts anything)."""
    names = [str(d["name"]) for d in device_entries(cfg)] if use_drivers else []
    for path in [manager_socket(rt), *(driver_socket(n, rt) for n in names)]:
        if len(os.fsencode(path)) > SUN_PATH_MAX:
            yield (f"socket path {path} is {len(os.fsencode(path))} bytes, more than a Unix "
                   f"socket takes ({SUN_PATH_MAX}): choose a shorter --runtime-dir or "
                   "driver name")


def path_problems(cfg: Config, rt: Path, use_drivers: bool) -> Iterator[str]:
    """Socket paths too long to bind; a runtime dir npud would refuse."""
    yield from socket_problems(cfg, rt, use_drivers)
    try:
        st = os.lstat(rt)
    except FileNotFoundError:
        return  # npud creates it
    except OSError as exc:
        yield f"runtime dir {rt} cannot be inspected: {exc.strerror}"
        return
    problem = dir_problem(st, os.getuid()) if stat.S_ISDIR(st.st_mode) else not_a_directory(rt)
    if problem:
        yield f"runtime dir {rt} {problem}"


def host_problems(cfg: Config, use_drivers: bool) -> Iterator[str]:
    """The driver user (root only: not root, hosts run as npud's own user)."""
    if not use_drivers or os.getuid() != 0:
        return
    from npumanager.service.driver_launch import driver_user

    try:
        driver_user(str(cfg.section("manager").get("driver_user", "")))
    except LookupError as exc:
        yield str(exc)


def notes(cfg: Config) -> Iterator[str]:
    """What npud would only warn about."""
    group = cfg.section("manager").get("admin_group")
    if isinstance(group, str) and group and not group.isdigit():
        try:
            grp.getgrnam(group)
        except KeyError:
            yield f"[manager] admin_group {group!r} does not exist: only root and npud's " \
                  "own uid would be admins"
    from npumanager.service.importance import unused_rules

    unused = unused_rules((cfg.user or {}).get("importance") or {},
                          bool(cfg.section("importance").get("from_process")))
    if unused:
        yield unused


def check(path: str | None, rt: Path, *, no_drivers: bool = False,
          metrics: str | None = None) -> tuple[Config | None, list[str]]:
    """The config ``path`` gives (None: unreadable) and every problem found in it;
    ``metrics``: `npu serve --metrics`'s address (else the config's ``[metrics] listen``)."""
    prefix = f"config file {path}: " if path else "config: "
    if path is None:
        cfg, found = Config.load(None), []
        bad: set[str] = set()
    else:
        result = file_problems(path)
        if result.data is None:
            return None, result.problems
        # (with the file's own tables: the keys it sets win over protect_foreground's)
        cfg = Config(result.data, str(path), result.user)
        found, bad = list(result.problems), result.sections
    use_drivers = not no_drivers and drivers_on(cfg)
    later = [*owner_problems(cfg, lambda s: s not in bad)]
    if "driver" not in bad:
        if use_drivers:
            later += plugin_problems(cfg)
        later += path_problems(cfg, rt, use_drivers)
    if "manager" not in bad:
        later += host_problems(cfg, use_drivers)
    listen = metrics if metrics is not None else (
        "" if "metrics" in bad else str(cfg.section("metrics").get("listen", "") or ""))
    if listen:
        later += metrics_problems(listen)
    return cfg, found + [prefix + p for p in later]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k)) if not str(k).isidentifier() else k}"
                                f" = {_toml(v)}" for k, v in value.items()) + " }" \
            if value else "{}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


def _shown(section: str, key: str, value: Any) -> str:
    if (section, key) == ("manager", "socket_mode") and isinstance(value, int):
        return oct(value)
    return _toml(value)


def changes(cfg: Config) -> list[str]:
    """Lines for each setting that differs from the defaults."""
    base = _defaults()
    out: list[str] = []
    for section, value in cfg.data.items():
        if section in ("driver", "app") or not isinstance(value, dict):
            continue
        for key, v in value.items():
            default = base.get(section, {}).get(key)
            if v != default:
                out.append(f"[{section}] {key} = {_shown(section, key, v)} "
                           f"(default {_shown(section, key, default)})")
    template = base["driver"][0]
    if cfg.data.get("driver") != base["driver"]:
        for i, d in enumerate(cfg.drivers()):
            diff = [f"{k} = {_toml(v)} (default {_toml(template[k])})" for k, v in d.items()
                    if k not in ("name", "plugin") and v != template.get(k)]
            out.append(f"[[driver]] #{i + 1} {d['name']!r} (plugin {d['plugin']!r}): "
                       + ("; ".join(diff) or "default settings"))
        if not cfg.drivers():
            out.append("[[driver]]: none (npud runs as a pure manager)")
    for i, a in enumerate(cfg.apps()):
        out.append(f"[[app]] #{i + 1}: " + ", ".join(f"{k} = {_toml(v)}" for k, v in a.items()))
    return out


def summary(cfg: Config, rt: Path, no_drivers: bool, protect: str | None = None
            ) -> list[str]:
    """``protect``: `npu serve --protect-foreground`'s mode, else the file's."""
    from npumanager.service.protection import resolve

    use = not no_drivers and drivers_on(cfg)
    effective, protection = resolve(cfg, protect, use)
    lines = [f"{cfg.source if cfg.source != '<defaults>' else 'the defaults'}: OK "
             f"(npud would serve {manager_socket(rt)})"]
    diff = changes(cfg)
    lines += ["differs from the defaults:", *(f"  {x}" for x in diff)] if diff else \
        ["differs from the defaults: nothing"]
    devices = [str(d["name"]) for d in device_entries(cfg)] if use else []
    lines.append(f"devices: {', '.join(devices)}" if devices else
                 "devices: none (a pure manager: grants are issued, no driver enforces them)")
    lines.append(protection_line(protection))
    lines += [f"note: {n}" for n in notes(cfg)]
    lines += [f"note: {n}" for n in protection.skipped]
    lines += [f"note: {n}" for n in fifo_notes(effective, use)]
    return lines


def protection_line(protection: Protection) -> str:
    """The mode asked and, for "auto", what it resolves to in this (the checking) process:
    npud resolves it again where it runs, with its own privileges."""
    if protection.mode != "auto":
        return protection.line()
    return (f"foreground protection: auto; in this process: {'on' if protection.on else 'off'}"
            f" ({protection.why})")


def fifo_notes(cfg: Config, use_drivers: bool) -> list[str]:
    """The protection's SCHED_FIFO keys (service/rt_privilege.py): what this process could
    not serve; where it could, that npud needs the same where it runs (a unit may withhold
    it: an older copy of the shipped one, or its no-realtime drop-in)."""
    from npumanager.service.rt_privilege import DROP_IN, fifo_problems, rt_keys

    problems = fifo_problems(cfg, use_drivers=use_drivers)
    if problems:
        return problems
    app, hosts = rt_keys(cfg)
    if app <= 0 and not (use_drivers and hosts):
        return []
    return ["the SCHED_FIFO keys (app_rt_priority, foreground_rt_priority) need "
            "CAP_SYS_NICE and real-time scheduling in npud's process: this one has both; "
            "under systemd the shipped unit gives both; an older copy of it withholds them "
            f"({DROP_IN} adds them), and so does its no-realtime.conf drop-in"]
