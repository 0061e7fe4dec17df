"""How the CLI shows values to a person: sizes by name, ages, "in 3.2 s", bytes.

Shared by `npu status`, `npu top` and `npu trace`; everything works on the JSON
values of npud's dump (as they arrive over the wire).
"""

from __future__ import annotations

from typing import Any

SIZE_NAMES = {"0": "<1GB", "1": "1-2GB", "2": ">2GB",
              "LESS_THAN_1GB": "<1GB", "BETWEEN_1GB_AND_2GB": "1-2GB", "GREATER_THAN_2G": ">2GB"}


def size_name(v: Any) -> str:
    """A ModelSize (number, its name, or a weights-dict key) as a person says it."""
    return SIZE_NAMES.get(str(v), str(v))


def per_size(d: Any, fmt: Any = str) -> str:
    """``{"0": 1, "1": 2, "2": 4}`` -> ``<1GB 1, 1-2GB 2, >2GB 4``."""
    if not isinstance(d, dict):
        return str(d)
    return ", ".join(f"{size_name(k)} {fmt(v)}" for k, v in d.items())


def duration(s: float) -> str:
    """Seconds as a person reads them: 0.4 s, 12 s, 3 min 5 s, 2 h 10 min, 3 d 4 h."""
    s = max(0.0, float(s))
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    if s < 3600:
        m, r = divmod(int(s), 60)
        return f"{m} min {r} s" if r else f"{m} min"
    if s < 86400:
        h, r = divmod(int(s) // 60, 60)
        return f"{h} h {r} min" if r else f"{h} h"
    d, r = divmod(int(s) // 3600, 24)
    return f"{d} d {r} h" if r else f"{d} d"


def ago(v: Any) -> str:
    """Seconds since something happened ("never" if it did not)."""
    return "never" if v is None else f"{duration(float(v))} ago"


def due_in(v: Any) -> str:
    """Seconds until a deadline: "in 3.2 s", or "overdue" once it has passed."""
    if v is None:
        return "-"
    x = float(v)
    return f"in {duration(x)}" if x >= 0 else f"overdue by {duration(-x)}"


def nbytes(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, int):
        return "-" if v is None else str(v)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v} B"


def importance_name(v: Any) -> str:
    from npumanager.constants import Importance

    try:
        return f"{Importance(int(v)).name.lower()} ({int(v)})"
    except (TypeError, ValueError):
        return "-" if v is None else str(v)


def cell(v: Any) -> str:
    """A generic value in a table cell: no JSON blobs, no raw floats."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}" if v == int(v) else f"{v:.3g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {cell(x)}" for k, x in v.items())
    if isinstance(v, (list, tuple)):
        return ", ".join(cell(x) for x in v)
    return str(v)
