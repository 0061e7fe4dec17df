"""`npu cache ls|verify|gc|clear`: inspect and maintain a driver's compilation-cache map.

The map ((uid, token) -> keyed hash, sizes, times, hits) lives in the driver's
private state dir (``STATE/drivers/DRIVER/cache``); the cache files live in apps'
directories. ``verify`` checks the map itself (SQLite integrity, well-formed
entries); with ``--dir`` it also re-reads the files in DIR of every mapped
entry (files owned by the entry's uid: an app writes its own) and re-hashes
them with the map's key; ``gc`` applies the entry bound (and with
``--dir`` removes files there that no entry vouches for any more); ``clear``
empties the map (and with ``--dir`` removes that directory's cache files).
The map is opened for administration: its version and key are never changed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from npumanager.cli.main import UsageError, add_runtime_dir, int_range
from npumanager.words import plural

#: An NNAPI cache file name: 64 letters A..P spelling the token, 1|2, an index.
_CACHE_FILE = re.compile(r"^([A-P]{64})([12])(\d{1,2})$")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("cache", help="inspect and maintain compilation-cache maps")
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    specs = {
        "ls": "list the map's entries (token, sizes, age, hits)",
        "verify": "check the map; with --dir also re-hash the cache files found there",
        "gc": "evict least recently used entries past the bound",
        "clear": "empty the map (and with --dir delete that dir's cache files)",
    }
    for name, help_text in specs.items():
        c = csub.add_parser(name, help=help_text, description=help_text)
        add_runtime_dir(c)
        c.add_argument("--driver", metavar="NAME", default="reference",
                       help="driver name (default: reference)")
        c.add_argument(
            "--state-dir", metavar="DIR",
            default=None,
            help="root of private state (default: $NPU_STATE_DIR, /var/lib/npu as root)",
        )
        c.add_argument("--dir", metavar="DIR", default=None, help="an app's cache directory")
        c.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "gc":
            c.add_argument(
                "--max-entries", metavar="N", type=int_range(0), default=None,
                help="bound (default: [cache] config)"
            )
        c.set_defaults(func=main)
    from npumanager.cli.cache_publish import register_publish

    register_publish(csub)


def _open(args: argparse.Namespace) -> Any:
    from npumanager.cache.verifier import CacheVerifier, verifier_dir

    root = Path(args.state_dir) if args.state_dir else None
    directory = verifier_dir(args.driver, root)
    try:
        os.stat(directory)  # tells "not allowed to look" apart from "nothing there"
    except FileNotFoundError:
        pass
    return CacheVerifier(directory, None)


def _age(now: float, t: float) -> str:
    s = max(0.0, now - t)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{s / n:.1f}{unit}"
    return f"{s:.0f}s"


def _size(n: int) -> str:
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"  # pragma: no cover


def _table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        table.add_column(c, justify="left" if i == 0 or c == "status" else "right")
    for r in rows:
        table.add_row(*r)
    Console(emoji=False).print(table)


def _files_in(directory: Path) -> dict[bytes, list[Path]]:
    """Cache files in ``directory`` by the token their name spells."""
    out: dict[bytes, list[Path]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        m = _CACHE_FILE.match(name)
        if m is None:
            continue
        letters = m.group(1)
        token = bytes(
            (ord(letters[2 * i]) - 65) | ((ord(letters[2 * i + 1]) - 65) << 4) for i in range(32)
        )
        out.setdefault(token, []).append(directory / name)
    return out


def _owner(path: str | Path) -> int | None:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def _remove(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        try:
            p.unlink()
            n += 1
        except FileNotFoundError:
            pass
    return n


def cmd_ls(args: argparse.Namespace, v: Any) -> int:
    entries = v.entries()
    now = time.time()
    if args.json:
        print(
            json.dumps(
                {
                    "driver": args.driver,
                    "driver_version": v.driver_version,
                    "map": str(v.path),
                    "entries": [
                        {
                            "uid": e.uid,
                            "token": e.token.hex(),
                            "model_files": e.n_model,
                            "data_files": e.n_data,
                            "model_bytes": e.model_bytes,
                            "data_bytes": e.data_bytes,
                            "created": e.created,
                            "last_used": e.last_used,
                            "hits": e.hits,
                        }
                        for e in entries
                    ],
                },
                indent=2,
            )
        )
        return 0
    rows = [
        [
            str(e.uid),
            e.token.hex()[:16],
            f"{e.n_model}+{e.n_data}",
            _size(e.model_bytes),
            _size(e.data_bytes),
            _age(now, e.created),
            _age(now, e.last_used),
            str(e.hits),
        ]
        for e in entries
    ]
    _table(
        f"{args.driver} ({v.driver_version or 'no driver has written it yet'}): "
        f"{plural(len(entries), 'entry')} in {v.path}",
        ["uid", "token", "files", "model", "data", "age", "last used", "hits"],
        rows,
    )
    return 0


def cmd_verify(args: argparse.Namespace, v: Any) -> int:
    from npumanager.drivers.cache_io import read_cache_files
    from npumanager.errors import NpuError
    from npumanager.fds import close_fds
    from npumanager.nn.cache_files import cache_file_names

    if not args.dir:
        problems = v.check()
        n = len(v.entries()) if not problems else 0
        if args.json:
            print(json.dumps({"map": str(v.path), "ok": not problems, "entries": n,
                              "problems": problems}))
        elif problems:
            print(f"{args.driver}: the map {v.path} is damaged:")
            for p in problems:
                print(f"  {p}")
        else:
            print(f"{args.driver}: the map {v.path} is sound ({plural(n, 'entry')}). The "
                  f"cache files live in apps' directories: add --dir DIR to re-hash those in DIR.")
        return 1 if problems else 0
    results: list[tuple[int, str, str, str]] = []
    damaged = 0
    for e in v.entries():
        model, data = cache_file_names(args.dir, e.token, e.n_model, e.n_data)
        paths = model + data
        owners = {_owner(p) for p in paths} - {None}
        if not owners or e.uid not in owners:
            continue  # this entry's files live in another app's directory
        fds: list[int] = []
        status, detail = "ok", ""
        try:
            for p in paths:
                fds.append(os.open(p, os.O_RDONLY | os.O_CLOEXEC))
            bufs = read_cache_files(fds, 1 << 40)
            if not v.verify(e.token, bufs[: e.n_model], bufs[e.n_model :], uid=e.uid,
                            touch=False):
                status, detail = "DAMAGED", "hash mismatch"
        except FileNotFoundError as exc:
            status, detail = "DAMAGED", f"missing {os.path.basename(str(exc.filename))}"
        except (OSError, NpuError) as exc:
            status, detail = "DAMAGED", str(exc)
        finally:
            close_fds(fds)
        damaged += status != "ok"
        results.append((e.uid, e.token.hex()[:16], status, detail))
    if args.json:
        print(json.dumps([{"uid": u, "token": t, "status": s, "detail": d}
                          for u, t, s, d in results]))
    else:
        _table(
            f"{args.driver}: {plural(len(results), 'entry')} with files in {args.dir}, "
            f"{damaged} damaged",
            ["uid", "token", "status", "detail"],
            [[str(u), t, s, d] for u, t, s, d in results],
        )
    return 1 if damaged else 0


def cmd_gc(args: argparse.Namespace, v: Any) -> int:
    bound = args.max_entries
    if bound is None:
        from npumanager.config import Config

        bound = int(Config.load(None).section("cache").get("max_entries", v.max_entries))
    evicted = v.gc(bound)
    removed = 0
    if args.dir:
        known = {(e.uid, e.token) for e in v.entries()}
        for token, paths in _files_in(Path(args.dir)).items():
            if not any((_owner(p), token) in known for p in paths):
                removed += _remove(paths)
    if args.json:
        print(json.dumps({"evicted": evicted, "files_removed": removed, "bound": bound}))
    else:
        print(f"evicted {plural(evicted, 'entry')} (bound {bound}); removed "
              f"{plural(removed, 'orphaned file')}")
    return 0


def cmd_clear(args: argparse.Namespace, v: Any) -> int:
    dropped = v.clear()
    removed = 0
    if args.dir:
        for paths in _files_in(Path(args.dir)).values():
            removed += _remove(paths)
    if args.json:
        print(json.dumps({"cleared": dropped, "files_removed": removed}))
    else:
        print(f"cleared {plural(dropped, 'entry')}; removed {plural(removed, 'cache file')}")
    return 0


def damaged_map(args: argparse.Namespace, exc: Exception) -> int:
    """A map SQLite cannot read (garbage, truncated): its driver caches nothing while it is
    there (each save fails to open it, each prepare compiles), and the other verbs cannot
    open it either. `clear` moves it aside, for the driver to start a new one (with a new
    key: nothing the old one vouched for is trusted) at its next save; the others say so
    and fail. It said '(nothing cached yet?)' and exited 0, `clear` included."""
    from npumanager.cache.verifier import DB_NAME, verifier_dir

    path = verifier_dir(args.driver, Path(args.state_dir) if args.state_dir else None) / DB_NAME
    if args.cache_command != "clear":
        print(f"npu cache: {exc}: the map is damaged, and driver {args.driver!r} caches "
              f"nothing while it is; `npu cache clear` moves it aside", file=sys.stderr)
        return 1
    aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S')}")
    os.rename(path, aside)
    for suffix in ("-wal", "-shm"):  # SQLite's own, of the map moved aside
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    if args.json:
        print(json.dumps({"cleared": None, "damaged_map_moved_to": str(aside)}))
    else:
        print(f"the map {path} was damaged ({exc.__cause__}): moved it to {aside}; driver "
              f"{args.driver!r} starts a new one at its next cache save")
    return 0


def main(args: argparse.Namespace) -> int:
    from npumanager.errors import GeneralFailure

    if args.dir and not Path(args.dir).is_dir():
        # A mistyped DIR would otherwise read as a clean one: "0 entries with files, 0 damaged".
        raise UsageError(f"--dir {args.dir}: no such directory (an app's cache directory)")
    try:
        v = _open(args)
    except GeneralFailure as exc:
        if isinstance(exc.__cause__, sqlite3.Error):
            return damaged_map(args, exc)
        print(f"npu cache: {exc} (nothing cached yet for driver {args.driver!r}?)", file=sys.stderr)
        return 1 if args.cache_command == "verify" else 0
    except PermissionError as exc:
        print(f"npu cache: {exc} (the map is private to the driver's user)", file=sys.stderr)
        return 1
    try:
        handler = {"ls": cmd_ls, "verify": cmd_verify, "gc": cmd_gc, "clear": cmd_clear}
        return handler[args.cache_command](args, v)
    finally:
        v.close()
