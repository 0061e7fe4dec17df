"""Entry point of `npu`: each subcommand lives in its own module with ``register``.

Subcommand modules import heavy dependencies (onnxruntime, rich) inside their
functions so `npu status` starts fast.

Exit codes, the same for every command: 0 success, 1 a runtime failure (npud
refused or is absent, a file could not be read), 2 a usage error (a bad flag,
value or name: argparse's own errors and :class:`UsageError`), 130 interrupted.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from npumanager.errors import NpuError
from npumanager.version import __version__

# Module names under npumanager.cli, in the order `npu --help` lists them.
COMMANDS = [
    "serve", "status", "top", "trace", "policy", "importance", "thermal", "cache",
    "driver", "run", "demo", "bench", "chaos",
]

EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """The command was called wrongly (a bad value, a missing argument): exit 2."""


RUNTIME_DIR_HELP = ("directory of npu.sock and drivers/ (default: $NPU_RUNTIME_DIR, /run/npu "
                    "as root, else $XDG_RUNTIME_DIR/npu)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npu",
        description="npumanager: arbitrate an NPU between the ML workloads of a machine.",
        epilog="Every command takes --runtime-dir before or after its name. Exit status: "
        "0 ok, 1 failure, 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"npumanager {__version__}")
    # The top level owns the default; every subcommand repeats the flag with SUPPRESS so
    # `npu --runtime-dir X status` and `npu status --runtime-dir X` both work (a subparser
    # default would otherwise overwrite the value given before the command name).
    parser.add_argument("--runtime-dir", metavar="DIR", default=None, help=RUNTIME_DIR_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"npumanager.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"npumanager.cli.{name}":
                continue  # not built yet
            raise
        mod.register(sub)
    return parser


def add_runtime_dir(p: argparse.ArgumentParser) -> None:
    """Every command takes --runtime-dir (default: $NPU_RUNTIME_DIR, then the platform's)."""
    p.add_argument("--runtime-dir", metavar="DIR", default=argparse.SUPPRESS,
                   help=RUNTIME_DIR_HELP)


def int_range(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for an integer in ``lo..hi`` (a usage error otherwise)."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{n} is out of range ({want})")
        return n

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    if x > threading.TIMEOUT_MAX:  # every one is a wait: 1e12 was an OverflowError traceback
        raise argparse.ArgumentTypeError(f"{text} s is longer than a wait can be "
                                         f"(at most {threading.TIMEOUT_MAX:.0f} s)")
    return x


positive_float.__name__ = "number"


def check_can_write(path: str | os.PathLike[str], flag: str) -> None:
    """UsageError unless a file could be created at ``path`` (its nearest existing ancestor a
    directory this process may write): said before a command spends its time, not after."""
    probe = Path(path).absolute().parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{flag} {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {probe} is not writable")


def check_runtime_dir(path: str | None) -> None:
    """UsageError where --runtime-dir names something that is not a directory: most often
    npu.sock itself, typed for the directory that holds it (the command would otherwise
    say "cannot connect to .../npu.sock/npu.sock: Not a directory", or npu serve advise
    removing it while an npud serves it)."""
    if path is None or not os.path.lexists(path) or os.path.isdir(path):
        return
    from npumanager.paths import not_a_directory

    raise UsageError(f"--runtime-dir {path} {not_a_directory(path)}")


def _quiet_broken_pipe() -> None:
    """`npu status | head`: the reader left. Point stdout at /dev/null so the interpreter's
    final flush does not raise again (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _stacks_on_sigusr1() -> None:
    """`kill -USR1` writes every thread's stack to stderr (npud's and a driver host's end
    up in their log) instead of ending the process: how a stuck one tells where it is."""
    if signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        # fd 2, not sys.stderr: main() also runs in-process, under a replaced sys.stderr.
        faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)


def _quiet_runtime_dir_fallback() -> None:
    """Without $XDG_RUNTIME_DIR (`runuser`, `sudo -u`, cron, a container) platformdirs
    warns, with its own source line, before every command; the fallback it takes is named
    in any message about the socket, so the user is told once, in one line, where it matters."""
    warnings.filterwarnings("ignore", message=r"XDG_RUNTIME_DIR ")


def main(argv: Sequence[str] | None = None) -> int:
    _stacks_on_sigusr1()
    _quiet_runtime_dir_fallback()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse's own error, unless the command hands them on (`npu bench NAME ...`)
        if not hasattr(args, "passed_on"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.passed_on = extra
    func: Callable[[argparse.Namespace], Any] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    cmd = args.command
    try:
        if cmd != "serve":  # npu serve refuses it itself: exit 1 (API.md), the same words
            check_runtime_dir(getattr(args, "runtime_dir", None))
        rc = func(args)
        sys.stdout.flush()
    except UsageError as exc:
        print(f"npu {cmd}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NpuError as exc:
        print(f"npu {cmd}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        _quiet_broken_pipe()
        return EXIT_FAILURE
    except OSError as exc:  # a file the user named: missing, a directory, not readable
        what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        print(f"npu {cmd}: {what}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    return int(rc or 0)
