"""`npu driver NAME`: run one driver host process (npud starts these itself).

Loads the plugin NAME's [[driver]] entry names (entry-point group
``npumanager.drivers``), refuses it if it does not implement npud's HAL
version, and serves DIR/drivers/NAME.sock until SIGTERM/SIGINT. Prints one
line containing ``ready`` once clients can connect. An entry whose
``options.devices`` lists several devices is served by this one process as
the devices ``NAME:DEVICE``, each on DIR/drivers/NAME:DEVICE.sock with its own
channels, run queue, grants and cache map (hal/host_config.device_entries).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npumanager.cli.main import add_runtime_dir
from npumanager.errors import UnsafePath
from npumanager.paths import manager_socket, runtime_dir
from npumanager.words import plural

if TYPE_CHECKING:
    from npumanager.config import Config
    from npumanager.drivers.host import DriverHost
    from npumanager.hal.host_config import HostConfig

log = logging.getLogger("npumanager.driver")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("driver", help="run a driver host process (npud starts these)")
    p.add_argument("name", help="driver name (a [[driver]] entry, or a plugin name)")
    add_runtime_dir(p)
    p.add_argument("--config", metavar="FILE", default=None, help="npud's config file (TOML)")
    p.add_argument("--state-dir", metavar="DIR", default=None,
                   help="root of private state (default: $NPU_STATE_DIR, /var/lib/npu as root)")
    p.add_argument("--channels", metavar="N", type=int, default=None,
                   help="override the channel count")
    p.add_argument("--background-sched", default=None,
                   choices=("idle", "nice", "normal", "share"),  # drivers/steps.py's
                   help="override [[driver]] background_sched")
    p.add_argument("--protect-foreground", choices=("auto", "on", "off"), default=None,
                   help="foreground protection for a host started by hand, as `npu serve "
                   "--protect-foreground` (same as [manager] protect_foreground, which it "
                   "overrides): the entry npud would run for the same file; auto (the "
                   "default) = as the npud serving --runtime-dir runs, else decided here as "
                   "npud's start would")
    p.add_argument("--no-enforce-admission", action="store_true",
                   help="prepare without a grant from npud (testing, standalone use)")
    p.add_argument("--exit-with-manager", action="store_true",
                   help="exit once the npud that attached is gone and no manager attached again "
                   "within [manager] orphan_grace_s (npud passes this to the hosts it starts)")
    # npud passes the resolved driver entry so overrides it was started with carry over.
    p.add_argument("--host-config-json", default=None, help=argparse.SUPPRESS)
    # npud binds DIR/drivers/NAME.sock itself (this host's user cannot write drivers/) and
    # passes the listening socket; and names its own uid (admins: root, the admin group
    # and npud's uid, never merely this host's user).
    # A host serving several devices gets one per device, in its devices' order.
    p.add_argument("--listen-fd", type=int, action="append", default=None,
                   help=argparse.SUPPRESS)
    p.add_argument("--manager-uid", type=int, default=None, help=argparse.SUPPRESS)
    # The npud that starts the host (its parent): once it exits, a device it never attached
    # to starts its orphan grace (with --exit-with-manager; see watch_launcher).
    p.add_argument("--launcher-pid", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--run-as", default=None, help=argparse.SUPPRESS)  # UID:GID
    p.set_defaults(func=main)


async def serve(args: argparse.Namespace) -> int:
    from npumanager.config import Config
    from npumanager.drivers.base import instantiate
    from npumanager.drivers.host import DriverHost
    from npumanager.drivers.sandbox import enter_empty_dir, harden
    from npumanager.hal.host_config import HostConfig
    from npumanager.paths import default_state_dir, driver_state_dir, ensure_private_dir

    harden()  # before any plugin is loaded or any connection taken
    if args.host_config_json:
        if args.protect_foreground:
            raise DriverConfigError("--protect-foreground is for a host started by hand: "
                                    "npud passes the entry it resolved")
        decoded = json.loads(args.host_config_json)
        hcs = [HostConfig(**d) for d in (decoded if isinstance(decoded, list) else [decoded])]
    else:
        cfg = await hand_started_config(Config.load(args.config), args)
        hcs = HostConfig.group(cfg, args.name)
    for hc in hcs:
        if args.channels:
            hc.channels = args.channels
        if args.background_sched:
            hc.background_sched = args.background_sched
        if args.no_enforce_admission:
            hc.enforce_admission = False
    apply_switch_interval(hcs)
    apply_malloc_threshold(hcs)
    # Absolute before the host moves into its empty working directory.
    rt = Path(os.path.abspath(runtime_dir(args.runtime_dir)))
    state_root = Path(os.path.abspath(args.state_dir)) if args.state_dir \
        else default_state_dir()
    # A device's background lane keeps a state dir (its cache map) of its own: two
    # processes never share one map (hal/host_config.HostConfig.lane).
    states = [driver_state_dir(hc.lane_name, state_root) for hc in hcs]
    try:
        for state in states:
            ensure_private_dir(state)
        enter_empty_dir(states[0])
    except (OSError, UnsafePath) as exc:
        # A configuration problem, not a bug: one line that says what to change (npud's
        # supervisor reads it as the first line of our stdout and shows it in `npu status`).
        how = "--state-dir" if args.state_dir else "NPU_STATE_DIR (or --state-dir)"
        raise DriverConfigError(
            f"cannot create its state dir {state}: {getattr(exc, 'strerror', None) or exc}; "
            f"set {how} to a "
            f"directory this user ({_user()}) may write") from None
    fds = list(args.listen_fd or [])
    if fds and len(fds) != len(hcs):
        raise DriverConfigError(f"{len(fds)} listening sockets for {len(hcs)} devices")
    if not fds:
        refuse_if_not_ours(rt)
        refuse_if_served(rt, hcs)
    listens: list[socket.socket | None] = [None] * len(hcs)
    for i, fd in enumerate(fds):
        sock = socket.socket(fileno=fd)
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise DriverConfigError(f"--listen-fd {fd} is not a Unix stream socket")
        listens[i] = sock
    # One host per device, each with its own socket, channels, queue, grants and cache
    # map; one process and event loop serve them all (API.md "Devices and budgets").
    warn_option_problems(hcs[0])
    hosts: list[DriverHost] = []
    try:
        for hc, state, listen in zip(hcs, states, listens, strict=True):
            driver, counts = instantiate(hc.plugin, plugin_options(hc, state))
            host = DriverHost(hc, driver, rt, state_root, cache_counts=counts,
                              listen_sock=listen, manager_uid=args.manager_uid)
            hosts.append(host)
            await host.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        rt_backstop(hosts, loop)
        # One line (npud reads one): every device is served.
        print("; ".join(f"driver {h.hc.name} ready at {h.socket_path} "
                        f"({h.driver.version}, {h.hc.channels} channels)" for h in hosts),
              flush=True)
        watches = [asyncio.ensure_future(exit_when_orphaned(hosts, stop))
                   ] if args.exit_with_manager else []
        if args.exit_with_manager and args.launcher_pid is not None:
            watches.append(asyncio.ensure_future(watch_launcher(hosts, args.launcher_pid)))
        try:
            await stop.wait()
        finally:
            for watch in watches:
                watch.cancel()
    finally:
        for host in hosts:
            await host.close()
    return 0


async def hand_started_config(cfg: Config, args: argparse.Namespace) -> Config:
    """The config a host started by hand runs: its file with the foreground protection
    npud would apply to it (service/protection.resolve_hand_started), said in one line."""
    from npumanager.service.protection import mode_of, resolve_hand_started

    npud = None
    if mode_of(cfg, args.protect_foreground) == "auto":
        npud = await npud_protection(runtime_dir(args.runtime_dir))
    cfg, protection = resolve_hand_started(cfg, args.protect_foreground, npud)
    log.info("%s", protection.line())
    for line in protection.skipped:
        log.info("%s", line)
    return cfg


async def npud_protection(rt: Path) -> tuple[bool, str] | None:
    """Whether the npud serving ``rt`` runs with foreground protection on, and which npud:
    its status (any client may read it) says; None where none answers in a few seconds or
    its status does not say."""
    from npumanager.client.aio import AsyncNpuManager
    from npumanager.service.protection import state_of

    sock = manager_socket(rt)
    if not sock.exists():
        return None
    try:
        mgr = await asyncio.wait_for(
            AsyncNpuManager.connect(rt, client_name="npu-driver", reconnect=False), 5.0)
        try:
            daemon = (await asyncio.wait_for(mgr.dump(), 5.0)).get("daemon") or {}
        finally:
            await mgr.close()
    except Exception:  # (no answer, or a refusal): the host starts all the same
        return None
    on = state_of(str(daemon.get("protection") or ""))
    return None if on is None else (on, f"the npud on {sock} (pid {daemon.get('pid')})")


def refuse_if_not_ours(rt: Path) -> None:
    """A host started by hand binds in ``rt/drivers``, which is the npud's that serves
    ``rt`` (paths.secure_dir): one started by another user is refused with the user to run
    it as (the generic UnsafePath would say to give npud's dir to this user)."""
    drivers = rt / "drivers"
    try:
        owner = os.lstat(drivers).st_uid
    except OSError:
        return  # (none yet: the host creates it, as npud would)
    if owner != os.geteuid():
        raise DriverConfigError(
            f"{drivers} belongs to uid {owner} (npud's: the npud serving {rt} runs as it), "
            f"not to this user ({_user()}): start `npu driver` as uid {owner} (e.g. with sudo), or "
            "give it a --runtime-dir of its own")


def refuse_if_served(rt: Path, hcs: list[HostConfig]) -> None:
    """A host started by hand binds its socket paths itself, which would take a live
    host's path from it (npud's connection to that host stays, apps reach this one): refuse
    instead, as npud refuses a second npud (npud's own hosts get their socket from npud)."""
    from npumanager.service.driver_slots import host_listens

    for hc in hcs:
        path = rt / "drivers" / f"{hc.lane_name}.sock"
        if host_listens(path):
            raise DriverConfigError(
                f"a driver host already serves {path}: stop it first (a host npud started "
                "is restarted by npud once stopped; stop npud first to serve it by hand)")


def rt_backstop(hosts: list[DriverHost], loop: asyncio.AbstractEventLoop) -> None:
    """With ``foreground_rt_priority`` on: RLIMIT_RTTIME's soft limit, and SIGXCPU (a FIFO
    thread ran that long without blocking; its default action kills the process) lowering
    every burst thread at FIFO (drivers/rt_threads.py)."""
    from npumanager.drivers.rt_threads import set_rttime_soft

    rts = [h.rt for h in hosts if h.rt is not None]
    if not rts:
        return

    def demote() -> None:
        n = sum(rt.demote_all() for rt in rts)
        # The kernel raised the soft limit by a second when it sent SIGXCPU (above the
        # hard one: the next thread would go straight to SIGKILL): set it again.
        set_rttime_soft()
        log.warning("SIGXCPU: a burst thread ran at SCHED_FIFO past RLIMIT_RTTIME's soft "
                    "limit; %s lowered", plural(n, "thread"))

    loop.add_signal_handler(signal.SIGXCPU, demote)
    set_rttime_soft()


def apply_switch_interval(hcs: list[HostConfig]) -> None:
    """The host process's GIL switch interval: one interpreter serves every device, so the
    shortest any of them asks for (``switch_interval_us``; 0 keeps Python's)."""
    intervals = [hc.switch_interval_us for hc in hcs if hc.switch_interval_us > 0]
    if intervals:
        sys.setswitchinterval(min(intervals) / 1e6)


def apply_malloc_threshold(hcs: list[HostConfig]) -> None:
    """glibc's mmap threshold for the host process (hal/malloc_tune.py): one heap serves
    every device, so the smallest any entry asks for (``malloc_mmap_threshold_kb``; 0
    keeps glibc's sliding one)."""
    from npumanager.hal.malloc_tune import set_mmap_threshold

    kbs = [hc.malloc_mmap_threshold_kb for hc in hcs if hc.malloc_mmap_threshold_kb > 0]
    if kbs:
        set_mmap_threshold(min(kbs))


def warn_option_problems(hc: HostConfig) -> None:
    """A misspelt option is never read by the plugin, so without a word here `npu serve`
    ran with it silently ignored (only `--check-config` named it). Said by the main host
    (a lane's options are the same), once per start."""
    from npumanager.drivers.option_specs import option_problems

    if hc.lane:
        return
    for problem in option_problems(hc.plugin, hc.options):
        log.warning("[[driver]] %r options: %s (`npu serve --check-config` checks a config "
                    "before a start)", hc.host_name, problem)


def plugin_options(hc: HostConfig, state: Path) -> dict[str, Any]:
    """The plugin's options: its [driver.options], with ``state_dir`` defaulting to the
    host's own private state dir (a plugin that must write, like torch's verified
    package copies, writes there rather than in a world-readable temporary dir)."""
    return {"state_dir": str(state), **hc.options}


async def exit_when_orphaned(hosts: list[DriverHost], stop: asyncio.Event) -> None:
    """npud died: its loaded models keep running for the orphan grace (inference survives
    a daemon restart), but nothing new is loaded; if no manager attaches again by then,
    the host has released them all and exits. A restarted npud that attaches within the
    grace adopts the host and what it holds; after it, it starts a host of its own on the
    same socket path, so an orphan must not linger.

    A manager that attaches once a grace ran out (a new npud connected as it ended and
    attached just after) clears that device's expiry: the host then serves it, empty,
    rather than exit under an npud that has just adopted it. So the host exits only while
    every device's grace is over and none has a manager attached."""
    while True:
        for host in hosts:  # every device's: one npud links to them all
            await host.orphan_expired.wait()
        if all(h.orphan_expired.is_set() for h in hosts):  # none re-attached meanwhile
            break
    log.warning("no manager attached again within %g s: exiting", hosts[0].hc.orphan_grace_s)
    stop.set()


async def watch_launcher(hosts: list[DriverHost], pid: int) -> None:
    """Tell every device once ``pid``, the npud that started this host (its parent), has
    exited: a device whose link never attached (npud was SIGKILLed between the host's
    ready line and its attach, or stopped before this device's link attached) hears no
    ManagerGone, so without this its grace would never start and the host would linger
    with no npud for ever (DriverHost.launcher_gone)."""
    await parent_exit(pid)
    log.info("the npud that started this host (pid %d) has exited", pid)
    for host in hosts:
        host.launcher_gone()


async def parent_exit(pid: int) -> None:
    """Return once process ``pid``, this process's parent when it started, has exited: a
    pidfd that becomes readable then, or (no pidfds) the parent pid polled."""
    if os.getppid() != pid:
        return  # gone before this looked: this process was reparented already
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        fd = -1
    try:
        # Still our parent once the pidfd is open: it is the live npud's, not a reused pid's.
        if fd >= 0 and os.getppid() == pid:
            loop = asyncio.get_running_loop()
            exited: asyncio.Future[None] = loop.create_future()

            def readable() -> None:
                if not exited.done():
                    exited.set_result(None)

            loop.add_reader(fd, readable)
            try:
                await exited
            finally:
                loop.remove_reader(fd)
        else:
            while os.getppid() == pid:
                await asyncio.sleep(0.5)
    finally:
        if fd >= 0:
            os.close(fd)


class DriverConfigError(Exception):
    """The host cannot start as configured (exit 1 with one line, no traceback)."""


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"


def become(spec: str) -> None:
    """``UID:GID``: drop every supplementary group, then the gid, then the uid (root
    only, before anything else runs); and check there is no way back."""
    uid_s, _, gid_s = spec.partition(":")
    uid, gid = int(uid_s), int(gid_s or uid_s)
    # While root: the host's lowered threads and compile child may return to nice 0, and
    # no further (the starvation bounds; drivers/compile_starve.py).
    from npumanager.drivers.compile_starve import allow_nice_0
    from npumanager.hal.rt_sched import drop_own_rtprio

    allow_nice_0()
    # And never SCHED_FIFO on its own: the host runs code an app chose (its model), and a
    # FIFO thread that blocks now and then escapes RLIMIT_RTTIME. Root's limit is usually
    # 0 already; where it is not (a raised limits.conf, a container's default), the host
    # would not need npud's checks (service/host_rt.py) to take the CPU from everyone.
    drop_own_rtprio()
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:  # pragma: no cover - the kernel would have to be broken
            raise SystemExit("driver host: could not give up root")
    os.umask(0o077)


def main(args: argparse.Namespace) -> int:
    from npumanager.hal.rt_sched import bound_own_rttime
    from npumanager.service.logs import setup_logging

    # Before root is given up: a bound on how long any thread of the host may run at
    # SCHED_FIFO without blocking that no unprivileged process can lift (npud grants
    # foreground_rt_priority only to a host that has it: service/host_rt.py).
    bound_own_rttime()
    if args.run_as:
        become(args.run_as)
    # The same format as npud's (and journald-aware under systemd): one log stream.
    setup_logging(os.environ.get("NPU_LOG_FORMAT", "text"),
                  os.environ.get("NPU_LOG_LEVEL", "info"), tag=f"driver[{args.name}]")
    profile_to = os.environ.get("NPU_DRIVER_PROFILE")  # a cProfile dump, for tuning
    if profile_to:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        try:
            return _run(args)
        finally:
            prof.disable()
            prof.dump_stats(profile_to)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from npumanager.errors import DriverRefused

    try:
        try:
            import uvloop
        except ImportError:
            return asyncio.run(serve(args))
        return int(uvloop.run(serve(args)))
    except (DriverConfigError, DriverRefused) as exc:
        # One line on stderr, as every command; and on stdout when that is a pipe: npud's
        # supervisor waits there for "ready", logs the line and shows it in `npu status`
        # (a plugin not installed, or whose backend fails to import, said only "did not
        # become ready" there).
        line = f"driver {args.name}: {exc}"
        refused = isinstance(exc, DriverRefused)  # as `npu` says an NpuError
        print(f"npu driver: DriverRefused: {exc}" if refused else line, file=sys.stderr,
              flush=True)
        if not sys.stdout.isatty():
            print(line, flush=True)
        return 1
