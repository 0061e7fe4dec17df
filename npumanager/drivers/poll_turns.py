"""Whose turn it is to poll: anticipation's one poll slot shared fairly between the
paced streams of different uids (pure: time is the caller's ``now``).

The host lets one burst warm up and poll at a time (drivers/anticipate.py: the poll
is CPU nobody asked for, and on 2 vCPUs two of them would take both). Taken first
come, first served, two streams whose windows overlap every frame (two apps at the
same pace and phase: a camera and a video call started together) settle into one
order: the stream whose window opens first takes the slot and the other is skipped,
frame after frame. A hostile app can deny another uid's stream its anticipation that
way by pacing its own stream just ahead of it (tests/security/test_burst_stamps.py: the
victim's requests 100 µs after the attacker's, both at 30 Hz, first come first served:
the victim skipped in runs of up to 5, 5, 3 and 14 windows in a row in four runs, 30-39
of its ~80-120 windows; with turns, runs of at most 1-2 in five runs).

So turns rotate between uids where their windows overlap:

* each stream says where its next window lies when it plans it (``planned``: from
  its wake-up, the warm-up included, to the window's end), and that it is over
  (``ended``) whichever way its wait ended;
* a uid is *owed* a turn once one of its streams was skipped (the slot held by
  another, or given up for another uid), until one of its streams takes the slot or
  its request came before its window (it was served without the slot);
* a stream may take the free slot unless another uid is owed a turn, had its last
  turn before this stream's uid had its own, and has a stream whose window overlaps
  this one's and is not over: then it gives the slot up for that window (``ask`` is
  False) and its own uid is owed the next.

Two uids overlapping every frame alternate; one uid's streams among themselves are
served first come, first served as before (their uid's business); a uid with many
streams gets no more turns against another uid than a uid with one (turns are per
uid, not per stream). Windows that do not overlap are never given up. What a turn
costs is unchanged: one poll at a time, each within its stream's share. Keeping the
turns costs the burst's thread ~0.9 µs per anticipated request (three acquisitions of
the turns' lock and the look at the others' windows, hot, 2 vCPUs: 1.0 µs vs 0.13 for
the lock alone), all but ``ended``'s ~0.3 µs of it before the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Uids whose last turn is kept before those without a window now are forgotten.
KEPT_UIDS = 256


@dataclass(slots=True)
class _Window:
    uid: int
    start: float
    end: float


@dataclass(slots=True)
class PollTurns:
    """The streams' declared windows and each uid's claim to the next turn."""

    #: Each stream's next window (by the caller's key for the stream), while it waits.
    windows: dict[int, _Window] = field(default_factory=dict)
    #: Uids owed a turn (one of their streams was skipped since their last turn).
    owed: set[int] = field(default_factory=set)
    #: When each uid last took the slot.
    last_turn: dict[int, float] = field(default_factory=dict)
    #: Turns taken, windows skipped for a held slot, windows given up for another uid.
    taken: int = 0
    busy: int = 0
    deferred: int = 0

    def planned(self, key: int, uid: int, start: float, end: float) -> None:
        """Stream ``key`` of ``uid`` will want the slot from ``start`` to ``end``."""
        self.windows[key] = _Window(uid, start, end)

    def ask(self, key: int, now: float) -> bool:
        """May stream ``key`` take the slot (free, as far as the caller knows) now?
        False: it gives its window up for another uid's turn (counted; its uid is owed
        the next)."""
        mine = self.windows.get(key)
        if mine is None:
            return True  # (never planned: nothing to weigh it against)
        uid = mine.uid
        since = self.last_turn.get(uid, -math.inf)
        for other_key, w in self.windows.items():
            if (other_key != key and w.uid != uid and w.uid in self.owed and w.end > now
                    and w.start < mine.end and mine.start < w.end
                    and self.last_turn.get(w.uid, -math.inf) < since):
                self.deferred += 1
                self.owed.add(uid)
                return False
        return True

    def took(self, key: int, now: float) -> None:
        """Stream ``key`` holds the slot now: its uid's turn."""
        w = self.windows.get(key)
        self.taken += 1
        if w is not None:
            turns = self.last_turn
            if len(turns) >= KEPT_UIDS and w.uid not in turns:
                # Uids with no window now forget their last turn (it weighs only against
                # an owed uid's, and an owed uid with no window is given nothing).
                waiting = {x.uid for x in self.windows.values()}
                for uid in [u for u in turns if u not in waiting]:
                    del turns[uid]
            turns[w.uid] = now
            self.owed.discard(w.uid)

    def skipped(self, key: int) -> None:
        """Stream ``key`` found the slot held: its uid is owed a turn."""
        self.busy += 1
        w = self.windows.get(key)
        if w is not None:
            self.owed.add(w.uid)

    def ended(self, key: int, served_early: bool = False) -> None:
        """Stream ``key``'s wait is over; ``served_early``: its request came before its
        window (it needed no turn: its uid's claim lapses, or a uid whose requests
        always come early would make others give windows up for nothing)."""
        w = self.windows.pop(key, None)
        if w is not None and served_early:
            self.owed.discard(w.uid)


class FirstCome(PollTurns):
    """The slot first come, first served (``burst_poll_turns = false``; what the host did
    before turns): no window is given up for another uid. The windows are still declared
    and counted, so the two differ only in ``ask``."""

    def ask(self, key: int, now: float) -> bool:
        return True
