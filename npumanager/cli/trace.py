"""`npu trace record [--duration S] [-o FILE]`: a Chrome trace-event JSON of what npud and
its drivers did (open it in Perfetto's UI), optionally a timeline picture (admin)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from npumanager.cli.main import UsageError, add_runtime_dir, check_can_write, positive_float
from npumanager.words import plural


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "trace", help="record a trace of npud and the drivers (Perfetto / chrome://tracing)")
    add_runtime_dir(p)
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    r = verbs.add_parser(
        "record", help="record for --duration seconds (or until Ctrl-C), write a trace",
        description="Record npud's decisions (request states, grants, unload requests with "
        "their reason, revocations), budget and thermal status, and every execution step "
        "on each device channel; write Chrome trace-event JSON that Perfetto's UI "
        "(ui.perfetto.dev) opens. Admin only.")
    add_runtime_dir(r)
    r.add_argument("--duration", metavar="S", type=positive_float, default=10.0,
                   help="seconds to record (default 10; Ctrl-C stops early)")
    r.add_argument("-o", "--output", metavar="FILE", default="trace.json",
                   help="where to write the trace (default trace.json)")
    r.add_argument("--png", metavar="FILE", default=None,
                   help="also draw the timeline picture (needs matplotlib: npumanager[plots])")
    r.add_argument("--summary", metavar="FILE", default=None,
                   help="also write the numbers (per app grants, unloads, steps) as JSON")
    r.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from npumanager.trace.chrome import summarize, to_chrome
    from npumanager.trace.recorder import TraceRecorder

    out = Path(args.output)
    if out.is_dir():
        raise UsageError(f"-o {out} is a directory; name a file")
    for flag, path in (("-o", out), ("--summary", args.summary), ("--png", args.png)):
        if path is not None:
            check_can_write(path, flag)
    if args.png is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--png needs matplotlib: pip install 'npumanager[plots]'") from None
    rec = TraceRecorder(args.runtime_dir)
    print(f"recording for {args.duration:g} s (Ctrl-C stops)...", file=sys.stderr, flush=True)
    try:
        rec.start()
        rec._stop.wait(args.duration)
    except KeyboardInterrupt:
        pass
    recording = rec.stop()
    doc = to_chrome(recording)
    out.write_text(json.dumps(doc))
    summary = summarize(recording)
    print(f"wrote {out}: {plural(summary['requests'], 'request')}, "
          f"{plural(summary['steps'], 'execution step')} "
          f"in {summary['duration_s']:.1f} s; open it in https://ui.perfetto.dev")
    for note in recording.notes:
        print(f"  note: {note}")
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.summary}")
    if args.png:
        from npumanager.trace.timeline import draw

        draw(recording, args.png)
        print(f"wrote {args.png}")
    return 0
