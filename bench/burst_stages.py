"""Where a paced burst request's time goes inside the driver: the serve, stage by stage.

bench/burst_paced.py splits a call into to seen / served / back; this splits
*served* (from the driver's thread seeing the request to its answer rung, and the
bookkeeping after it) along the marks the burst's thread takes
(drivers/burst_counters.py ``STAGES``: copy, lock, admit, to_run, run, lock2,
answer, ring, end, after), per request, p50 over the paced calls. Each
configuration is one uninterrupted paced loop (anticipation learns the pace), and
the whole set runs ``--rounds`` times alternately (machine drift hits every
configuration alike); every row pools its rounds.

Configurations per model and pace (``--configs``): ``inproc`` (ONNX Runtime
in-process, paced the same way: the baseline), ``plain`` (``model.execute``),
``burst``, ``ant`` (a burst, ``burst_anticipate_us = --anticipate``), ``burst-view`` and
``ant-view`` (the same with ``copy_outputs=False``: the outputs are views of the burst's
memory, valid until its next execution; every other row returns arrays of its own, as
in-process ONNX Runtime's run does: fresh arrays it allocated), ``burst-spin`` and
``ant-spin`` (the client spins ``--spin`` µs for the answer before blocking); with
``--against DIR`` (another source tree, e.g. a worktree of main) also ``plain@DIR``,
``burst@DIR`` and ``ant@DIR``, served by a host run from that tree in the same run
(the client side is this tree's). The work is FOREGROUND (``foreground_priority =
1000``, as a camera's under npud). CPU: per execution, the client process's and the
serving driver host's (user + system), over the paced loop.

Usage: python bench/burst_stages.py [--models tiny,gru] [--hz 30[,100,1000]]
[--calls 200] [--rounds 2] [--anticipate 300] [--configs inproc,plain,burst,ant]
[--against DIR] [--json FILE] [--cpu-marks]

``--cpu-marks`` starts the hosts with ``$NPU_BURST_CPU_MARKS`` (drivers/burst_counters.py
``CpuMarks``: ~1.6 µs more per mark) and adds, per burst configuration, each stage's
wall / on-CPU / run-queue / blocked µs (p50 each, over the same requests; blocked =
wall - CPU - run-queue per request: a futex such as the GIL or the host's lock, or a
system call that slept).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from burst_paced import driver_recent, model, paced_loop  # (bench/ is on sys.path)
from execute_overhead import pct, process_cpu, start_host

from npumanager.drivers.base import CompileOptions
from npumanager.drivers.burst_counters import CPU_MARKS_ENV, HOW, STAGES
from npumanager.drivers.reference import ReferenceDriver

US = 1e6
_FIRST = 11  # where a recent entry's stages begin (drivers/burst_counters.py)
_CPU = _FIRST + len(STAGES)  # their CPU µs, then their run-queue µs (--cpu-marks)
_RUNQ = _CPU + len(STAGES)


def p(xs: list[float], q: float) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return pct(xs, q) if xs else math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,gru")
    ap.add_argument("--hz", default="30", help="comma-separated paces")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--skip", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--anticipate", type=float, default=300.0)
    ap.add_argument("--spin", type=float, default=300.0, help="the -spin rows' spin_us")
    ap.add_argument("--against", type=Path)
    ap.add_argument("--configs", default="inproc,burst,ant")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cpu-marks", action="store_true")
    ap.add_argument("--tail", type=float, default=0.0,
                    help="also: per burst configuration, the slowest calls' split (median "
                    "over the calls at or above this latency quantile, e.g. 0.95)")
    args = ap.parse_args()
    if args.cpu_marks:
        os.environ[CPU_MARKS_ENV] = "1"  # (the hosts inherit it)
    fg = "foreground_priority = 1000\n"
    ant = fg + f"burst_anticipate_us = {args.anticipate:g}\n"
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    hosts_wanted = [(c, None, ant if c.startswith("ant") else fg) for c in wanted
                    if c in ("plain", "burst", "ant", "burst-view", "ant-view", "burst-spin",
                             "ant-spin")]
    if args.against is not None:
        tag = args.against.name
        hosts_wanted += [(f"{c}@{tag}", args.against, cfg) for c, _, cfg in list(hosts_wanted)]
    st = Path(tempfile.mkdtemp(prefix="npu-bench-st-", dir="/tmp"))
    doc: dict[str, Any] = {}
    try:
        with ExitStack() as stack:
            rts = {label: Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
                   for label, _, _ in hosts_wanted}
            for rt in rts.values():
                stack.callback(shutil.rmtree, rt, True)
            devs = {label: start_host(stack, st, cfg, tree, rts[label])
                    for label, tree, cfg in hosts_wanted}
            paces = [float(h) for h in args.hz.split(",") if h.strip()]
            for name, hz in [(m.strip(), hz) for m in args.models.split(",") if m.strip()
                             for hz in paces]:
                onnx, x = model(name)
                local = ReferenceDriver({}).compile(onnx, CompileOptions())
                remotes = {label: dev.prepare_model(onnx) for label, (dev, _) in devs.items()}
                labels = (["inproc"] if "inproc" in wanted else []) + list(devs)
                got: dict[str, dict[str, list[float]]] = {
                    label: {"lat": [], "ccpu": [], "dcpu": [], "served": [], "run_us": [],
                            **{s: [] for s in STAGES},
                            **{f"{k}:{s}": [] for s in STAGES
                               for k in ("wall", "cpu", "runq", "blocked", "how")}}
                    for label in labels}
                for _ in range(args.rounds):
                    for label in labels:
                        g = got[label]
                        if label == "inproc":
                            fn = lambda loc=local, x=x: loc.run(x)  # noqa: E731
                            for _ in range(5):
                                fn()
                            c0 = process_cpu()
                            calls = paced_loop(fn, args.calls, hz)
                            g["ccpu"].append((process_cpu() - c0) / args.calls)
                        elif label.startswith("plain"):
                            pid = devs[label][1]
                            r = remotes[label]
                            for _ in range(5):
                                r.execute(x)
                            c0, d0 = process_cpu(), process_cpu(pid)
                            calls = paced_loop(lambda r=r, x=x: r.execute(x), args.calls, hz)
                            g["ccpu"].append((process_cpu() - c0) / args.calls)
                            g["dcpu"].append((process_cpu(pid) - d0) / args.calls)
                        else:
                            pid = devs[label][1]
                            copy = not label.split("@")[0].endswith("-view")
                            spin = args.spin if label.split("@")[0].endswith("-spin") else 0
                            with remotes[label].burst(spin_us=spin) as b:
                                for _ in range(5):
                                    b.execute(x, copy_outputs=copy)
                                c0, d0 = process_cpu(), process_cpu(pid)
                                calls = paced_loop(
                                    lambda b=b, x=x, c=copy: b.execute(x, copy_outputs=c),
                                    args.calls, hz)
                                g["ccpu"].append((process_cpu() - c0) / args.calls)
                                g["dcpu"].append((process_cpu(pid) - d0) / args.calls)
                                rec = driver_recent(rts[label], b.burst_id)
                            recent = rec["recent"][-args.calls:][args.skip:]
                            if args.tail and len(recent) == len(calls[args.skip:]):
                                g.setdefault("tail", []).extend(  # type: ignore[arg-type]
                                    _split(c, r) for c, r in zip(calls[args.skip:], recent,
                                                                  strict=True))
                            print(f"  {name} {label}: " + " ".join(
                                f"{k} {rec.get(k)}" for k in (
                                    "served", "polled", "rung", "early", "late", "warms",
                                    "rehearsed", "expired",
                                    "rung_seen_p50_us")), flush=True)
                            for r in recent:
                                if r[7] is not None:
                                    g["served"].append(r[7] - r[0])
                                g["run_us"].append(r[8] / US)
                                for i, s in enumerate(STAGES):
                                    v = r[_FIRST + i] if len(r) > _FIRST + i else None
                                    g[s].append(math.nan if v is None else v / US)
                                    if len(r) - 4 > _RUNQ + i:  # (4: the window, the stamps)
                                        c, q = r[_CPU + i], r[_RUNQ + i]
                                        g[f"cpu:{s}"].append(math.nan if c is None else c / US)
                                        g[f"runq:{s}"].append(math.nan if q is None else q / US)
                                        g[f"blocked:{s}"].append(
                                            math.nan if None in (v, c, q) else (v - c - q) / US)
                                        g[f"how:{s}"].append(r[1])
                                        g[f"wall:{s}"].append(math.nan if v is None else v / US)
                        g["lat"] += [e - s for s, e in calls[args.skip:]]
                base = p(got["inproc"]["lat"], 0.5) if "inproc" in got else math.nan
                print(f"\n{name} at {hz:g} Hz, {args.rounds} x {args.calls} calls per "
                      f"configuration (first {args.skip} of each not counted), anticipate "
                      f"{args.anticipate:g} µs; µs, p50 unless named", flush=True)
                header = ("config", "p50", "p99", "added", "served", "run",
                          *STAGES, "client cpu", "driver cpu")
                rows = []
                for label in labels:
                    g = got[label]
                    p50 = p(g["lat"], 0.5)
                    cells = [label, p50 * US, p(g["lat"], 0.99) * US, (p50 - base) * US,
                             p(g["served"], 0.5) * US, p(g["run_us"], 0.5) * US,
                             *(p(g[s], 0.5) * US for s in STAGES),
                             sum(g["ccpu"]) / max(1, len(g["ccpu"])) * US,
                             sum(g["dcpu"]) / len(g["dcpu"]) * US if g["dcpu"] else math.nan]
                    doc[f"{name}/{hz:g}/{label}"] = dict(zip(header, cells, strict=True))
                    rows.append([str(cells[0])] + ["-" if math.isnan(c) else f"{c:.0f}"
                                                   for c in cells[1:]])
                widths = [max(len(r[i]) for r in [list(header), *rows])
                          for i in range(len(header))]
                for r in [list(header), *rows]:
                    print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)),
                          flush=True)
                if args.cpu_marks:
                    print("  per stage, wall / on-CPU / run-queue / blocked (µs, p50 each)")
                    for label in labels:
                        g = got[label]
                        if not g["cpu:run"]:
                            continue
                        hows = g["how:run"]
                        for how in [None, *sorted(set(hows))]:
                            n = len(hows) if how is None else hows.count(how)
                            if n < 5:
                                continue

                            def sel(k: str, how: float | None = how,
                                    g: dict[str, list[float]] = g) -> list[float]:
                                return [v for v, h in zip(g[k], g[f"how:{k.split(':')[-1]}"],
                                                          strict=True)
                                        if how is None or h == how]
                            what = "all" if how is None else HOW[int(how)]
                            print(f"  {label:>12} {what:>6} (n {n}): " + "  ".join(
                                f"{s} " + "/".join(
                                    "-" if math.isnan(v := p(sel(k), 0.5) * US) else f"{v:.0f}"
                                    for k in (f"wall:{s}", f"cpu:{s}", f"runq:{s}",
                                              f"blocked:{s}"))
                                for s in STAGES), flush=True)
                        doc[f"{name}/{hz:g}/{label}"]["split"] = {
                            s: [p(g[k], 0.5) * US for k in (f"wall:{s}", f"cpu:{s}", f"runq:{s}",
                                                              f"blocked:{s}")]
                            for s in STAGES}
                if args.tail:
                    _print_tail(got, args.tail)
                for r in remotes.values():
                    r.release()
                local.release()
    finally:
        shutil.rmtree(st, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


def _split(call: tuple[float, float], r: list[Any]) -> list[float]:
    """One paced call against its request's record: latency, call -> rung (the client's
    stamp), rung -> seen, seen -> answered (served), answered -> the call's return, then
    each stage's wall µs (and run-queue µs, with --cpu-marks); s."""
    def f(x: Any) -> float:
        return math.nan if x is None else float(x)

    t, e = call
    seen, answered, rung = f(r[0]), f(r[7]), f(r[-1])
    walls = [f(r[_FIRST + i]) / US if len(r) > _FIRST + i + 4 else math.nan
             for i in range(len(STAGES))]
    runq = [f(r[_RUNQ + i]) / US if len(r) - 4 > _RUNQ + i else math.nan
            for i in range(len(STAGES))]
    return [e - t, rung - t, seen - rung, answered - seen, e - answered, *walls, *runq]


def _print_tail(got: dict[str, dict[str, list[Any]]], q: float) -> None:
    """Where the slowest calls' time went, next to the median call's (µs)."""
    names = ["lat", "call>rung", "rung>seen", "served", "ans>back",
             *STAGES, *(f"q:{s}" for s in STAGES)]
    print(f"  the calls at or above p{q * 100:g} latency vs all calls: median of each "
          "(q:STAGE = its run-queue wait, with --cpu-marks)")
    for label, g in got.items():
        rows = g.get("tail")
        if not rows:
            continue
        cut = p([r[0] for r in rows], q)
        slow = [r for r in rows if r[0] >= cut]
        for what, sel in (("all", rows), ("slow", slow)):
            cells = [p([r[i] for r in sel], 0.5) * US for i in range(len(names))]
            print(f"  {label:>12} {what:>4} (n {len(sel)}): " + "  ".join(
                f"{n} {'-' if math.isnan(c) else f'{c:.0f}'}"
                for n, c in zip(names, cells, strict=True)), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
