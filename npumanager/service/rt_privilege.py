"""Can this npud put the protection's threads at SCHED_FIFO? What `npu serve --check-config`
and npud's start say when the config asks for it and the process cannot.

The protection keys (README "Protecting a foreground stream"): ``[manager]
app_rt_priority`` (an app's thread, granted through ``model.burst(realtime=True)``) and
``[[driver]] foreground_rt_priority`` (a driver host's burst thread; the background lane's
own from ``[driver.background]``). npud sets both with ``sched_setscheduler`` on threads of
other processes (hal/rt_sched.set_fifo). The kernel lets it do that with CAP_SYS_NICE in
its effective set; without it, only on a thread of its own uid whose own RLIMIT_RTPRIO
allows the priority (the *target's* limit: ``__sched_setscheduler``). An app's thread is
another uid's (and has its own limit, 0 by default); a host's thread is another uid's when
npud is root (the hosts run as ``[manager] driver_user``), and npud's own with npud's
limit (inherited) when npud is not root.

The capability is not all: a seccomp filter (systemd's ``RestrictRealtime=yes``) or a
cgroup without a real-time budget makes the kernel refuse every SCHED_FIFO request of the
process, capability or not. So where the keys are set the check
also tries it: one parked thread of this process to FIFO 1 and straight back
(:func:`fifo_probe`).

Without either nothing fails at start: each app's request is refused (RealtimeUnavailable),
and the hosts' burst threads stay at normal priority (npud logs it once, at the first).
The shipped systemd unit gives npud both (CAP_SYS_NICE in its capability bounding set,
``RestrictRealtime=no``). An older copy of it withheld both:
``packaging/systemd/npud.service.d/protect-foreground.conf`` adds them to such a copy, and
``no-realtime.conf`` beside it takes them away on purpose.
"""

from __future__ import annotations

import os
import resource
import threading
from dataclasses import dataclass

from npumanager.config import Config
from npumanager.hal import rt_sched
from npumanager.hal.host_config import lane_entry

#: capability(7) number of CAP_SYS_NICE: its bit in /proc/PID/status's CapEff mask.
CAP_SYS_NICE = 23
#: The drop-in that adds CAP_SYS_NICE and real-time scheduling to an older copy of the
#: shipped unit, which withheld both (README "Running npud under systemd").
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
    #: Why the kernel refused this process a thread of its own at SCHED_FIFO ('': it did
    #: not; :func:`fifo_probe`).
    refused: str = ""

    @classmethod
    def of_this_process(cls, status_path: str = "/proc/self/status") -> Privilege:
        soft, _hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
        return cls(cap_sys_nice=has_cap(CAP_SYS_NICE, status_path), euid=os.geteuid(),
                   rtprio=max(0, soft) if soft != resource.RLIM_INFINITY else 99,
                   refused=fifo_probe())


def fifo_probe() -> str:
    """'' when the kernel lets this process put a thread of its own at SCHED_FIFO 1, else
    why not. The thread is one started for it and parked (blocked) throughout: it is set
    back to SCHED_OTHER before it is let go, so it never runs at FIFO."""
    parked, release = threading.Event(), threading.Event()
    tids: list[int] = []

    def park() -> None:
        tids.append(threading.get_native_id())
        parked.set()
        release.wait(10.0)

    thread = threading.Thread(target=park, name="npu-fifo-probe", daemon=True)
    thread.start()
    try:
        if not parked.wait(10.0):
            return "the probe thread did not start"
        got = rt_sched.set_fifo(tids[0], rt_sched.MIN_PRIORITY)
        if got.ok:
            rt_sched.set_other(tids[0])
        return got.why
    finally:
        release.set()
        thread.join(10.0)


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


def refusal_cause(status_path: str = "/proc/self/status") -> str:
    """Why the kernel refused npud a SCHED_FIFO request with EPERM (for its log and the
    app's RealtimeUnavailable): the capability missing, else what refuses it anyway."""
    if not has_cap(CAP_SYS_NICE, status_path):
        return f"npud lacks CAP_SYS_NICE (under systemd: {DROP_IN})"
    return ("npud has CAP_SYS_NICE, so a seccomp filter refuses it (systemd's "
            f"RestrictRealtime=yes: {DROP_IN} lifts it) or its cgroup's real-time budget")


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
    happen, how to fix it. Empty when nothing is set or the process may (``priv``: this
    process's, read and probed only where a key is set)."""
    app, hosts = rt_keys(cfg)
    if not use_drivers:
        hosts = []
    if app <= 0 and not hosts:
        return []
    priv = Privilege.of_this_process() if priv is None else priv
    if priv.cap_sys_nice and not priv.refused:
        return []
    if priv.cap_sys_nice:
        why = (f"the kernel refuses SCHED_FIFO to this process although it has CAP_SYS_NICE "
               f"({priv.refused}: a seccomp filter such as systemd's RestrictRealtime=yes, "
               "or its cgroup's real-time budget, cpu.rt_runtime_us 0)")
        fix = (f"under systemd, RestrictRealtime=no ({DROP_IN} sets it, with the "
               "capability); elsewhere, give npud's cgroup a real-time budget")
    else:
        why = "this process lacks CAP_SYS_NICE"
        fix = ("run npud as root with CAP_SYS_NICE; under systemd, the unit's capability "
               "bounding set lacks it (an older copy of the shipped unit, or its "
               f"no-realtime.conf drop-in): install {DROP_IN} as "
               "/etc/systemd/system/npud.service.d/protect-foreground.conf (or remove "
               "no-realtime.conf), then systemctl daemon-reload && systemctl restart npud")
    out: list[str] = []
    if app > 0:
        out.append(f"[manager] app_rt_priority = {app} is set, but {why}, so npud cannot put "
                   "an app's thread at SCHED_FIFO: every model.burst(realtime=True) is "
                   f"refused (RealtimeUnavailable) and the app's thread stays normal. Fix: "
                   f"{fix}")
    for where, priority in hosts:
        # Not root: the hosts run as npud's own uid and inherit its RLIMIT_RTPRIO, which
        # the kernel checks on the target thread: enough on its own where it lets npud.
        if not priv.cap_sys_nice and not priv.refused and priv.euid != 0 \
                and priv.rtprio >= priority:
            continue
        limit = ("" if priv.euid == 0 or priv.cap_sys_nice else
                 f" (and its RLIMIT_RTPRIO {priv.rtprio} is below {priority})"
                 if priv.rtprio < priority else f" (and {priv.refused})")
        out.append(f"{where} is set, but {why}{limit}, so npud cannot put that driver "
                   "host's burst thread at SCHED_FIFO: it serves FOREGROUND frames at normal "
                   f"priority (npud logs it once, at the first). Fix: {fix}")
    return out


__all__ = ["CAP_SYS_NICE", "DROP_IN", "Privilege", "fifo_probe", "fifo_problems", "has_cap",
           "refusal_cause", "rt_keys"]
