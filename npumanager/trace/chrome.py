"""A :class:`Recording` as Chrome trace-event JSON (``{"traceEvents": [...]}``), which
Perfetto's UI (and chrome://tracing) opens.

Tracks: process "npud" with a thread per uid (its requests' states as slices;
instants for grants, unload requests with their reason, revocations) and
counters "budget used" and "thermal status"; a process per device with a
thread per channel (a slice per execution step, named by uid and feature).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from npumanager.trace.recorder import Recording

NPUD_PID = 1
THERMAL_NAMES = ("NONE", "LIGHT", "MODERATE", "SEVERE", "CRITICAL", "EMERGENCY", "SHUTDOWN")
#: decision -> the request's state from then on (None: the request is over)
STATE_AFTER = {"requested": "waiting", "not_prioritized": "waiting",
               "wait_for_unload": "waiting", "granted": "granted", "loaded": "loaded",
               "asked to unload": "unload_requested", "complete": None, "cancelled": None,
               "revoked": None, "dropped (client gone)": None}


@dataclass(frozen=True)
class Span:
    """One request in one state, in seconds from the recording's start."""

    uid: int
    request_id: int
    state: str
    start: float
    end: float


@dataclass(frozen=True)
class Mark:
    """An instant: grant, unload asked (reason), revoked, deadline passed."""

    uid: int
    request_id: int
    what: str
    at: float
    reason: str = ""


def request_spans(rec: Recording) -> tuple[list[Span], list[Mark]]:
    """Every request's states and its instants, from npud's stories (clipped to the
    recording)."""
    spans: list[Span] = []
    marks: list[Mark] = []
    end_all = rec.t1 - rec.t0
    for key, story in sorted(rec.stories.items()):
        uid_s, rid_s = key.split(":")
        uid, rid = int(uid_s), int(rid_s)
        state: str | None = None
        since = 0.0
        for d in sorted(story, key=lambda x: float(x.get("at", 0.0))):
            at = float(d.get("at", 0.0)) - rec.t0
            what = str(d.get("what"))
            details = d.get("details") or {}
            if what == "granted":
                marks.append(Mark(uid, rid, "grant", at))
            elif what == "asked to unload":
                marks.append(Mark(uid, rid, "unload asked", at, str(details.get("reason", ""))))
            elif what == "revoked":
                marks.append(Mark(uid, rid, "revoked", at))
            elif what == "unload deadline passed":
                marks.append(Mark(uid, rid, "unload deadline passed", at))
            if what not in STATE_AFTER:
                continue
            new = STATE_AFTER[what]
            if new == state:
                continue
            if state is not None and at > since:
                spans.append(Span(uid, rid, state, max(0.0, since), at))
            state, since = new, at
        if state is not None:
            spans.append(Span(uid, rid, state, max(0.0, since), end_all))
    spans = [sp for sp in spans if sp.end > 0]
    marks = [m for m in marks if 0 <= m.at <= end_all]
    return spans, marks


def _us(t: float) -> float:
    return round(t * 1e6, 1)


def to_chrome(rec: Recording) -> dict[str, Any]:
    ev: list[dict[str, Any]] = [
        {"ph": "M", "pid": NPUD_PID, "name": "process_name", "args": {"name": "npud"}},
        {"ph": "M", "pid": NPUD_PID, "name": "process_sort_index", "args": {"sort_index": 0}},
    ]
    spans, marks = request_spans(rec)
    uids = sorted({s.uid for s in spans} | {m.uid for m in marks})
    for uid in uids:
        name = rec.uid_names.get(str(uid), f"uid {uid}")
        ev.append({"ph": "M", "pid": NPUD_PID, "tid": uid, "name": "thread_name",
                   "args": {"name": name}})
    for sp in spans:
        ev.append({"ph": "X", "pid": NPUD_PID, "tid": sp.uid, "ts": _us(sp.start),
                   "dur": _us(sp.end - sp.start), "name": f"request {sp.request_id}: "
                   f"{sp.state}", "cat": "request",
                   "args": {"uid": sp.uid, "request": sp.request_id, "state": sp.state}})
    for m in marks:
        name = f"{m.what} ({m.reason})" if m.reason else m.what
        ev.append({"ph": "i", "s": "t", "pid": NPUD_PID, "tid": m.uid, "ts": _us(m.at),
                   "name": name, "cat": "decision",
                   "args": {"uid": m.uid, "request": m.request_id, "reason": m.reason}})
    for t, used, total, status in rec.samples:
        ts = _us(t - rec.t0)
        ev.append({"ph": "C", "pid": NPUD_PID, "ts": ts, "name": "budget used",
                   "args": {"used": used, "max": total}})
        ev.append({"ph": "C", "pid": NPUD_PID, "ts": ts, "name": "thermal status",
                   "args": {"status": status}})
    for i, (device, steps) in enumerate(sorted(rec.steps.items())):
        pid = NPUD_PID + 1 + i
        ev.append({"ph": "M", "pid": pid, "name": "process_name",
                   "args": {"name": f"device {device}"}})
        ev.append({"ph": "M", "pid": pid, "name": "process_sort_index",
                   "args": {"sort_index": 1 + i}})
        for ch in range(max(rec.channels.get(device, 1),
                            1 + max((st["channel"] for st in steps), default=0))):
            ev.append({"ph": "M", "pid": pid, "tid": ch + 1, "name": "thread_name",
                       "args": {"name": f"channel {ch}"}})
        for st in steps:
            start = float(st["start"]) - rec.t0
            if start + float(st["dur"]) < 0:
                continue
            who = rec.uid_names.get(str(st["uid"]), f"uid {st['uid']}")
            feature = st.get("feature")
            name = who + (f" · feature {feature}" if feature is not None else "")
            ev.append({"ph": "X", "pid": pid, "tid": int(st["channel"]) + 1,
                       "ts": _us(start), "dur": max(_us(float(st["dur"])), 0.1), "name": name,
                       "cat": "execution",
                       "args": {"uid": st["uid"], "feature": feature, "job": st["job"],
                                "step": st["step"]}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"producer": "npumanager npu trace", "notes": rec.notes}}


def summarize(rec: Recording) -> dict[str, Any]:
    """Numbers a person asks about a recording: per uid grants, unloads and why,
    revocations, executions and their latency; thermal and budget peaks."""
    spans, marks = request_spans(rec)
    per: dict[str, dict[str, Any]] = {}

    def entry(uid: int) -> dict[str, Any]:
        name = rec.uid_names.get(str(uid), str(uid))
        return per.setdefault(name, {"grants": 0, "unload_asks": {}, "revoked": 0,
                                     "execution_steps": 0, "step_ms_p50": None,
                                     "step_ms_p99": None, "loaded_s": 0.0})

    for m in marks:
        e = entry(m.uid)
        if m.what == "grant":
            e["grants"] += 1
        elif m.what == "unload asked":
            e["unload_asks"][m.reason] = e["unload_asks"].get(m.reason, 0) + 1
        elif m.what == "revoked":
            e["revoked"] += 1
    for sp in spans:
        if sp.state == "loaded":
            entry(sp.uid)["loaded_s"] = round(entry(sp.uid)["loaded_s"] + sp.end - sp.start, 3)
    by_uid: dict[int, list[float]] = {}
    for steps in rec.steps.values():
        for st in steps:
            by_uid.setdefault(int(st["uid"]), []).append(float(st["dur"]) * 1e3)
    for uid, durs in by_uid.items():
        durs.sort()
        e = entry(uid)
        e["execution_steps"] = len(durs)
        e["step_ms_p50"] = round(durs[len(durs) // 2], 3)
        e["step_ms_p99"] = round(durs[min(len(durs) - 1, int(len(durs) * 0.99))], 3)
    peak = max((s[3] for s in rec.samples), default=0)
    return {"duration_s": round(rec.t1 - rec.t0, 3), "apps": per,
            "thermal_peak": THERMAL_NAMES[peak] if 0 <= peak < len(THERMAL_NAMES) else peak,
            "budget_peak": max((s[1] for s in rec.samples), default=0.0),
            "steps": sum(len(v) for v in rec.steps.values()),
            "requests": len(rec.stories), "notes": rec.notes}
