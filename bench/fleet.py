"""Fleet cache tier: time to first inference on a cold node, with and without it.

A cold node has an empty driver state dir and an empty app cache dir, so the
app's prepare misses locally. For each backend with a real compile (the
reference backend, ONNX Runtime CPU; openvino and torch when their plugins are
installed and their models can be built) and each model, in the same run:

- no fleet: the driver compiles (and writes the app's cache files);
- fleet: a builder published the model with ``build_entry`` into a real
  redis-server (Unix socket) before; the node's driver fetches the entry,
  verifies it, loads it and writes the app's cache files;
- warm: the same app starting again on that node (a local cache hit), for scale.

Each is the app's wall time from ``prepare_model`` to the first outputs, best
of ``--repeat`` (a fresh app cache dir and token each time), through a real
driver host process. Verification (Ed25519 over the header + BLAKE3 over the
blobs, :func:`npumanager.cache.fleet.open_entry`) is timed in-process on the
same entry bytes and shown as a share of the fleet time to first inference.

Usage: python bench/fleet.py [--backends reference,openvino,torch] [--sizes small,medium]
[--repeat N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cache import MODELS  # bench/cache.py: the same generated models  # noqa: E402

from npumanager import nn  # noqa: E402
from npumanager.cache.fleet import SigningKey, TrustedKeys, open_entry, raw_public_key  # noqa: E402
from npumanager.drivers.base import CompileOptions  # noqa: E402
from npumanager.drivers.fleet_tier import FleetConfig, build_entry  # noqa: E402
from npumanager.testing.daemon import to_toml  # noqa: E402
from npumanager.testing.driver_host import running_driver  # noqa: E402
from npumanager.testing.redis_server import SKIP_REASON, RedisServer, redis_server_binary  # noqa: E402

MIB = 1 << 20
OPTS = CompileOptions(preference=1, priority=100)
TOKEN = b"fleet-bench-app-token-32-bytes!!"


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Minimum seconds over ``repeat`` runs (others only add time on a shared machine)."""
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


@dataclass
class Case:
    backend: str
    label: str
    data: bytes
    inputs: dict[str, np.ndarray]
    matches: Callable[[dict[str, np.ndarray]], bool]


def cases(backends: list[str], sizes: list[str]) -> list[Case]:
    """The models each backend runs: generated ONNX for reference and openvino (the MLPs
    of bench/cache.py and a conv net), a transformer block program for torch."""
    from npumanager.testing import backend_models as bm

    out: list[Case] = []
    for backend in backends:
        if backend == "torch":
            tb = bm.transformer_block(d=256, heads=8, seq=64)
            out.append(Case(backend, "transformer d=256 h=8 seq=64", tb.data, tb.inputs,
                            tb.matches))
            continue
        for size in sizes:
            onnx, x, ref = MODELS[size]()
            out.append(Case(backend, f"mlp {size}", onnx, {"x": x},
                            lambda o, ref=ref: bool(np.allclose(o["y"], ref, rtol=1e-3,
                                                                atol=1e-3))))
        conv = bm.conv_net_onnx(channels=32, size=96)
        out.append(Case(backend, "conv net c=32 96x96", conv.data, conv.inputs, conv.matches))
    return out


def available(backend: str) -> bool:
    import importlib.util

    need = {"reference": "onnxruntime", "openvino": "openvino", "torch": "torch"}[backend]
    return importlib.util.find_spec(need) is not None


class Node:
    """A cold node: a driver host with a private state dir, optionally with the fleet tier."""

    def __init__(self, backend: str, fleet: dict[str, Any] | None) -> None:
        self.backend = backend
        self.dir = Path(tempfile.mkdtemp(prefix=f"npu-bench-{backend}-", dir="/tmp"))
        self.rt, self.state = self.dir / "rt", self.dir / "state"
        self.rt.mkdir()
        self.state.mkdir()
        cfg: dict[str, Any] = {"driver": [{"name": backend, "plugin": backend}]}
        if fleet:
            cfg["fleet"] = fleet
        self.config = self.dir / "node.toml"
        self.config.write_text(to_toml(cfg))
        self._ctx = running_driver(backend, self.rt, self.state, config=self.config,
                                   args=["--no-enforce-admission"], timeout=120)

    def __enter__(self) -> Node:
        self._ctx.__enter__()
        self.dev = nn.device(self.backend, self.rt)
        return self

    def warm_up(self, case: Case) -> None:
        """One prepare of another model first: the driver process's one-time costs (first
        session, thread pools) are not what a cold *cache* costs."""
        self.dev.prepare_model(case.data).release()

    def __exit__(self, *exc: object) -> None:
        self.dev.close()
        self._ctx.__exit__(None, None, None)
        shutil.rmtree(self.dir, ignore_errors=True)

    def first_inference(self, case: Case, app: Path | None = None) -> tuple[Path, bool, bool]:
        """prepare (with an app cache dir) + one execute; (app dir, from cache, from fleet)."""
        if app is None:
            app = Path(tempfile.mkdtemp(prefix="app-", dir=self.dir))
        model = self.dev.prepare_model(case.data, cache_dir=app, token=TOKEN)
        try:
            if not case.matches(model.execute(case.inputs)):
                raise AssertionError(f"{case.backend} {case.label}: wrong outputs")
            return app, bool(model.loaded_from_cache), bool(getattr(model, "loaded_from_fleet",
                                                                     False))
        finally:
            model.release()


def warm_up_case(backend: str) -> Case:
    from npumanager.testing import backend_models as bm

    m = bm.torch_linear(99) if backend == "torch" else bm.onnx_linear(99)
    return Case(backend, "warm-up", m.data, m.inputs, m.matches)


def builder_driver(backend: str, work: Path) -> Any:
    from npumanager.drivers.base import instantiate

    opts: dict[str, Any] = {"state_dir": str(work / "builder")} if backend == "torch" else {}
    return instantiate(backend, opts)


def run(backends: list[str], sizes: list[str], repeat: int) -> list[str]:
    signer = SigningKey.generate()
    trusted = TrustedKeys([signer.public_key])
    rows = []
    work = Path(tempfile.mkdtemp(prefix="npu-bench-fleet-", dir="/tmp"))
    try:
        with RedisServer() as redis:
            fleet = {"redis_url": redis.url,
                     "trusted_keys": [raw_public_key(signer.public_key)]}
            store = FleetConfig(redis_url=redis.url).store()
            for backend in backends:
                todo = cases([backend], sizes)
                builder, counts = builder_driver(backend, work)
                published = []
                for case in todo:
                    key, entry, secs = build_entry(builder, counts, case.data, OPTS, signer)
                    store.put(key, entry)
                    published.append((case, key, entry))
                    print(f"  {backend} {case.label}: built in {secs:.2f} s, published "
                          f"{len(entry) / MIB:.1f} MiB", file=sys.stderr)
                builder.close()
                # Torch compiles take many seconds: one of each is enough.
                n = 1 if backend == "torch" else repeat
                with Node(backend, None) as plain, Node(backend, fleet) as node:
                    warm = warm_up_case(backend)
                    plain.warm_up(warm)
                    node.warm_up(warm)
                    for case, key, entry in published:
                        rows.append(measure(case, key, entry, plain, node, store, trusted, n))
                        print(f"  {backend} {case.label}: done", file=sys.stderr)
            store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def measure(case: Case, key: Any, entry: bytes, plain: Node, node: Node, store: Any,
            trusted: TrustedKeys, repeat: int) -> str:
    t_plain, (_, c0, f0) = best(lambda: plain.first_inference(case), repeat)
    t_fleet, (app, c1, f1) = best(lambda: node.first_inference(case), repeat)
    t_warm, (_, c2, f2) = best(lambda: node.first_inference(case, app), repeat)
    if c0 or f0 or not (c1 and f1) or not c2 or f2:
        raise AssertionError(f"{case.backend} {case.label}: unexpected cache outcome: "
                             f"plain {(c0, f0)}, fleet {(c1, f1)}, warm {(c2, f2)}")
    t_get, _ = best(lambda: store.get(key), repeat)
    t_verify, _ = best(lambda: open_entry(entry, key, trusted), repeat)
    t_sig = _signature_only(entry, key, trusted, repeat)
    return (f"| {case.backend} | {case.label} | {len(entry) / MIB:.1f} | {t_plain:.3f} | "
            f"{t_fleet:.3f} | {t_plain / t_fleet:.2f}x | {t_warm:.3f} | {t_get * 1000:.1f} | "
            f"{t_verify * 1000:.2f} ({t_sig * 1000:.2f}) | {t_verify / t_fleet:.1%} |")


def _signature_only(entry: bytes, key: Any, trusted: TrustedKeys, repeat: int) -> float:
    """The Ed25519 part of verification alone: an entry with its blobs cut off is refused
    right after the signature check (its blob byte count), so timing that isolates it."""
    from npumanager.cache import fleet as f

    hlen = int.from_bytes(entry[24:28], "big")
    head = entry[: 28 + hlen + f.SIGNATURE_BYTES]

    def check() -> None:
        try:
            open_entry(head, key, trusted)
        except f.FleetRefused as exc:
            assert "blob bytes" in exc.reason, exc.reason

    t, _ = best(check, repeat)
    return t


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backends", default="reference,openvino,torch")
    p.add_argument("--sizes", default="small,medium", help="MLPs of bench/cache.py")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if redis_server_binary() is None:
        print(SKIP_REASON, file=sys.stderr)
        return 1
    backends = [b for b in args.backends.split(",") if b and available(b)]
    rows = run(backends, [s for s in args.sizes.split(",") if s], args.repeat)
    print(f"Fleet cache tier: time to first inference on a cold node (prepare + first "
          f"execute, through a driver host), {os.cpu_count()} CPUs, best of {args.repeat} "
          "(torch: 1); Redis on a Unix socket on this machine\n")
    print("| backend | model | entry MiB | no fleet s (compile) | fleet s | speed-up | "
          "warm local s | Redis get ms | verify ms (Ed25519 part) | verify share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nverify: Ed25519 over the entry header + BLAKE3 of every blob (open_entry); "
          "verify share: its share of the fleet time to first inference.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
