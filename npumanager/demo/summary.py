"""The demo's closing tables (all from measured events) and its `npu status` excerpts."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from npumanager.demo.observe import EventLog, HalObserver
from npumanager.demo.render import Renderer, fmt_ms, percentile
from npumanager.words import plural

if TYPE_CHECKING:
    from npumanager.demo.apps import AppSpec
    from npumanager.demo.cast import DemoOptions, Run

_SIZE = {"LESS_THAN_1GB": "<1GB", "BETWEEN_1GB_AND_2GB": "1-2GB", "GREATER_THAN_2G": ">2GB"}


def status_excerpt(dump: Mapping[str, Any], names: Mapping[int, str]) -> list[str]:
    """npud's own view (what `npu status` shows): budget, thermal, each live request."""
    budget = dump.get("budget", {})
    thermal = dump.get("thermal", {})
    lines = [f"npu status: budget {budget.get('used')}/{budget.get('thermal_scaled')} used, "
             f"thermal {thermal.get('status')}"
             + (" (override)" if thermal.get("overridden") else "")]
    for r in dump.get("requests", []):
        who = names.get(int(r.get("uid", -1)), f"uid {r.get('uid')}")
        lines.append(f"  {who:<9} request {r.get('request_id')}: {r.get('state'):<16} "
                     f"{_SIZE.get(str(r.get('size')), r.get('size')):>5} "
                     f"{r.get('priority')!s:<10} rank {r.get('rank')}")
    return lines


def _phase_rows(log: EventLog, run: Run) -> list[list[str]]:
    rows = []
    for ph in run.phases:
        lat = [e["ms"] for e in log.find("camera", "frame", after=ph.t0)
               if ph.t1 is None or e["t"] <= ph.t1]
        if not lat:
            continue
        span = ((ph.t1 or lat[-1]) - ph.t0) or 1.0
        rows.append([ph.name, str(len(lat)), f"{len(lat) / span:.1f}",
                     fmt_ms(percentile(lat, 50)), fmt_ms(percentile(lat, 99)),
                     fmt_ms(max(lat))])
    frames = log.find("camera", "frame")
    if frames:
        lat = [e["ms"] for e in frames]
        span = (frames[-1]["t"] - frames[0]["t"]) or 1.0
        rows.append(["every frame of the run", str(len(lat)), f"{len(lat) / span:.1f}",
                     fmt_ms(percentile(lat, 50)), fmt_ms(percentile(lat, 99)),
                     fmt_ms(max(lat))])
    return rows


def _cache_rows(log: EventLog) -> list[list[str]]:
    rows = []
    for app in ("llm", "camera", "embedder", "voice"):
        preps = log.find(app, "prepared")
        if not preps:
            continue
        compiled = [p["ms"] for p in preps if not p["from_cache"]]
        cached = [p["ms"] for p in preps if p["from_cache"]]
        first = fmt_ms(compiled[0]) if compiled else "-"
        later = ", ".join(fmt_ms(c) for c in cached) or "-"
        speed = f"{compiled[0] / min(cached):.1f}x" if compiled and cached else "-"
        rows.append([app, preps[0]["model"], str(len(preps)), first, later, speed])
    return rows


def print_summary(out: Renderer, log: EventLog, run: Run, hal: HalObserver | None,
                  specs: Mapping[str, AppSpec], total_s: float, own_npud: bool = True
                  ) -> None:
    out.scene(0, 0, "Summary", "Measured in this run.")
    # One decode step of the LLM while it ran alone: a frame that arrives while a step runs
    # waits for that step (the driver yields the channel only between steps).
    first_camera = min((e["t"] for e in log.find("camera", "request")), default=None)
    alone = [e["ms"] / e["steps"] for e in log.find("llm", "decode")
             if e["steps"] and (first_camera is None or e["t"] < first_camera)]
    step = percentile(alone, 50)
    out.table("Camera frame latency (burst execute round trip, 30 fps target)",
              ["phase", "frames", "fps", "p50", "p99", "max"], _phase_rows(log, run),
              caption="Steady-state windows; the last row also counts the moments when other "
              "models compile or load (CPU work on this machine)."
              + ("" if step is None else f" One llm decode step alone takes {fmt_ms(step)}; "
                 "the driver hands the channel to a waiting frame at the next step boundary, "
                 f"the rest is {os.cpu_count()} CPU cores shared by every process."))

    asks = Counter(e["reason"] for e in log.find(ev="unload_asked"))
    ignored = len(log.find(ev="unload_asked", pred=lambda e: not e["comply"]))
    completes = Counter(e["status"] for e in log.find(ev="complete"))
    grants = [e["ms"] for e in log.find(ev="can_load", pred=lambda e: e["status"] ==
                                        "CAN_LOAD_NOW")]
    decodes = log.find("llm", "decode")
    tokens = sum(int(e["steps"]) for e in decodes)
    rows = [["grants (CAN_LOAD_NOW)", f"{len(grants)}, ask->grant p50 "
             f"{fmt_ms(percentile(grants, 50))}"]]
    for reason in ("PREEMPTED", "THERMAL", "FAIRNESS", "MEMORY_PRESSURE", "ADMIN",
                   "POLICY_CHANGED"):
        if asks.get(reason):
            rows.append([f"unload requests: {reason}", str(asks[reason])])
    rows.append(["unload requests ignored", str(ignored)])
    rows.append(["requests ended REVOKED", str(completes.get("REVOKED", 0))])
    rows.append(["execute -> GrantRevoked", str(len(log.find(ev="execute_revoked")))])
    rows.append(["requests ended COMPLETE", str(completes.get("COMPLETE", 0))])
    if hal is not None:
        uid = specs["llm"].uid
        rows.append(["llm work PAUSED / RESUMED (HAL)",
                     f"{hal.count(uid, 'ended', 'PAUSED')} / "
                     f"{hal.count(uid, 'started', 'RESUMED')}"])
    rows.append(["llm tokens decoded", f"{tokens} in {plural(len(decodes), 'multi-step job')}"])
    out.table("What npud and the driver did", ["", "count"], rows)

    out.table("Compilation cache (prepare_model with cache_dir + token)",
              ["app", "model", "prepares", "first (compile)", "later (from cache)", "speedup"],
              _cache_rows(log))
    out._print("")
    for s in run.skipped:
        out.note(f"not shown: {s}", "yellow")
    if run.failures:
        out.warn("did not happen: " + "; ".join(run.failures))
    out.note(f"demo ran {total_s:.1f} s." + (
        " To watch npud yourself: `npu serve --runtime-dir /tmp/npu` in one terminal, then "
        "`npu status --runtime-dir /tmp/npu` (or `npu demo --runtime-dir /tmp/npu`) in "
        "another." if own_npud else ""), "")


def write_outputs(rec: Any, opts: DemoOptions, run_rec: Run, root: bool,
                  out: Renderer) -> None:
    """trace.json (Perfetto), timeline.png and summary.json of the recording ``rec`` into
    --out DIR (a new dir under /tmp if none was given)."""
    import json
    import tempfile
    from pathlib import Path

    from npumanager.trace.chrome import summarize, to_chrome

    where = Path(opts.out) if opts.out else Path(
        tempfile.mkdtemp(prefix="npu-demo-out-", dir="/tmp"))
    where.mkdir(parents=True, exist_ok=True)
    (where / "trace.json").write_text(json.dumps(to_chrome(rec)))
    summary = summarize(rec)
    summary["demo"] = {
        "fast": opts.fast, "root": root, "failures": run_rec.failures,
        "skipped": run_rec.skipped,
        "scenes": [{"name": ph.name, "start_s": round(ph.t0 - rec.t0, 3),
                    "end_s": None if ph.t1 is None else round(ph.t1 - rec.t0, 3)}
                   for ph in run_rec.phases]}
    (where / "summary.json").write_text(json.dumps(summary, indent=2))
    written = ["trace.json (open it in https://ui.perfetto.dev)", "summary.json"]
    try:
        from npumanager.trace.timeline import draw

        draw(rec, where / "timeline.png", "npu demo: four apps sharing one accelerator")
        written.insert(1, "timeline.png")
    except ImportError:
        out.note("timeline.png needs matplotlib: pip install 'npumanager[plots]'", "")
    out.note(f"wrote {', '.join(written)} to {where}/", "")
