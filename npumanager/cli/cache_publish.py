"""`npu cache publish MODEL`: a builder signs a compiled artifact and puts it in the fleet tier.

By default the model is compiled here, in this process, by the plugin of the
configured ``[[driver]]`` (``--driver``, default the first): the same code
and version a node's driver host runs, so the key it computes is the one a
node of the same make asks for. ``--cache-dir DIR --token HEX`` instead takes
the cache files a driver already wrote there for that app token (the builder
vouches for them: use it on a machine you trust). The entry is signed with the
builder's Ed25519 key (``--key`` or ``[fleet] signing_key``) and written to
Redis (``--redis`` or ``[fleet] redis_url``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from npumanager.cli.fmt import nbytes
from npumanager.cli.main import UsageError, add_runtime_dir, int_range


def register_publish(csub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    help_text = "sign a compiled model and publish it to the fleet cache (Redis)"
    about = __doc__.split("\n\n")[1].replace("``", "`")  # the module's reST, read as text
    c = csub.add_parser("publish", help=help_text, description=about,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_runtime_dir(c)
    c.add_argument("model", metavar="MODEL", help="the ONNX model file")
    c.add_argument("--config", metavar="FILE", default=None,
                   help="the node config (TOML) with [fleet] and [[driver]] sections "
                   "(default: the embedded defaults)")
    c.add_argument("--driver", metavar="NAME", default=None,
                   help="[[driver]] entry to compile with (default: the first)")
    c.add_argument("--key", default=None, metavar="FILE",
                   help="the builder's Ed25519 private key, PEM (default: [fleet] signing_key)")
    c.add_argument("--redis", default=None, metavar="URL",
                   help="Redis URL (default: [fleet] redis_url)")
    c.add_argument("--preference", metavar="N", type=int_range(0, 2), default=1,
                   help="NNAPI execution preference 0..2 (default 1, FAST_SINGLE_ANSWER)")
    c.add_argument("--priority", type=int, choices=(90, 100, 110), default=100,
                   help="NNAPI priority (default 100)")
    c.add_argument("--ttl", type=float, default=None, metavar="S",
                   help="expire the entry after S seconds (default: [fleet] ttl_s; 0 = never)")
    c.add_argument("--cache-dir", default=None, metavar="DIR",
                   help="publish the cache files in DIR instead of compiling")
    c.add_argument("--token", default=None, metavar="HEX",
                   help="with --cache-dir: the app's 32-byte cache token, as 64 hex digits")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=main)


def _driver_entry(cfg: Any, name: str | None) -> dict[str, Any]:
    entries: list[dict[str, Any]] = cfg.drivers()
    if not entries:
        raise UsageError("the config lists no [[driver]]")
    if name is None:
        return entries[0]
    for e in entries:
        if e.get("name") == name:
            return e
    raise UsageError(f"no [[driver]] named {name!r} (configured: "
                     f"{', '.join(str(e.get('name')) for e in entries)})")


def _cached_blobs(args: argparse.Namespace, name: str, version: str,
                  counts: tuple[int, int]) -> tuple[list[bytes], list[bytes]]:
    from npumanager.nn.cache_files import cache_file_names
    from npumanager.nn.token import driver_token

    try:
        token = bytes.fromhex(args.token or "")
    except ValueError:
        raise UsageError("--token is 64 hex digits") from None
    if len(token) != 32:
        raise UsageError("--token is 64 hex digits (a 32-byte app token)")
    dtoken = driver_token(token, name, version, args.preference, args.priority)
    model_paths, data_paths = cache_file_names(args.cache_dir, dtoken, *counts)
    return ([Path(p).read_bytes() for p in model_paths],
            [Path(p).read_bytes() for p in data_paths])


def main(args: argparse.Namespace) -> int:
    from npumanager.cache.fleet import SigningKey, seal_entry
    from npumanager.config import Config
    from npumanager.drivers.base import CompileOptions, instantiate
    from npumanager.drivers.fleet_tier import FleetConfig, build_entry, driver_identity, fleet_key

    if (args.cache_dir is None) != (args.token is None):
        raise UsageError("--cache-dir and --token go together")
    cfg = Config.load(args.config)
    fleet = FleetConfig.from_section(cfg.section("fleet"))
    key_path = args.key or fleet.signing_key
    url = args.redis or fleet.redis_url
    if not key_path:
        raise UsageError("no signing key: pass --key FILE or set [fleet] signing_key")
    if not url:
        raise UsageError("no Redis: pass --redis URL or set [fleet] redis_url")
    signer = SigningKey.load(key_path)
    model = Path(args.model).read_bytes()
    entry_cfg = _driver_entry(cfg, args.driver)
    driver, counts = instantiate(str(entry_cfg.get("plugin")), dict(entry_cfg.get("options", {})))
    if counts[0] < 1:
        raise UsageError(f"driver {entry_cfg.get('name')} does not support compilation caching")
    opts = CompileOptions(preference=args.preference, priority=args.priority)
    compile_s = 0.0
    try:
        if args.cache_dir is None:
            key, entry, compile_s = build_entry(driver, counts, model, opts, signer)
        else:
            model_blobs, data_blobs = _cached_blobs(args, str(entry_cfg.get("name")),
                                                    str(driver.version), counts)
            key = fleet_key(driver_identity(driver), model, opts, counts)
            entry = seal_entry(key, model_blobs, data_blobs, signer)
    finally:
        driver.close()
    store = FleetConfig(redis_url=url, key_prefix=fleet.key_prefix,
                        connect_timeout_s=fleet.connect_timeout_s, timeout_s=fleet.timeout_s,
                        max_entry_bytes=fleet.max_entry_bytes,
                        chunk_bytes=fleet.chunk_bytes).store()
    from npumanager.cache.fleet_store import FleetUnavailable

    try:
        store.put(key, entry, ttl_s=fleet.ttl_s if args.ttl is None else args.ttl)
    except FleetUnavailable as exc:
        print(f"npu cache: cannot publish to {url}: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    info = {"key": key.digest(), "backend": key.backend, "backend_version": key.backend_version,
            "device": key.device, "model_hash": key.model_hash, "options": dict(key.options),
            "bytes": len(entry), "signed_by": signer.key_id.hex(), "redis": url,
            "compile_s": round(compile_s, 3),
            "source": "compiled" if args.cache_dir is None else "cache files"}
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"published {key.describe()}: {nbytes(len(entry))} "
              f"({info['source']}{f' in {compile_s:.2f} s' if compile_s else ''}), "
              f"signed by {info['signed_by']}, to {url} as {store.prefix}{key.digest()}")
    return 0
