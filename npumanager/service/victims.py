"""Who is asked to unload: the victims of a waiter, and the holders a budget sheds.

Pure choices over the holders of one budget; :class:`ManagerState` asks the
chosen ones (``AskUnload``) and changes their state. The order, both times:
least important rank first; among equal ranks, the uid that completed work most
recently (its turn is over), then the newest request.

* :func:`preemption_victims`: holders of other uids that rank worse than the
  waiter (or equal, if the waiter's uid completed work less recently) until,
  with the holders already unloading, the waiter fits. OPPORTUNISTIC waiters
  never preempt.
* :func:`holders_to_shed`: after the thermal status, the policy or the
  drivers' memory changed, every holder ranked worse than the thermal
  keep-rank (THERMAL), then the worst holders until the rest fits the budget
  (with the reason given).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from npumanager.constants import UnloadReason
from npumanager.service.budget import Budget
from npumanager.service.ranking import ManagedRequest, RequestState

_NEVER = float("-inf")
_U = RequestState.UNLOAD_REQUESTED


def victim_order(last_completed: Mapping[int, float],
                 ) -> Callable[[ManagedRequest], tuple[float, float, int]]:
    def key(h: ManagedRequest) -> tuple[float, float, int]:
        return (-h.rank, -last_completed.get(h.uid, _NEVER), -h.seq)

    return key


def preemption_victims(req: ManagedRequest, holders: Iterable[ManagedRequest], budget: Budget,
                       last_completed: Mapping[int, float]) -> list[ManagedRequest] | None:
    """The holders to ask so that ``req`` fits, or None when even all of them would not do."""
    assert budget.grant_cap is not None
    need = budget.used + budget.charge(req) - budget.grant_cap
    freed = budget.freeing
    chosen: list[ManagedRequest] = []
    if freed < need and not req.opportunistic:
        mine = last_completed.get(req.uid, _NEVER)
        candidates = [
            h
            for h in holders
            if h.state is not _U
            and h.uid != req.uid
            and (h.rank > req.rank
                 or (h.rank == req.rank and mine < last_completed.get(h.uid, _NEVER)))
        ]
        for h in sorted(candidates, key=victim_order(last_completed)):
            if freed >= need:
                break
            chosen.append(h)
            freed += h.charge
    return chosen if freed >= need else None


def holders_to_shed(holders: Iterable[ManagedRequest], budget: Budget,
                    last_completed: Mapping[int, float], reason: UnloadReason,
                    ) -> list[tuple[ManagedRequest, UnloadReason]]:
    """Holders to ask, and why, so that the thermal rank limit and the budget hold."""
    order = sorted((h for h in holders if h.state is not _U), key=victim_order(last_completed))
    out: list[tuple[ManagedRequest, UnloadReason]] = []
    keep = budget.keep
    if keep is not None:
        out = [(h, UnloadReason.THERMAL) for h in order if h.rank > keep]
    if budget.hold_cap is not None:
        held = budget.used - budget.freeing - sum(h.charge for h, _ in out)
        asked = {id(h) for h, _ in out}
        for h in order:
            if held <= budget.hold_cap:
                break
            if id(h) not in asked:
                out.append((h, reason))
                held -= h.charge
    return out
