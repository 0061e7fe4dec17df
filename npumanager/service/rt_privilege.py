"""Can this npud put the protection's threads at SCHED_FIFO? What `npu serve --check-config`
and npud's start say when the config asks for it and the process cannot.

The protection keys (README "Protecting a foreground stream (opt-in)"): ``[manager]
app_rt_priority`` (an app's thread, granted through ``model.burst(realtime=True)``) and
``[[driver]] foreground_rt_priority`` (a driver host's burst thread; the background lane's
own from ``[driver.background]``). npud sets both with ``sched_setscheduler`` on threads of
other processes (hal/rt_sched.set_fifo). The kernel lets it do that with CAP_SYS_NICE in
its effective set; without it, only on a thread of its own uid whose own RLIMIT_RTPRIO
allows the priority (the *target's* limit: ``__sched_setscheduler``). An app's thread is
another uid's (and has its own limit, 0 by default); a host's thread is another uid's when
npud is root (the hosts run as ``[manager] driver_user``), and npud's own with npud's
limit (inherited) when npud is not root.

Without it nothing fails at start: each app's request is refused (RealtimeUnavailable),
and the hosts' burst threads stay at normal priority (npud logs it once, at the first).
The shipped systemd unit's capability bounding set lacks CAP_SYS_NICE (root there cannot
have it): ``packaging/systemd/npud.service.d/protect-foreground.conf`` adds it.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from npumanager.config import Config
from npumanager.hal.host_config import lane_entry

#: capability(7) number of CAP_SYS_NICE: its bit in /proc/PID/status's CapEff mask.
CAP_SYS_NICE = 23
#: The drop-in that adds CAP_SYS_NICE to the shipped unit (README "Running npud under
#: systemd").
DROP_IN = "packaging/systemd/npud.service.d/protect-foreground.conf"


@dataclass(frozen=True)
class Privilege:
    """What decides whether this process may set other threads to SCHED_FIFO."""

    #: CAP_SYS_NICE in the effective set.
    cap_sys_nice: bool
    #: The effective uid (0: root, whose driver hosts run as another user).
    euid: int
    #: The soft RLIMIT_RTPRIO (the driver hosts inherit it).
    rtprio: int

    @classmethod
    def of_this_process(cls, status_path: str = "/proc/self/status") -> Privilege:
        soft, _hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
        return cls(cap_sys_nice=has_cap(CAP_SYS_NICE, status_path), euid=os.geteuid(),
                   rtprio=max(0, soft) if soft != resource.RLIM_INFINITY else 99)


def has_cap(cap: int, status_path: str = "/proc/self/status") -> bool:
    """Whether capability number ``cap`` is in the effective set (CapEff of
    ``status_path``); False where it cannot be read."""
    try:
        with open(status_path, encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> cap & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def rt_keys(cfg: Config) -> tuple[int, list[tuple[str, int]]]:
    """The protection's priorities the config sets: ``[manager] app_rt_priority`` (0: off)
    and each host's ``foreground_rt_priority`` above 0, as (where, priority)."""
    app = int(cfg.section("manager").get("app_rt_priority", 0) or 0)
    hosts: list[tuple[str, int]] = []
    for d in cfg.drivers():
        name = str(d.get("name"))
        own = int(d.get("foreground_rt_priority", 0) or 0)
        if own > 0:
            hosts.append((f"[[driver]] {name!r} foreground_rt_priority = {own}", own))
        if d.get("background_host"):
            lane = int(lane_entry(d).get("foreground_rt_priority", 0) or 0)
            if lane > 0 and "foreground_rt_priority" in (d.get("background") or {}):
                hosts.append((f"[[driver]] {name!r} [driver.background] "
                              f"foreground_rt_priority = {lane}", lane))
    return app, hosts


def fifo_problems(cfg: Config, priv: Privilege | None = None, use_drivers: bool = True
                  ) -> list[str]:
    """One line per protection key this process cannot serve: what is set, what will
    happen, how to fix it. Empty when nothing is set or the process may."""
    priv = Privilege.of_this_process() if priv is None else priv
    if priv.cap_sys_nice:
        return []
    app, hosts = rt_keys(cfg)
    if not use_drivers:
        hosts = []
    why = "this process lacks CAP_SYS_NICE"
    fix = ("run npud as root with CAP_SYS_NICE; under systemd, the shipped unit's "
           f"capability bounding set lacks it: install {DROP_IN} as "
           "/etc/systemd/system/npud.service.d/protect-foreground.conf, then "
           "systemctl daemon-reload && systemctl restart npud")
    out: list[str] = []
    if app > 0:
        out.append(f"[manager] app_rt_priority = {app} is set, but {why}, so npud cannot put "
                   "an app's thread at SCHED_FIFO: every model.burst(realtime=True) is "
                   f"refused (RealtimeUnavailable) and the app's thread stays normal. Fix: "
                   f"{fix}")
    for where, priority in hosts:
        # Not root: the hosts run as npud's own uid and inherit its RLIMIT_RTPRIO, which
        # the kernel checks on the target thread: enough on its own.
        if priv.euid != 0 and priv.rtprio >= priority:
            continue
        limit = ("" if priv.euid == 0 else
                 f" (and its RLIMIT_RTPRIO {priv.rtprio} is below {priority})")
        out.append(f"{where} is set, but {why}{limit}, so npud cannot put that driver "
                   "host's burst thread at SCHED_FIFO: it serves FOREGROUND frames at normal "
                   f"priority (npud logs it once, at the first). Fix: {fix}")
    return out


__all__ = ["CAP_SYS_NICE", "DROP_IN", "Privilege", "fifo_problems", "has_cap", "rt_keys"]
