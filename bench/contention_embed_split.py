"""Where the managed embedder's batches go: each batch paired with the driver's record of
its burst request, as ``bench/contention.py --frame-split`` pairs the camera's frames
(demo/contention_split.py), and split into call->rung, rung->seen, served (by stage:
``run`` is ONNX Runtime's) and answered->back; per phase the median batch, the slowest
10 % and the worst three. The driver keeps its last requests' records, fetched once after
each phase, so the split covers the phase's last ~2000 batches.

``--cpu-marks`` starts the host with ``$NPU_BURST_CPU_MARKS`` (drivers/burst_counters.py)
and prints, per phase, the medians of each stage's CPU time and run-queue wait beside its
wall time: whether a stage ran slowly or waited (meaningful for stages on the burst's own
thread: with background_burst_here, ``run`` is ONNX Runtime's run there; by default it is
the wait for the lowered worker).

Usage: python bench/contention_embed_split.py [--full] [--cpu-marks] [RUN,...] (runs:
managed, or bench/contention.py's VARIANTS; quick phases unless --full). Measured with
it: bench/README.md, "Where the embedder's batch goes".
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from contention import SECOND_HOST, VARIANTS, npud_config
from contention_second_host import embedder_knobs

from npumanager.demo import contention_split as cs
from npumanager.demo.contention import (
    Timing,
    build_models,
)
from npumanager.drivers import burst_counters as bc


def cpu_split(records: list[list[float | None]]) -> dict[str, tuple[float, float, float]]:
    """Per stage, the median (wall, CPU, run-queue wait) µs of the records that carry CPU
    marks (``$NPU_BURST_CPU_MARKS``); empty without them."""
    n = len(bc.STAGES)
    first, tail = 11, 4  # (burst_counters: where the stages begin; the entry's tail)
    marked = [r for r in records if len(r) - tail >= first + 3 * n]

    def med(i: int) -> float:
        xs = sorted(float(v) for r in marked if (v := r[i]) is not None and v == v)
        return xs[len(xs) // 2] if xs else math.nan

    if not marked:
        return {}
    return {name: (med(first + k), med(first + n + k), med(first + 2 * n + k))
            for k, name in enumerate(bc.STAGES)}


class EmbedSplit(cs.SplitRun):
    """A managed run whose split is the embedder's batches, not the camera's frames,
    with each phase's CPU marks per stage."""

    split_app = "embedder"
    split_event = "batch"
    split_q = 0.9

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stage_cpu: dict[str, dict[str, tuple[float, float, float]]] = {}

    def phase(self, name: str, seconds: float) -> None:
        super().phase(name, seconds)
        if name in self.records:  # (fetched by the split for this phase)
            self.stage_cpu[name] = cpu_split(self.records[name])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="?", default="managed")
    ap.add_argument("--full", action="store_true", help="full-length phases")
    ap.add_argument("--cpu-marks", action="store_true",
                    help="also each stage's CPU time and run-queue wait (medians)")
    args = ap.parse_args()
    if args.cpu_marks:
        os.environ[bc.CPU_MARKS_ENV] = "1"  # (npud's driver hosts inherit it)
    models = build_models()
    for name in args.runs.split(","):
        knobs: dict[str, Any] = dict(VARIANTS[name])
        # Rows with apps on a second host and the camera's thread at FIFO (rt+app+bg-own-host
        # and its +* rows): the same devices and camera as bench/contention.py gives them.
        cam_rt = int(knobs.pop("camera_realtime", 0))
        embedder = embedder_knobs(knobs)  # (its spin)
        devices = {app: SECOND_HOST for app in knobs.get("own_host", [])}
        cfg = npud_config(knobs)
        if cam_rt:
            cfg["manager"]["app_rt_priority"] = cam_rt
        run = EmbedSplit(name, True, Timing() if args.full else Timing.quick(), models,
                         cfg, log=lambda m: None, devices=devices,
                         app_knobs={**({"camera": {"realtime": cam_rt}} if cam_rt else {}),
                                    **({"embedder": embedder} if embedder else {})})
        r = run.run()
        print(f"{name}: embedder {r.embedder_items_s:.0f} items/s, LLM "
              f"{r.llm_tokens_s:.0f} tokens/s")
        for phase, sp in run.frame_split.items():
            print("\n".join(cs.format_split(f"{name} embedder", phase, sp)))
            by = run.stage_cpu.get(phase)
            if by:
                print("   wall / CPU / run-queue (µs, medians): " + "  ".join(
                    f"{k} {w:.0f}/{c:.0f}/{q:.0f}" for k, (w, c, q) in by.items()
                    if not math.isnan(w)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
