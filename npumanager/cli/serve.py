"""`npu serve`: run npud in the foreground."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from npumanager.cli.main import add_runtime_dir
from npumanager.words import plural

if TYPE_CHECKING:
    from npumanager.service.protection import Protection


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run npud (the manager daemon) in the foreground",
        description="Run npud in the foreground: serve DIR/npu.sock, start the configured "
        "drivers, print a line containing 'ready' once clients can connect, and exit cleanly "
        "on SIGTERM/SIGINT. Under systemd (Type=notify) it reports READY=1, STATUS= and "
        "STOPPING=1 and logs with journald priorities.",
    )
    add_runtime_dir(p)
    p.add_argument("--config", metavar="FILE", default=None,
                   help="TOML file overlaid on the embedded defaults")
    p.add_argument("--no-drivers", action="store_true",
                   help="serve as a pure manager without starting any driver "
                   "(same as [manager] drivers = false)")
    p.add_argument("--metrics", metavar="HOST:PORT", default=None,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (same as "
                   "[metrics] listen; port 0 picks a free one)")
    p.add_argument("--state-dir", metavar="DIR", default=None,
                   help="root of private state: admin settings (DIR/npud) and the drivers' "
                   "cache maps (default: $NPU_STATE_DIR, /var/lib/npu as root; an npud on a "
                   "non-default runtime dir persists settings only when given one)")
    p.add_argument("--protect-foreground", choices=("auto", "on", "off"), default=None,
                   help="foreground protection (same as [manager] protect_foreground, which "
                   "it overrides): on = the recommended FIFO threads and background lane as "
                   "defaults, off = none, auto (the default) = on where npud can put threads "
                   "at SCHED_FIFO and runs drivers")
    p.add_argument("--check-config", nargs="?", const="", default=None, metavar="PATH",
                   help="validate the config (PATH, else --config's file, else the "
                   "defaults) as serve would, without starting anything: print what differs "
                   "from the defaults and exit 0, or print every problem found and exit 1")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from npumanager.config import Config
    from npumanager.paths import ensure_runtime_dir, manager_socket, runtime_dir
    from npumanager.service.daemon import Daemon, drivers_enabled
    from npumanager.service.logs import setup_logging
    from npumanager.service.notify import Notifier, SystemdObserver
    from npumanager.service.serving import run

    if args.check_config is not None:
        return check_config(args)
    cfg = Config.load(args.config)
    mcfg = cfg.section("manager")
    fmt, level = str(mcfg.get("log_format", "text")), str(mcfg.get("log_level", "info"))
    setup_logging(fmt, level)
    # Driver hosts inherit the environment: they log in npud's format at npud's level.
    os.environ["NPU_LOG_FORMAT"], os.environ["NPU_LOG_LEVEL"] = fmt, level
    rt = ensure_runtime_dir(runtime_dir(args.runtime_dir))  # UnsafePath: exit 1, named
    from npumanager.service.daemon import refuse_if_serving

    refuse_if_serving(manager_socket(rt))  # before any line of a start that will not happen
    use_drivers = not args.no_drivers and drivers_enabled(cfg)
    from npumanager.cli.check_config import metrics_problems, socket_problems
    from npumanager.errors import InvalidArgument
    from npumanager.service.protection import resolve

    # Once, before anything reads the keys it implies (service/protection.py).
    cfg, protection = resolve(cfg, args.protect_foreground, use_drivers)

    for problem in socket_problems(cfg, rt, use_drivers):  # bind would fail, later
        raise InvalidArgument(problem)
    _log_protection(protection)
    observers: list[Any] = []
    listen = args.metrics if args.metrics is not None else \
        str(cfg.section("metrics").get("listen", "") or "")
    metrics_at = ""
    from npumanager.service.metrics import MetricsServer, metrics_observers

    if listen:
        # Bound only once npud runs, where a failure is logged and npud goes on: a port in
        # use or an address not this machine's is said here, one line, before any start.
        for problem in metrics_problems(listen):
            raise InvalidArgument(problem)
        names = [str(d["name"]) for d in cfg.drivers()] if use_drivers else []
        observers += metrics_observers(listen, names[0] if names else "none")

    def describe(d: Daemon) -> str:
        return f"serving {manager_socket(rt)}; drivers: {_drivers_text(d)}{metrics_at}"

    def ready(d: Daemon) -> None:
        nonlocal metrics_at
        for o in observers:
            if isinstance(o, MetricsServer) and o.serving:
                metrics_at = f", metrics on http://{o.host}:{o.port}/metrics"
        print(f"npud ready on {manager_socket(rt)} (pid {os.getpid()}, "
              f"drivers: {_drivers_text(d)}{metrics_at})", flush=True)

    # Last, so READY=1 goes out after everything else is up.
    observers.append(SystemdObserver(Notifier(), describe))
    from pathlib import Path

    state_dir = Path(args.state_dir) if args.state_dir else None
    rc = run(cfg, rt, use_drivers=use_drivers, ready=ready, observers=observers,
             state_dir=state_dir, protection=protection.line())
    sys.stdout.flush()
    return rc


def _log_protection(protection: Protection) -> None:
    """npud's start line for foreground protection: a warning where "auto" found npud
    unable to give it (the cause and the fix), else info; one line per entry left out."""
    import logging

    log = logging.getLogger("npumanager.npud")
    log.log(logging.WARNING if protection.unable else logging.INFO, "%s", protection.line())
    for line in protection.skipped:
        log.info("%s", line)


def check_config(args: argparse.Namespace) -> int:
    """`npu serve --check-config [PATH]`: every problem on stderr and 1, or a summary and 0."""
    from npumanager.cli import check_config as cc
    from npumanager.paths import runtime_dir

    path = args.check_config or args.config
    rt = runtime_dir(args.runtime_dir)
    cfg, problems = cc.check(path, rt, no_drivers=args.no_drivers, metrics=args.metrics)
    if cfg is None or problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        print(f"npu serve --check-config: {plural(len(problems), 'problem')} found",
              file=sys.stderr)
        return 1
    print("\n".join(cc.summary(cfg, rt, args.no_drivers, args.protect_foreground)))
    return 0


def _drivers_text(d: Any) -> str:
    """"reference" when up, "reference (DOWN: why)" when not."""
    down = getattr(d.drivers, "down_reasons", None)
    reasons = down() if callable(down) else {}
    parts = [x.name if x.available else f"{x.name} (DOWN: {reasons.get(x.name, 'not up')})"
             for x in d.drivers.devices()]
    return ", ".join(parts) or "none"
