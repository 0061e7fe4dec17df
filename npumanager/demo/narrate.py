"""The demo's running commentary: each app's event (observe.Event) as one line.

Split out of scenario.py (594 lines, at the module limit): what an event says to the
reader, apart from the scenes that wait for them. A decode or a frame is told once
after each prepare (the first of its run), not every time.
"""

from __future__ import annotations

from npumanager.demo.observe import Event, EventLog
from npumanager.demo.render import Renderer, fmt_ms
from npumanager.words import plural


class Narrator:
    """Tells ``log``'s events on ``out`` (a listener of the log)."""

    def __init__(self, out: Renderer, log: EventLog) -> None:
        self.out = out
        self.log = log

    def show(self, e: Event) -> None:
        app, kind = e["app"], e["ev"]
        t = e["t"]
        if kind == "request":
            size = {"LESS_THAN_1GB": "<1GB", "BETWEEN_1GB_AND_2GB": "1-2GB",
                    "GREATER_THAN_2G": ">2GB"}.get(e["size"], e["size"])
            self.out.event(app, f"asks npud to load a {size} model ({e['priority']}), "
                           f"request {e['id']}", t)
        elif kind == "can_load":
            st = str(e["status"])
            texts = {
                "CAN_LOAD_NOW": f"CAN_LOAD_NOW {e['ms']:.1f} ms after asking (grant issued)",
                "WAIT_FOR_UNLOAD": "WAIT_FOR_UNLOAD: npud asked a less important holder to "
                "make room",
                "NOT_PRIORITIZED": "NOT_PRIORITIZED: queued until it fits",
            }
            text = texts.get(st, st)
            self.out.event(app, text, t, "green" if st == "CAN_LOAD_NOW" else "yellow")
        elif kind == "prepared":
            how = ("loaded from its compilation cache" if e["from_cache"]
                   else "compiled" + (", cache written" if e["cache_written"] else ""))
            burst = "; frames through a burst" if e.get("burst") else ""
            self.out.event(app, f"prepared {e['model']} in {fmt_ms(e['ms'])} ({how}); "
                           f"notify_model_loaded{burst}", t)
        elif kind == "unload_asked":
            tail = "" if e["comply"] else " - and ignores it"
            self.out.event(app, f"on_request_unload_model(reason={e['reason']}){tail}", t,
                           "bold yellow" if e["comply"] else "bold red")
        elif kind == "unloaded":
            self.out.event(app, f"released its model; notify_model_unloaded "
                           f"{e['ms']:.0f} ms after the request", t)
        elif kind == "complete":
            st = e["status"]
            self.out.event(app, f"request {e['id']} ended {st}", t,
                           "bold red" if st == "REVOKED" else "")
        elif kind == "execute_revoked":
            self.out.event(app, "next execute raised GrantRevoked: the driver had released "
                           "its model", t, "bold red")
        elif kind == "decode":
            first = self.log.find(app, "decode", after=self._last_prepare(app))
            if len(first) == 1:
                tps = e["steps"] / (e["ms"] / 1000) if e["ms"] > 0 else 0.0
                self.out.event(app, f"decoding: job of {plural(e['steps'], 'step')} "
                               f"(steps=N, feedback h_out->h) in {fmt_ms(e['ms'])}, "
                               f"{tps:.0f} tokens/s", t)
        elif kind == "frame":
            first = self.log.find(app, "frame", after=self._last_prepare(app))
            if len(first) == 1:
                self.out.event(app, f"streaming at 30 fps; first frame {fmt_ms(e['ms'])}", t)
        elif kind == "error":
            self.out.warn(f"{app}: {e['what']} failed: {e['error']}")
        elif kind == "exit":
            self.out.event(app, "exited", t, "dim")

    def _last_prepare(self, app: str) -> float:
        preps = self.log.find(app, "prepared")
        return preps[-1]["t"] if preps else 0.0
