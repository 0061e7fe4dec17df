"""Where the voice assistant's executions go: the first of each burst against the others,
unmanaged and managed, with a kernel scheduler trace (voice29).

bench/contention.py's voice app runs bursts of 8 executions 30 ms apart every 0.7 s. For
each row named (default: ``unmanaged`` and ``default-auto``) this runs the bench's apps
(alone, then contended; no loading phase) under ``perf record -a`` of sched_switch and
sched_wakeup (bench/contention_trace.py's TraceRun, Timeline), then splits the voice's
executions by their place in a burst (``first``: after the 0.7 s pause; ``rest``: 30 ms
after the previous one) and reports, per group:

* latency p50 / p90 / p99 / max;
* ``wait-app``: run-queue wait of the voice app's threads within the execution (runnable,
  not running); managed also ``wait-burst``: of the host's thread that serves the voice's
  burst (the host thread the voice's threads wake most);
* ``oncpu``: CPU time the voice's threads (and its burst thread) had within it: a cold
  path shows as more CPU for the same work;
* managed, the driver's record of the request (drivers/burst_counters.py ``recent``):
  ``rung>seen`` (the burst thread's wake-up), ``run`` (ONNX Runtime's run), ``back``
  (the answer until the app had it);
* ``bk:X``: the same for the app's wait between the driver's answer and the app's return
  (``wait-back``), and the burst thread's stages after the answer (``ring``, ``end``,
  ``after``: drivers/burst_counters.py);
* ``blk:X``: who ran on the CPU a waiting voice thread (app or burst) then got, while it
  waited, by class (the camera's app and burst threads, the embedder's, the LLM's
  steps, ...), mean ms per execution;

and the policy / nice of the threads involved, as sampled. Usage: python
bench/contention_voice.py [--rows unmanaged,default-auto] [--contended-s 20] [--keep DIR].
Run it under /work/notes/cpu-exclusive (the trace costs a few %)."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from contention import run_args
from contention_trace import Timeline, TraceRun, peers, read_trace

from npumanager.demo.contention import UIDS, Timing, build_models, camera_cell
from npumanager.demo.contention_split import split

#: An execution that comes this long after the previous one starts a burst.
NEW_BURST_S = 0.3


class VoiceTraceRun(TraceRun):
    """TraceRun for either kind of run (unmanaged: no driver records)."""

    def burst_records(self) -> list[dict[str, Any]]:
        return super().burst_records() if self.managed else []


def positions(events: list[tuple[float, float]]) -> list[int]:
    """Each execution's place in its burst (0: first), from the times the app reported."""
    out, prev, k = [], -math.inf, 0
    for t, ms in events:
        start = t - ms / 1e3
        k = 0 if start - prev > NEW_BURST_S else k + 1
        out.append(k)
        prev = t
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] if s else math.nan


def analyse(run: VoiceTraceRun, keep: str) -> dict[str, Any]:
    phase = "contended"
    switches, wakes = read_trace(os.path.join(keep, f"{phase}.data"))
    tl = Timeline(switches, wakes)
    threads = run.threads
    a, b = run.windows[phase]
    kinds = {t: v[1] for t, v in threads.items()}
    tids = {app: {t for t, k in kinds.items() if k == app} for app in UIDS}
    host = {t for t, k in kinds.items() if k == "host"}

    def burst_of(app: str) -> int | None:
        # (both ways: a stream its burst thread anticipates rarely wakes it, and an app
        # its FIFO burst thread preempted is answered without a wake-up)
        woken = peers(wakes, tids[app])
        back = {t: n for t, n in peers(wakes, host).items() if t in tids[app]}
        woke = defaultdict(int)
        for _, tid, waker in wakes:
            if tid in back and waker in host:
                woke[waker] += 1
        score = {t: woken.get(t, 0) + woke.get(t, 0) for t in host}
        return max(score, key=lambda t: score[t], default=None) if score else None

    bursts = {app: burst_of(app) for app in ("camera", "voice", "embedder")} \
        if run.managed else {}
    label = {t: f"{app}-burst" for app, t in bursts.items() if t}

    def classify(tid: int) -> str:
        if tid == 0:
            return "idle"
        if tid in label:
            return label[tid]
        v = threads.get(tid)
        if v is None:
            return "outside"
        kind, pol, nice, comm = v[1], v[2], v[3], v[4]
        if kind == "host":
            if comm.startswith("npu-bg"):
                return "host-bgstep"
            return f"host-{pol}{nice}"
        return kind

    recs = [r for x in run.recent.get(phase, []) if x.get("uid") == UIDS["voice"]
            for r in x.get("recent", [])]
    ev = [(e["t"], e["ms"]) for e in run.events.find("voice", "infer")]
    pos = positions(ev)
    rows = []
    vburst = bursts.get("voice")
    for (t, ms), k in zip(ev, pos, strict=True):
        if not a <= t < b:
            continue
        s = t - ms / 1e3
        row: dict[str, float] = {"k": k, "ms": ms, "wait-app": 0.0, "wait-burst": 0.0}
        for who, ts in (("wait-app", tids["voice"]), ("wait-burst", {vburst} if vburst
                                                       else set())):
            for tid in ts:
                for w0, w1, cpu in tl.waited(tid, s, t):
                    row[who] += (w1 - w0) * 1e3
                    for t2, d in tl.ran(w0, w1, [cpu]).items():
                        c = "blk:" + classify(t2)
                        row[c] = row.get(c, 0.0) + d * 1e3
        ran = tl.ran(s, t)
        row["oncpu"] = sum(d for tid, d in ran.items()
                           if tid in tids["voice"] or tid == vburst) * 1e3
        got = split([(t, ms)], recs) if recs else []
        if got:
            for key in ("rung>seen", "run", "back", "answer", "ring", "end", "after"):
                row[key] = got[0][key]
            # The answer until the app had it: who had the CPU the app's thread waited for.
            answered = t - got[0]["back"] / 1e3
            for tid in tids["voice"]:
                for w0, w1, cpu in tl.waited(tid, answered, t):
                    row["wait-back"] = row.get("wait-back", 0.0) + (w1 - w0) * 1e3
                    for t2, d in tl.ran(w0, w1, [cpu]).items():
                        c = "bk:" + classify(t2)
                        row[c] = row.get(c, 0.0) + d * 1e3
        rows.append(row)
    pols = {f"{name} {tid}": threads.get(tid, ("", "", "?", "?", "?"))[2:]
            for name, tid in [*((f"{app}-burst", t) for app, t in bursts.items()),
                              *((f"{app}-app", t) for app in ("voice", "camera", "embedder")
                                for t in sorted(tids[app]))] if tid}
    return {"rows": rows, "threads": pols}


def report(name: str, got: dict[str, Any]) -> list[str]:
    rows = got["rows"]
    keys = ["wait-app", "wait-burst", "oncpu", "rung>seen", "run", "back", "wait-back",
            "answer", "ring", "end", "after"]
    blk = sorted({k for r in rows for k in r if k.startswith(("blk:", "bk:"))})
    lines = [f"{name}: {len(rows)} executions"]
    slow = sorted(rows, key=lambda r: -r["ms"])[:max(1, len(rows) // 20)]
    groups = {"first": [r for r in rows if r["k"] == 0],
              "rest": [r for r in rows if r["k"] > 0],
              "slow5%": slow}
    for g, sel in groups.items():
        if not sel:
            continue
        ms = [r["ms"] for r in sel]

        def mean(k: str, sel: list[dict[str, float]] = sel) -> str:
            xs = [r[k] for r in sel if k in r and not math.isnan(r[k])]
            return f"{sum(xs) / len(xs):.3f}" if xs else "-"

        firsts = sum(1 for r in sel if r["k"] == 0)
        lines.append(f"  {g:7} n {len(sel):4d} (first {firsts:3d})  ms p50 {pct(ms, .5):.2f} "
                     f"p90 {pct(ms, .9):.2f} p99 {pct(ms, .99):.2f} max {max(ms):.2f}")
        lines.append("          mean ms: " + "  ".join(f"{k} {mean(k)}" for k in keys))
        blks = [(k, sum(r.get(k, 0.0) for r in sel) / len(sel)) for k in blk]
        blks = [(k, v) for k, v in sorted(blks, key=lambda x: -x[1]) if v >= 0.005]
        if blks:
            lines.append("          waited behind (mean ms): "
                         + "  ".join(f"{k} {v:.3f}" for k, v in blks))
    lines.append("  threads (policy, nice, name): " + "; ".join(
        f"{k}: {v[0]}/{v[1]} {v[2]}" for k, v in got["threads"].items()))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="unmanaged,default-auto")
    ap.add_argument("--contended-s", type=float, default=20.0)
    ap.add_argument("--keep", default="")
    args = ap.parse_args()
    timing = Timing(alone_s=2.0, contended_s=args.contended_s, loading_s=0.0, settle_s=0.6)
    models = build_models()
    out: list[str] = []
    t0 = time.monotonic()
    for name in [n.strip() for n in args.rows.split(",") if n.strip()]:
        keep = os.path.join(args.keep or tempfile.mkdtemp(prefix="npu-voice-"), name)
        os.makedirs(keep, exist_ok=True)
        managed, cfg, kwargs = run_args(name)
        run = VoiceTraceRun(name, managed, timing, models, cfg, phases=("alone", "contended"),
                            keep=keep, log=lambda m: print(
                                f"  [{time.monotonic() - t0:5.1f}s] {m}", file=sys.stderr,
                                flush=True), **kwargs)
        r = run.run()
        out.append(f"\n{name}: camera alone {camera_cell(r.camera.get('alone'))}; contended "
                   f"{camera_cell(r.camera.get('contended'))}; voice p50/p99 "
                   f"{r.voice.pct(.5):.2f} / {r.voice.pct(.99):.2f} ms; LLM "
                   f"{r.llm_tokens_s:.0f} tok/s, embedder {r.embedder_items_s:.0f} items/s")
        out += report(name, analyse(run, keep))
        print("\n".join(out[-12:]), flush=True)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
