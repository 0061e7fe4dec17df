"""The grants npud issued to this driver, the ones that ended, and the tombstones of models
dropped when their grant did: what a prepare is checked against, and what a later call on
a revoked model is told. Pure (part of :class:`~npumanager.drivers.state.DriverState`)."""

from __future__ import annotations

from collections import OrderedDict

from npumanager.drivers.records import Grant, GrantCheck
from npumanager.errors import GrantMoved, GrantRequired, GrantRevoked


class Grants:
    def __init__(self, driver_name: str, keep: int) -> None:
        self.driver_name = driver_name
        self.keep = keep  # ended grants and tombstones remembered, the oldest forgotten
        self.live: dict[str, Grant] = {}
        self.ended: OrderedDict[str, bool] = OrderedDict()  # grant id -> revoked
        #: model id -> (its connection, why it was dropped)
        self.tombstones: OrderedDict[int, tuple[int, str]] = OrderedDict()

    def check(self, grant_id: str, uid: int, enforced: bool) -> GrantCheck:
        """May ``uid`` prepare a model under ``grant_id`` now? Raises GrantRequired
        (enforced and none named, or another uid's) or GrantRevoked (it ended)."""
        grant = self.live.get(grant_id) if grant_id else None
        if not enforced:
            return GrantCheck.LIVE if grant is not None and grant.uid == uid \
                else GrantCheck.NOT_NEEDED
        if not grant_id:
            raise GrantRequired(
                f"driver {self.driver_name} admits models only with a grant: ask npud first "
                "(NpuManager.request_can_load_model) and pass grant=listener")
        if grant is not None:
            if grant.uid != uid:
                raise GrantRequired(f"that grant was not issued to uid {uid}")
            if grant.moved_to is not None:
                where = (f"its {grant.moved_to} lane" if grant.moved_to
                         else "its main host")
                raise GrantMoved(
                    f"grant {grant_id[:8]}… moved to {where} of driver {self.driver_name} "
                    "(its app's class changed): prepare there")
            return GrantCheck.LIVE
        if grant_id in self.ended:
            raise GrantRevoked(f"grant {grant_id[:8]}… has already ended")
        return GrantCheck.UNKNOWN

    def issue(self, grant_id: str, uid: int, request_id: int) -> bool:
        """Record a grant npud issued; False if there is none or it is known already."""
        if not grant_id or grant_id in self.live:
            return False
        self.live[grant_id] = Grant(grant_id, uid, request_id)
        self.ended.pop(grant_id, None)
        return True

    def end(self, grant_id: str, revoked: bool) -> Grant | None:
        """The grant ended: remembered as ended; the live one, if it was live."""
        grant = self.live.pop(grant_id, None)
        self.ended[grant_id] = revoked
        self.ended.move_to_end(grant_id)
        while len(self.ended) > self.keep:
            self.ended.popitem(last=False)
        return grant

    def end_all(self) -> None:
        """Every live grant ends as revoked (npud stayed away past the orphan grace)."""
        for grant_id in sorted(self.live):
            self.live[grant_id].models.clear()
            self.end(grant_id, True)

    def held(self, model_bytes: dict[int, int]) -> list[tuple[str, int, int, int, int]]:
        """(grant_id, uid, request_id, memory bytes, models) of every live grant, given each
        live model's bytes: what a newly attached npud adopts."""
        out = []
        for gid in sorted(self.live):
            g = self.live[gid]
            nbytes = sum(model_bytes[m] for m in g.models if m in model_bytes)
            out.append((gid, g.uid, g.request_id, nbytes, len(g.models)))
        return out

    def bury(self, model_id: int, conn: int, why: str) -> None:
        self.tombstones[model_id] = (conn, why)
        while len(self.tombstones) > self.keep:
            self.tombstones.popitem(last=False)

    def revoked(self, model_id: int, conn: int) -> str | None:
        """Why ``conn``'s model ``model_id`` was dropped, if a grant ending dropped it."""
        tomb = self.tombstones.get(model_id)
        return tomb[1] if tomb is not None and tomb[0] == conn else None
