"""Fair share among background apps: the uid that used more than its share of the
background's recent device time yields to the others (pure: time is the caller's).

Background work of equal effective priority runs side by side on the channels
background may use. On the reference driver each channel is a thread, and with
``background_sched = "idle"`` every background thread is SCHED_IDLE; the kernel
never lets a waking SCHED_IDLE thread preempt a running one (it waits for the
tick: 4 ms at HZ=250). An LLM decoding step after step keeps its thread running;
an embedder's batch, a short step after each RPC, then waits for the LLM's tick
before it runs, on every batch.

With ``background_sched = "share"`` the driver keeps each uid's background run
time (decayed, half-life ``HALF_LIFE_S``) and marks the steps of a uid that used
more than ``SLACK`` times the mean of the uids with background work now as
*yielding*: the shell runs those at SCHED_IDLE and the others at nice
``background_nice``, which a waking thread may preempt: the embedder's batch
takes the core from the LLM's step at once, and both stay below every normal
thread (a foreground frame, the apps). A uid alone in the background never yields.
"""

from __future__ import annotations

from collections.abc import Collection

#: Seconds after which a step's run time counts half.
HALF_LIFE_S = 0.5
#: A uid yields once its decayed use exceeds this multiple of the mean.
SLACK = 1.25
#: A uid counts as active in the background this long after its last step ended: an
#: embedder's next batch is on its way (an RPC) when the LLM's next step starts.
ACTIVE_S = 0.1


class BackgroundShare:
    """Each uid's decayed background run time."""

    def __init__(self, half_life_s: float = HALF_LIFE_S, slack: float = SLACK) -> None:
        self.half_life_s = half_life_s
        self.slack = slack
        self.used: dict[int, float] = {}
        #: When each uid's last background step ended.
        self.last: dict[int, float] = {}
        self._at: float | None = None

    def note(self, uid: int, run_s: float, now: float) -> None:
        """A background step of ``uid`` ran ``run_s`` seconds, ending at ``now``."""
        at = self._at
        if at is not None and now > at:
            f = 0.5 ** ((now - at) / self.half_life_s)
            for u, v in list(self.used.items()):
                if v * f < 1e-6:
                    del self.used[u]  # (forgets uids that stopped)
                    self.last.pop(u, None)
                else:
                    self.used[u] = v * f
        if at is None or now > at:
            self._at = now
        self.used[uid] = self.used.get(uid, 0.0) + max(0.0, run_s)
        self.last[uid] = now

    def yields(self, uid: int, now: float, current: Collection[int]) -> bool:
        """Whether ``uid``'s next background step yields to the other active uids:
        those with background work running or queued (``current``) or with a step that
        ended within ``ACTIVE_S``. The same decay applies to every uid, so comparing
        values decayed up to the last note is exact."""
        active = set(current)
        active.update(u for u, t in self.last.items() if now - t <= ACTIVE_S)
        active.add(uid)
        if len(active) < 2:
            return False
        used = self.used
        total = sum(used.get(u, 0.0) for u in active)
        return used.get(uid, 0.0) * len(active) > self.slack * total
