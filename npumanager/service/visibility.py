"""What a caller may see of npud's state: admins everything, others their own.

``npu status`` as a non-admin must not tell one local user what another runs:
no other uid, request id, pid or grant-id prefix. A non-admin's dump keeps the
aggregate numbers (budget, counts, thermal, devices), its own requests in
full, and the other uids' requests only as counts per state.

The dump grows as the state grows; this module names what is *kept* for a
non-admin (per-uid tables are filtered to the caller's keys), so a new field
of a request or uid entry stays confined to its owner by default.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

#: The dump's lists of ``[uid, request_id]`` keys (filtered to the caller's own).
KEY_LISTS = ("queue", "parked")


def own_view(dump: dict[str, Any], keys: set[int]) -> dict[str, Any]:
    """``dump`` as a non-admin whose requests are filed under ``keys`` may see it.

    Sets ``visibility`` to ``"own"`` and adds ``other_requests``: the number of
    other uids' live requests per state. Returns a new dict; ``dump`` is not changed."""
    out = dict(dump)
    out["visibility"] = "own"
    requests = dump.get("requests")
    mine: list[Any] = []
    others: Counter[str] = Counter()
    if isinstance(requests, list):
        for r in requests:
            if isinstance(r, dict) and r.get("uid") in keys:
                mine.append(r)
            elif isinstance(r, dict):
                others[str(r.get("state", "?"))] += 1
    out["requests"] = mine
    out["other_requests"] = dict(sorted(others.items()))
    uids = dump.get("uids")
    if isinstance(uids, dict):
        names = {str(k) for k in keys}
        out["uids"] = {u: v for u, v in uids.items() if u in names}
    rt = dump.get("realtime")
    if isinstance(rt, dict):  # real-time threads (service/rt_watch.py): its own only
        out["realtime"] = {
            **rt,
            "granted": [g for g in rt.get("granted") or [] if g.get("uid") in keys],
            "cooldown": {u: t for u, t in (rt.get("cooldown") or {}).items()
                         if u in {str(k) for k in keys}}}
    for name in KEY_LISTS:
        value = dump.get(name)
        if isinstance(value, list):
            out[name] = [k for k in value
                         if isinstance(k, (list, tuple)) and k and k[0] in keys]
    return out


def admin_view(dump: dict[str, Any]) -> dict[str, Any]:
    out = dict(dump)
    out["visibility"] = "all"
    return out
