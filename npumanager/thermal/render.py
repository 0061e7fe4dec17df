"""Plain-text rendering of ``ThermalMonitor.describe()`` for ``npu thermal status``.

Works on the JSON dict (as it arrives over the wire), needs no terminal
library, and keeps to one screen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    return "-" if v is None or v != v else fmt.format(v)  # None or NaN: no reading


def render_thermal(d: Mapping[str, Any]) -> str:
    status = str(d.get("status", "?"))
    override = d.get("override")
    lines = []
    head = f"thermal status: {status}"
    if override is not None:
        head += f" (override; sensors say {d.get('computed_status', '?')})"
    since = d.get("since_s")
    if since is not None:
        head += f", for {since:.0f} s"
    lines.append(head)
    lines.append(
        f"hottest: {_num(d.get('temperature_c'))} C   headroom: {_num(d.get('headroom'), '{:.2f}')}"
        f"   in {_num(d.get('forecast_s'), '{:.0f}')} s: "
        f"{_num(d.get('headroom_forecast'), '{:.2f}')}   (1.00 = SEVERE)"
    )
    th = d.get("thresholds_c") or {}
    if th:
        ladder = "  ".join(f"{k} {v:g}" for k, v in th.items())
        lines.append(f"thresholds C: {ladder}   hysteresis {d.get('hysteresis_c', 0):g} C")
    sensors = d.get("sensors") or []
    if sensors:
        width = max(len(str(s.get("name", ""))) for s in sensors)
        width = max(width, len("SENSOR"))
        lines.append("")
        lines.append(f"{'SENSOR':<{width}}  {'SOURCE':<6}  {'TEMP C':>7}  {'TREND C/s':>9}  STATUS")
        for s in sensors:
            lines.append(
                f"{s.get('name', ''):<{width}}  {s.get('source', ''):<6}  "
                f"{_num(s.get('temp_c')):>7}  {_num(s.get('slope_c_per_s'), '{:+.2f}'):>9}  "
                f"{s.get('status', '')}"
            )
    else:
        lines.append(f"no sensor readings (sources: {', '.join(d.get('sources') or []) or 'none'})")
    failing = d.get("failing_sources") or []
    if failing:
        lines.append(f"failing sources: {', '.join(failing)}")
    history = d.get("history") or []
    if history:
        lines.append("")
        lines.append("recent changes:")
        for h in history[-5:]:
            lines.append(
                f"  {h.get('ago_s', 0):>7.1f} s ago  -> {h.get('status')}  ({h.get('cause')})"
            )
    return "\n".join(lines)
