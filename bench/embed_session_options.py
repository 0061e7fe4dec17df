"""What ONNX Runtime's session options do to the contention bench's embedder batch.

The embedder's model (bench/contention.py: 6 MatMul + Tanh layers, 384 wide, batch 8;
12 kernels of ~14 µs) is compiled to cache artifacts at ORT_ENABLE_ALL as the driver's
compile child does, and each variant's session is built from them as the host builds a
background session (``session_from_artifacts``: one intra-op thread), then run through
the IO binding made once that a burst's step uses (``OrtModel.bind``). Per variant, in
rounds that alternate the variants' order, two timings: back to back (a warm cache) and
after 32 MiB of writes (the contended run's cold cache after its round trip, bench/README.md
"Where the embedder's batch goes"). Reports each variant's median per round, in µs, as
median [min-max] over the rounds.

Usage: python bench/embed_session_options.py [--rounds 7] [--n 400]. Run it under
/work/notes/cpu-exclusive.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from npumanager.demo.contention import build_models
from npumanager.drivers.base import CompileOptions
from npumanager.drivers.reference import ReferenceDriver

#: Variants: name -> the reference driver's options (background sessions).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    # The same options again: the A/A spread of one variant's position in the rounds.
    "default-again": {},
    "opt-basic": {"graph_optimization_background": "basic"},
    "opt-extended": {"graph_optimization_background": "extended"},
    "opt-disabled": {"graph_optimization_background": "disabled"},
    "no-mem-arena": {"mem_arena_background": 0},
    "no-mem-pattern": {"mem_pattern_background": 0},
    "no-spinning": {"intra_op_spinning_background": 0},
}

_EVICT = np.zeros(32 << 20, np.uint8)


def evict() -> None:
    _EVICT[::64] += 1  # one write a cache line over 32 MiB


def build(options: dict[str, Any], onnx: bytes) -> Callable[[], Any]:
    driver = ReferenceDriver(options)
    bg = CompileOptions(background=True)
    # As the host: the compile child's artifacts, loaded into a background session.
    blobs = driver.compile_with_artifacts(onnx, bg).artifacts()
    model = driver.load_artifacts(*blobs, bg)
    x = build_models()["embedder"].inputs["x"]
    out = {"y": np.empty_like(x)}
    run = model.bind({"x": x}, out)  # type: ignore[attr-defined]
    assert run is not None
    for _ in range(50):
        run()
    return run  # type: ignore[no-any-return]


def per_run_us(run: Callable[[], Any], n: int, cold: bool) -> float:
    xs = []
    for _ in range(n):
        if cold:
            evict()
        t = time.perf_counter()
        run()
        xs.append(time.perf_counter() - t)
    return statistics.median(xs) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--only", default="", help="comma-separated variants: " + ", ".join(VARIANTS))
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(VARIANTS)
    onnx = build_models()["embedder"].onnx
    runs = {name: build(VARIANTS[name], onnx) for name in names}
    warm: dict[str, list[float]] = {n: [] for n in names}
    cold: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            warm[name].append(per_run_us(runs[name], args.n, False))
            cold[name].append(per_run_us(runs[name], args.n // 4, True))

    def fmt(xs: list[float]) -> str:
        return f"{statistics.median(xs):6.1f} [{min(xs):.1f}-{max(xs):.1f}]"

    print(f"embedder batch, one intra-op thread, {args.rounds} rounds (µs: median [min-max])")
    print(f"{'variant':16} {'back to back':>24} {'after 32 MiB of writes':>26}")
    for name in names:
        print(f"{name:16} {fmt(warm[name]):>24} {fmt(cold[name]):>26}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
