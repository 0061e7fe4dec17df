"""Foreground protection by default: ``[manager] protect_foreground`` ("auto", "on", "off";
`npu serve --protect-foreground` wins over the file) turned into the config npud runs.

"on" makes the recommended set (README "Protecting a foreground stream"; bench row
``rt+app+bg-host+here-normal+step-nice+load-nice``) the DEFAULT of the keys it names: a key the file
sets always wins, so ``background_host = false`` or ``app_rt_priority = 0`` turns that part
off. "off" implies nothing (npud's behaviour before the key). "auto" is "on" where this
npud can serve the set's SCHED_FIFO keys and runs drivers, else "off": all or nothing on
FIFO, because the camera needs both FIFO threads (its app's and its host's burst thread).
Without them its p99 was 1.9-2.9 ms, as with the defaults (bench/README.md, "The
recommended config part by part"), while the second host still costs its memory.

:func:`effective` is pure (a Config, the mode, whether FIFO is possible); :func:`resolve`
reads what it needs (the privilege, given by the caller) and says why. npud applies it once
at start, before anything reads the keys (cli/serve.py), so a restarted npud with the same
file and privileges runs the same config and adopts the same hosts (lane included).

A driver host started by hand (`npu driver NAME --config FILE`, cli/driver.py) runs the
entry npud would give it for the same file: :func:`resolve_hand_started`, with `npu driver
--protect-foreground` as the flag. Its "auto" is npud's question (can npud put threads at
SCHED_FIFO? the host only asks npud for them), which the host's own privilege does not
answer: the recommended host runs unprivileged beside a root npud. So where an npud serves
the host's runtime dir, "auto" is what that npud resolved (its status says, to any client);
where none does yet (a host started first, for npud to adopt), it is decided as npud's
start would decide it, in the host's process, and the line says that npud decides for
itself and that the flag settles it. npud names every key that differs when it adopts a
host (service/supervisor.py), so a wrong guess does not go unseen.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from npumanager.config import Config, _defaults
from npumanager.constants import Importance
from npumanager.hal.host_config import host_devices
from npumanager.service.rt_privilege import DROP_IN, Privilege, fifo_problems

MODES = ("auto", "on", "off")
#: What "on" implies in [manager].
#: app_rt_importance (voice29): a VISIBLE app's thread (a voice assistant's) may be granted
#: too. Without it the voice's host burst thread, at FIFO (VISIBLE work is in the driver's
#: FOREGROUND class), preempted the voice's own thread on its CPU and kept it off through
#: its bookkeeping after each answer: the bench's voice p50 / p99 0.8 / 2.5-2.8 ms vs
#: 0.5-0.6 / 0.8-1.0 when it asks, camera and background as before (two full same-invocation
#: pairs: bench/README.md "The voice assistant under foreground protection").
MANAGER_KEYS: dict[str, Any] = {"app_rt_priority": 2,
                                "app_rt_importance": int(Importance.VISIBLE)}
#: ... in each [[driver]] entry of a plugin in PLUGINS.
ENTRY_KEYS: dict[str, Any] = {"foreground_rt_priority": 1, "switch_interval_us": 500,
                              "background_host": True}
#: ... in such an entry's [driver.background] (its lane's own keys: tuned for throughput).
#: background_load_nice (load28): a background model's load at the step workers' nice
#: value, not SCHED_IDLE, where the other background apps' steps (nice 19, the embedder's
#: at nice 0 on its burst's thread) left it a CPU only when they had none to use: its p50
#: 768-961 ms vs 1131-3573 without in four same-invocation pairs, the camera's loading p99
#: within the spread (bench/README.md "A background model's load under foreground
#: protection").
LANE_KEYS: dict[str, Any] = {"background_burst_here": "normal", "background_step_nice": 19,
                             "background_load_nice": 19}
#: The plugins the set applies to: the set was measured for the CPU-backed reference driver
#: only (bench/contention.py); a real NPU's driver has other costs (its burst thread does
#: not run the model on the CPU, a second host holds a second device context), so its
#: entries are left as they are.
PLUGINS = ("reference",)


@dataclass(frozen=True)
class Protection:
    """What is in force and why."""

    #: As asked: "auto", "on" or "off".
    mode: str
    #: The set applied (the mode, or what "auto" resolved to).
    on: bool
    #: For "auto": why it resolved as it did, with the fix where it is off.
    why: str = ""
    #: Entries left as they are, each with why (one log line each).
    skipped: tuple[str, ...] = field(default=())
    #: "auto" found npud unable to serve the FIFO keys (npud's start warns, with the fix).
    unable: bool = False
    def line(self) -> str:
        """npud's start line: ``foreground protection: on (auto: ...)``."""
        state = "on" if self.on else "off"
        if self.mode == "auto":
            return f"{PREFIX}{state} (auto: {self.why})"
        return f"{PREFIX}{state} (protect_foreground = \"{self.mode}\")"


#: How :meth:`Protection.line` starts.
PREFIX = "foreground protection: "


def state_of(line: str) -> bool | None:
    """Whether :meth:`Protection.line` ``line`` (npud's, from its status) says on; None for
    another text."""
    word = line.removeprefix(PREFIX).split(" ", 1)[0] if line.startswith(PREFIX) else ""
    return {"on": True, "off": False}.get(word)


def _user_set(cfg: Config) -> tuple[set[str], list[tuple[set[str], set[str]]]]:
    """The [manager] keys the user set, and per raw [[driver]] entry (cfg.data["driver"]) the
    keys it set and the keys its [driver.background] set. Without ``cfg.user`` (a Config
    built from data) a key counts as set where it differs from its default."""
    base = _defaults()
    entries = [d for d in cfg.data.get("driver", []) if isinstance(d, dict)]
    if cfg.user is not None:
        manager = set((cfg.user.get("manager") or {}).keys())
        raw = cfg.user.get("driver")
        listed = raw if isinstance(raw, list) else []
        per = []
        for i in range(len(entries)):
            own = listed[i] if i < len(listed) and isinstance(listed[i], dict) else {}
            lane = own.get("background")
            per.append((set(own), set(lane) if isinstance(lane, dict) else set()))
        return manager, per
    defaults, template = base["manager"], base["driver"][0]
    manager = {k for k, v in cfg.section("manager").items() if defaults.get(k) != v}
    per = []
    for d in entries:
        lane = d.get("background")
        per.append(({k for k, v in d.items() if template.get(k) != v},
                    set(lane) if isinstance(lane, dict) else set()))
    return manager, per


def expand(cfg: Config) -> tuple[Config, tuple[str, ...]]:
    """``cfg`` with the set as the default of the keys it names ("on"), and the entries it
    left as they are, each with why."""
    manager_set, per = _user_set(cfg)
    data = copy.deepcopy(cfg.data)
    manager = data.setdefault("manager", {})
    for key, value in MANAGER_KEYS.items():
        if key not in manager_set:
            manager[key] = value
    skipped: list[str] = []
    raw = [d for d in data.get("driver", []) if isinstance(d, dict)]
    for entry, merged, (own, lane_own) in zip(raw, cfg.drivers(), per, strict=True):
        name = merged.get("name")
        if merged.get("plugin") not in PLUGINS:
            continue  # (measured for the reference driver only: PLUGINS)
        devices = host_devices(merged)
        if devices and "background_host" not in own:
            # hal/host_config.device_entries refuses a lane for an entry serving several
            # devices (one socket pair per host process).
            skipped.append(f"[[driver]] {name!r} serves {len(devices)} devices "
                           "(options.devices): a background lane is for an entry serving "
                           "one device, so foreground protection leaves it as it is")
            continue
        for key, value in ENTRY_KEYS.items():
            if key not in own:
                entry[key] = value
        if entry.get("background_host", merged.get("background_host")):
            lane = entry.get("background")
            lane = dict(lane) if isinstance(lane, dict) else {}
            for key, value in LANE_KEYS.items():
                if key not in lane_own:
                    lane[key] = value
            entry["background"] = lane
    return Config(data, cfg.source, cfg.user), tuple(skipped)


def effective(cfg: Config, mode: str, fifo_ok: bool) -> tuple[Config, Protection]:
    """The config npud runs for ``mode`` ("auto", "on", "off") where this npud can (or
    cannot: ``fifo_ok``) serve the set's SCHED_FIFO keys with drivers. Pure."""
    if mode not in MODES:
        raise ValueError(f"protect_foreground must be one of {', '.join(map(repr, MODES))}, "
                         f"not {mode!r}")
    on = mode == "on" or (mode == "auto" and fifo_ok)
    if not on:
        return cfg, Protection(mode, False)
    out, skipped = expand(cfg)
    return out, Protection(mode, True, skipped=skipped)


def mode_of(cfg: Config, flag: str | None = None) -> str:
    """The mode asked: `npu serve --protect-foreground` when given, else the file's."""
    return flag if flag else str(cfg.section("manager").get("protect_foreground", "auto"))


def off_cause(priv: Privilege, who: str = "npud") -> str:
    """Why ``who`` (this process) cannot put another process's thread at SCHED_FIFO, for the
    line that says auto resolved to off (service/rt_privilege.py names the same causes)."""
    if not priv.cap_sys_nice:
        return f"{who} lacks CAP_SYS_NICE"
    if priv.refused:
        return (f"the kernel refuses SCHED_FIFO to {who} although it has CAP_SYS_NICE "
                f"({priv.refused}: a seccomp filter such as systemd's RestrictRealtime=yes, "
                "or its cgroup's real-time budget)")
    return f"{who}'s RLIMIT_RTPRIO ({priv.rtprio}) is below the set's priorities"


#: The fix the auto-off line names.
FIX = (f"install {DROP_IN} under systemd (CAP_SYS_NICE, RestrictRealtime=no), or set "
       "[manager] protect_foreground = \"on\" for the background lane and its keys alone")


def resolve(cfg: Config, flag: str | None, use_drivers: bool,
            priv: Privilege | None = None, *, who: str = "npud", fix: str = FIX
            ) -> tuple[Config, Protection]:
    """:func:`effective` for the mode asked, deciding "auto" as npud's start would: the
    same check ``fifo_problems`` makes, on the config "on" would give (``priv``: this
    process's, read and probed only for "auto" with drivers). ``who``: this process, in
    the line; ``fix``: what the line says to do where "auto" resolves off ("": nothing)."""
    mode = mode_of(cfg, flag)
    if mode != "auto":
        return effective(cfg, mode, False)
    if not use_drivers:
        return cfg, Protection(mode, False, "npud runs no drivers")
    priv = Privilege.of_this_process() if priv is None else priv
    on_cfg, skipped = expand(cfg)
    if fifo_problems(on_cfg, priv, use_drivers):
        return cfg, Protection(mode, False, off_cause(priv, who) + (f". Fix: {fix}" if fix
                                                                    else ""), unable=True)
    return on_cfg, Protection(mode, True, f"{who} can put threads at SCHED_FIFO",
                              skipped=skipped)


#: What a host started by hand where no npud serves says of its own "auto".
ALONE = ("; no npud serves this runtime dir to ask, and npud decides \"auto\" by its own "
         "privileges: where they differ, pass --protect-foreground as `npu status` shows npud's")


def resolve_hand_started(cfg: Config, flag: str | None, npud: tuple[bool, str] | None,
                         priv: Privilege | None = None) -> tuple[Config, Protection]:
    """The config a driver host started by hand runs (the module's doc says why): the mode
    asked (`npu driver --protect-foreground`, else the file's); "auto" as ``npud`` runs
    (on or off, and which npud: from the status of the npud serving the host's runtime
    dir), else (None: none answered) decided in this process as npud's start would."""
    mode = mode_of(cfg, flag)
    if mode != "auto":
        return effective(cfg, mode, False)
    if npud is not None:
        on, where = npud
        out, protection = effective(cfg, "on" if on else "off", False)
        return out, dataclasses.replace(protection, mode=mode, why=f"as {where} runs")
    out, protection = resolve(cfg, mode, True, priv, who="this process", fix="")
    return out, dataclasses.replace(protection, why=protection.why + ALONE)


__all__ = ["ENTRY_KEYS", "LANE_KEYS", "MANAGER_KEYS", "MODES", "PLUGINS", "PREFIX", "Protection",
           "effective", "expand", "mode_of", "off_cause", "resolve", "resolve_hand_started",
           "state_of"]
