"""`npu serve`: run npud in the foreground."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from npumanager.cli.main import add_runtime_dir


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run npud (the manager daemon) in the foreground",
        description="Run npud in the foreground: serve DIR/npu.sock, start the configured "
        "drivers, print a line containing 'ready' once clients can connect, and exit cleanly "
        "on SIGTERM/SIGINT.",
    )
    add_runtime_dir(p)
    p.add_argument("--config", default=None, help="TOML file overlaid on the embedded defaults")
    p.add_argument("--no-drivers", action="store_true",
                   help="serve as a pure manager without starting any driver "
                   "(same as [manager] drivers = false)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from npumanager.config import Config
    from npumanager.paths import ensure_runtime_dir, manager_socket, runtime_dir
    from npumanager.service.daemon import Daemon, drivers_enabled, run
    from npumanager.service.logs import setup_logging

    cfg = Config.load(args.config)
    mcfg = cfg.section("manager")
    setup_logging(str(mcfg.get("log_format", "text")), str(mcfg.get("log_level", "info")))
    rt = ensure_runtime_dir(runtime_dir(args.runtime_dir))
    use_drivers = not args.no_drivers and drivers_enabled(cfg)

    def ready(d: Daemon) -> None:
        devices = ", ".join(x.name for x in d.drivers.devices()) or "none"
        print(f"npud ready on {manager_socket(rt)} (pid {os.getpid()}, "
              f"drivers: {devices})", flush=True)

    rc = run(cfg, rt, use_drivers=use_drivers, ready=ready)
    sys.stdout.flush()
    return rc
