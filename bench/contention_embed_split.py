"""Where the managed embedder's batches go: each batch paired with the driver's record of
its burst request, as ``bench/contention.py --frame-split`` pairs the camera's frames
(demo/contention_split.py), and split into call->rung, rung->seen, served (by stage:
``run`` is ONNX Runtime's) and answered->back; per phase the median batch, the slowest
10 % and the worst three. The driver keeps its last requests' records, fetched once after
each phase, so the split covers the phase's last ~2000 batches.

Usage: python bench/contention_embed_split.py [--full] [RUN,...] (runs: managed, or
bench/contention.py's VARIANTS; quick phases unless --full). Measured with it: README,
"Where the embedder's batch goes".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from contention import VARIANTS

from npumanager.demo import contention_probe
from npumanager.demo import contention_split as cs
from npumanager.demo.contention import (
    UIDS,
    RunResult,
    Timing,
    build_models,
    driver_config,
)


class EmbedSplit(cs.SplitRun):
    """A managed run whose split is the embedder's batches, not the camera's frames."""

    def phase(self, name: str, seconds: float) -> None:
        super(cs.SplitRun, self).phase(name, seconds)
        if not self.managed or name not in self.phases:
            return
        with contextlib.suppress(Exception):  # (the split must not end the run)
            from npumanager.hal.wire import SERVICE
            from npumanager.wire.client import SyncRpcClient

            rpc = SyncRpcClient(contention_probe.driver_socket(self.rt), SERVICE,
                                client_name="contention embed split")
            try:
                payload, _ = rpc.call("device.stats", b"recent")
            finally:
                rpc.close()
            self.records[name] = cs.camera_records(
                json.loads(payload), UIDS["embedder"] if self.root else None)

    def collect(self, r: RunResult) -> None:
        super(cs.SplitRun, self).collect(r)
        batches = self.events.find("embedder", "batch")
        for name, (a, b) in self.windows.items():
            mine = [(e["t"], e["ms"]) for e in batches if a <= e["t"] < b]
            self.frame_split[name] = cs.summarize(
                cs.split(mine, self.records.get(name, [])), q=0.9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="?", default="managed")
    ap.add_argument("--full", action="store_true", help="full-length phases")
    args = ap.parse_args()
    models = build_models()
    for name in args.runs.split(","):
        knobs: dict[str, Any] = dict(VARIANTS[name])
        run = EmbedSplit(name, True, Timing() if args.full else Timing.quick(), models,
                         driver_config(**knobs), log=lambda m: None)
        r = run.run()
        print(f"{name}: embedder {r.embedder_items_s:.0f} items/s, LLM "
              f"{r.llm_tokens_s:.0f} tokens/s")
        for phase, sp in run.frame_split.items():
            print("\n".join(cs.format_split(f"{name} embedder", phase, sp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
