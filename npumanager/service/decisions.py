"""The bounded log of npud's decisions, and each request's story (``npu status --story``).

Every decision is stamped with the event that caused it (``now`` and its
stimulus id) and the request it is about, if any. Entries are kept as plain
tuples and become :class:`Decision` objects only when read: a lifecycle
records four on the grant path, and reading is rare.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from npumanager.service.events import Decision, RequestKey

_Entry = tuple[float, str, RequestKey | None, str, dict[str, object]]


class DecisionLog:
    __slots__ = ("_entries", "record")

    def __init__(self, size: int) -> None:
        self._entries: deque[_Entry] = deque(maxlen=size)
        #: ``record((at, stimulus_id, key, what, details))``: add one decision (the oldest
        #: falls off a full log).
        self.record: Callable[[_Entry], None] = self._entries.append

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"<DecisionLog {len(self._entries)}/{self._entries.maxlen}>"

    def story(self, key: RequestKey) -> list[Decision]:
        """What was decided about one request (every incarnation of its key), oldest first."""
        return [Decision(*d) for d in self._entries if d[2] == key]

    def all(self) -> list[Decision]:
        return [Decision(*d) for d in self._entries]

    def since(self, t: float, limit: int) -> tuple[list[Decision], bool]:
        """The first ``limit`` decisions taken at or after ``t``, and whether the log may
        have lost some of them (its oldest entry is itself after ``t`` and it is full)."""
        got: list[Decision] = []
        for d in self._entries:
            if d[0] >= t:
                if len(got) == limit:
                    break
                got.append(Decision(*d))
        full = len(self._entries) == self._entries.maxlen
        lost = full and bool(self._entries) and self._entries[0][0] > t
        return got, lost
