"""A timeline picture of a :class:`Recording` (matplotlib, ``npumanager[plots]``).

One lane per app (uid): its requests' states as coloured bars, its execution
steps as dark ticks inside the lane, grants, unload requests (with the reason)
and revocations marked; underneath, the thermal status and the budget used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npumanager.trace.chrome import THERMAL_NAMES, request_spans
from npumanager.trace.recorder import Recording

STATE_COLORS = {"waiting": "#f2c14e", "granted": "#7fb7e6", "loaded": "#5aa469",
                "unload_requested": "#f08a4b"}
STATE_LABELS = {"waiting": "waiting", "granted": "granted (loading)", "loaded": "loaded",
                "unload_requested": "asked to unload"}


def _merge(intervals: list[tuple[float, float]], gap: float) -> list[tuple[float, float]]:
    """Intervals (start, duration) merged when closer than ``gap``: fewer, visible bars."""
    out: list[list[float]] = []
    for start, dur in sorted(intervals):
        if out and start <= out[-1][0] + out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], start + dur - out[-1][0])
        else:
            out.append([start, dur])
    return [(a, b) for a, b in out]


def draw(rec: Recording, path: str | Path, title: str = "npumanager: what the accelerator "
         "did") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    spans, marks = request_spans(rec)
    end = max(rec.t1 - rec.t0, 1e-3)
    uid_set = {s.uid for s in spans} | {m.uid for m in marks}
    for steps in rec.steps.values():
        uid_set |= {int(s["uid"]) for s in steps}
    uids = sorted(uid_set)
    names = {u: rec.uid_names.get(str(u), f"uid {u}") for u in uids}

    lanes = max(1, len(uids))
    fig, (ax, axt) = plt.subplots(
        2, 1, figsize=(13, 1.0 + 0.85 * lanes + 2.0), sharex=True,
        gridspec_kw={"height_ratios": [max(2.0, 0.85 * lanes), 1.6]})
    fig.suptitle(title, fontsize=14, fontweight="bold", x=0.01, ha="left")
    row = {u: lanes - 1 - i for i, u in enumerate(uids)}
    for s in spans:
        y = row[s.uid]
        ax.broken_barh([(s.start, s.end - s.start)], (y + 0.35, 0.5),
                       facecolors=STATE_COLORS.get(s.state, "#cccccc"), edgecolor="white",
                       linewidth=0.5)
    gap = end / 1500
    for steps in rec.steps.values():
        by_uid: dict[int, list[tuple[float, float]]] = {}
        for st in steps:
            by_uid.setdefault(int(st["uid"]), []).append(
                (float(st["start"]) - rec.t0, float(st["dur"])))
        for uid, iv in by_uid.items():
            ax.broken_barh(_merge(iv, gap), (row[uid] + 0.08, 0.2), facecolors="#263238")
    marked: set[str] = set()
    for m in marks:
        y = row[m.uid]
        if m.what == "grant":
            ax.plot(m.at, y + 0.9, marker="v", color="#2e7d32", markersize=7, zorder=5)
        elif m.what == "unload asked":
            preempt = m.reason == "PREEMPTED"
            ax.plot(m.at, y + 0.9, marker="v", color="#c62828" if preempt else "#ef6c00",
                    markersize=10 if preempt else 8, zorder=6)
            ax.annotate(m.reason.lower().replace("_", " "), (m.at, y + 0.93),
                        xytext=(3, 2), textcoords="offset points", fontsize=8,
                        color="#c62828" if preempt else "#ef6c00",
                        fontweight="bold" if preempt else "normal")
            marked.add("preempt" if preempt else "unload")
        elif m.what == "revoked":
            ax.plot(m.at, y + 0.6, marker="X", color="black", markersize=10, zorder=7)
            ax.annotate("revoked", (m.at, y + 0.6), xytext=(5, -10),
                        textcoords="offset points", fontsize=8, fontweight="bold")
    ax.set_yticks([row[u] + 0.5 for u in uids], [names[u] for u in uids], fontsize=10)
    ax.set_ylim(0, lanes + 0.1)
    ax.set_xlim(0, end)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title("requests per app (bars) and execution steps on the device (dark ticks)",
                 fontsize=10, loc="left", color="#444444")
    handles: list[Any] = [Patch(color=c, label=STATE_LABELS[k]) for k, c in STATE_COLORS.items()]
    handles.append(Patch(color="#263238", label="executing"))
    from matplotlib.lines import Line2D

    handles.append(Line2D([], [], marker="v", color="#2e7d32", linestyle="", label="grant"))
    handles.append(Line2D([], [], marker="v", color="#c62828", linestyle="", markersize=9,
                          label="preempted (unload asked)"))
    handles.append(Line2D([], [], marker="v", color="#ef6c00", linestyle="",
                          label="unload asked (other reason)"))
    handles.append(Line2D([], [], marker="X", color="black", linestyle="", label="revoked"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9,
              frameon=False)

    if rec.samples:
        ts = [s[0] - rec.t0 for s in rec.samples]
        status = [s[3] for s in rec.samples]
        axt.fill_between(ts, status, step="post", color="#e57373", alpha=0.35)
        axt.step(ts, status, where="post", color="#c62828", label="thermal status")
        axt.set_yticks(range(7), THERMAL_NAMES, fontsize=8)
        axt.set_ylim(-0.2, max(3, max(status) + 0.5))
        axb = axt.twinx()
        axb.step(ts, [s[1] for s in rec.samples], where="post", color="#1565c0",
                 label="budget used")
        axb.step(ts, [s[2] for s in rec.samples], where="post", color="#1565c0",
                 linestyle=":", label="budget (after thermal scaling)")
        axb.set_ylabel("budget", color="#1565c0")
        axb.set_ylim(0, max(1.0, max(max(s[1], s[2]) for s in rec.samples) * 1.15))
        lines = axt.get_legend_handles_labels()
        lines2 = axb.get_legend_handles_labels()
        axt.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left",
                   bbox_to_anchor=(1.06, 1.0), fontsize=9, frameon=False)
    axt.set_xlabel("seconds")
    axt.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out
