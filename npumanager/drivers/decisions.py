"""The driver's decision log: what it decided, when and why, bounded; read as a whole or
as the story of one work item, model or grant. Pure (part of
:class:`~npumanager.drivers.state.DriverState`)."""

from __future__ import annotations

from collections import deque

from npumanager.drivers import events as ev
from npumanager.errors import InvalidArgument


class DecisionLog:
    def __init__(self, size: int) -> None:
        # Plain tuples (at, stimulus, kind, key, what, details): built into Decision objects
        # only when read (a decision is logged on every step; read rarely).
        self._log: deque[tuple[float, str, str, int | str, str, dict[str, object]]] = deque(
            maxlen=size)

    def __len__(self) -> int:
        return len(self._log)

    def record(self, e: ev.Event, kind: str, key: int | str, what: str,
               details: dict[str, object]) -> None:
        self._log.append((e.now, e.stimulus_id, kind, key, what, details))

    def story(self, work_id: int | None = None, *, model_id: int | None = None,
              grant_id: str | None = None) -> list[ev.Decision]:
        """What happened to one work item, model or grant (as far as the log reaches)."""
        if work_id is not None:
            want: tuple[str, int | str] = ("work", work_id)
        elif model_id is not None:
            want = ("model", model_id)
        elif grant_id is not None:
            want = ("grant", grant_id)
        else:
            raise InvalidArgument("story needs a work id, a model id or a grant id")
        return [ev.Decision(at, sid, f"{kind} {key}", what, details)
                for at, sid, kind, key, what, details in self._log if (kind, key) == want]

    def all(self) -> list[ev.Decision]:
        return [ev.Decision(at, sid, f"{kind} {key}", what, details)
                for at, sid, kind, key, what, details in self._log]
