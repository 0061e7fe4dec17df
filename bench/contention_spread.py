"""The spread of bench/contention.py's numbers over several runs (their --json files).

One run's p99 is one draw: this prints, per run name (unmanaged, managed, each
variant), the median and the range over the files given, for the camera's p99 in
each phase, the ratios the issue's targets are stated in, background throughput
and the foreign CPU each phase saw.

Usage: python bench/contention_spread.py RUN1.json RUN2.json ...
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def _cell(xs: list[float], digits: int = 2) -> str:
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    return (f"{statistics.median(xs):.{digits}f} ({min(xs):.{digits}f}-{max(xs):.{digits}f})")


def main(paths: list[str]) -> int:
    runs: list[list[dict[str, Any]]] = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        # A --repeat N file holds N invocations: each counts as a run here.
        runs += data["invocations"] if isinstance(data, dict) else [data]
    names: list[str] = []
    for run in runs:
        names += [r["name"] for r in run if r["name"] not in names]
    rows: list[tuple[str, ...]] = [("", *names)]

    def row(label: str, fn: Any, digits: int = 2) -> None:
        cells = []
        for name in names:
            xs = []
            for run in runs:
                by = {r["name"]: r for r in run}
                if name in by:
                    try:
                        xs.append(float(fn(by[name], by)))
                    except (KeyError, ZeroDivisionError):
                        pass
            cells.append(_cell(xs, digits))
        rows.append((label, *cells))

    for phase in ("alone", "contended", "loading"):
        row(f"camera p99 {phase} (ms)", lambda r, by, p=phase: r["camera"][p]["p99"])
    for phase in ("contended", "loading"):
        row(f"camera p99 {phase} / own alone",
            lambda r, by, p=phase: r["camera"][p]["p99"] / r["camera"]["alone"]["p99"])
        row(f"camera p99 {phase} / unmanaged's",
            lambda r, by, p=phase: r["camera"][p]["p99"] / by["unmanaged"]["camera"][p]["p99"])
    row("LLM tokens/s", lambda r, by: r["llm_tokens_s"], 0)
    row("embedder items/s", lambda r, by: r["embedder_items_s"], 0)
    row("LLM / unmanaged's", lambda r, by: r["llm_tokens_s"] / by["unmanaged"]["llm_tokens_s"])
    row("embedder / unmanaged's",
        lambda r, by: r["embedder_items_s"] / by["unmanaged"]["embedder_items_s"])
    row("foreign CPU, contended (cores)", lambda r, by: r["cpu"]["contended"]["foreign"])
    # All runs' contended frames together: their p99 (from each run's slowest 5 %).
    cells = []
    for name in names:
        worst: list[float] = []
        frames = 0
        for run in runs:
            for r in run:
                if r["name"] == name and "contended" in r.get("worst", {}):
                    worst += [ms for _, ms in r["worst"]["contended"]]
                    frames += r["camera"]["contended"]["n"]
        worst.sort(reverse=True)
        k = frames // 100
        cells.append(f"{worst[k]:.2f} of {frames}" if frames and k < len(worst) else "-")
    rows.append(("camera p99 contended, runs pooled", *cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"{len(runs)} runs: {', '.join(paths)}")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
