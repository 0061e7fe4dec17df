"""Grants, prepares, models and the manager link: what :class:`~.state.DriverState`
admits and releases (a mixin of it, split out of state.py by topic; pure, like it).

* A model is prepared under a live grant of the preparing uid (when admission is
  enforced) and within the uid's bounds; the bytes a prepare reads are charged while it
  runs. A grant that ends (or is revoked) releases its models: their work is cancelled
  (CANCELLED_SYSTEM when revoked, and the model is buried so a later call says why).
* Once npud has attached and then gone away nothing new is loaded
  (NoManagerAttached); after ``orphan_grace_s`` every model is released unless a manager
  attaches again first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npumanager.drivers import events as ev
from npumanager.drivers.records import ModelRecord, PrepareRecord
from npumanager.errors import GrantRequired, GrantRevoked, InvalidArgument, NoManagerAttached
from npumanager.hal.types import EndReason
from npumanager.tensorio.specs import InputCheck

if TYPE_CHECKING:
    import itertools

    from npumanager.drivers.admission import Grants
    from npumanager.drivers.bounds import Ledger
    from npumanager.drivers.classes import ExecClass
    from npumanager.drivers.records import ClientRecord, DriverParams
    from npumanager.drivers.runqueue import Job, RunQueue

ORPHAN_TIMER = "orphan"


class ModelRules:
    """The grant, prepare, model and manager-link handlers of DriverState."""

    if TYPE_CHECKING:  # DriverState's, declared for the type checker
        params: DriverParams
        enforce_admission: bool
        manager_attached: bool
        orphaned_at: float | None
        grants: Grants
        ledger: Ledger
        _clients: dict[int, ClientRecord]
        _models: dict[int, ModelRecord]
        moved: dict[int, str]
        _releasing: dict[int, ModelRecord]
        _prepares: dict[int, PrepareRecord]
        _queue: RunQueue
        _model_ids: itertools.count[int]
        _out: list[ev.Instruction]
        _ev: ev.Event | None

        def _client(self, conn: int) -> ClientRecord: ...
        def model_class(self, uid: int) -> ExecClass: ...
        def _cancel(self, job: Job, reason: EndReason) -> None: ...
        def _decide(self, kind: str, key: int | str, what: str, **details: object) -> None: ...

    # --- the manager link ------------------------------------------------------------

    def _on_manager_attached(self, e: ev.ManagerAttached) -> None:
        self.manager_attached = True
        self.enforce_admission = e.enforce_admission
        if self.orphaned_at is not None:
            self._decide("driver", self.params.name, "manager back",
                         after_s=round(e.now - self.orphaned_at, 3))
            self.orphaned_at = None
            self._out.append(ev.CancelTimer(ORPHAN_TIMER))

    def _on_manager_gone(self, e: ev.ManagerGone) -> None:
        if not self.manager_attached:
            return
        self.manager_attached = False
        self.orphaned_at = e.now
        grace = self.params.orphan_grace_s
        self._decide("driver", self.params.name, "manager gone", grace_s=grace,
                     models=len(self._models))
        self._out.append(ev.ArmTimer(ORPHAN_TIMER, e.now + grace))

    def _on_launcher_gone(self, e: ev.LauncherGone) -> None:
        """npud exited while this device had no manager: it never attached (npud was
        SIGKILLed between the host's ready line and its attach), or this device's link had
        not attached yet when npud stopped (a device of a multi-device host). Nobody's
        ManagerGone will start its grace, so it starts here: a new npud that attaches
        within it adopts the host, else the host releases what it holds and exits, as an
        orphan does. A device with a manager, or whose grace runs already, is unchanged."""
        if self.manager_attached or self.orphaned_at is not None:
            return
        self.orphaned_at = e.now
        grace = self.params.orphan_grace_s
        self._decide("driver", self.params.name, "npud gone before it attached",
                     grace_s=grace, models=len(self._models))
        self._out.append(ev.ArmTimer(ORPHAN_TIMER, e.now + grace))

    def _orphan_grace_over(self) -> None:
        """Nobody re-attached in time: nothing runs outside a manager's budget any more."""
        e = self._ev
        assert e is not None and self.orphaned_at is not None
        grace = self.params.orphan_grace_s
        why = (f"npud went away and no manager attached again within {grace:g} s; "
               "the model was released")
        models = sorted(self._models)
        self._decide("driver", self.params.name, "orphan grace over", models=len(models))
        self.grants.end_all()
        for model_id in models:
            self._drop_model(self._models[model_id], why)
        self._out.append(ev.GraceExpired(len(models)))

    # --- grants and models ---------------------------------------------------------------

    def _on_grant_issued(self, e: ev.GrantIssued) -> None:
        if self.grants.issue(e.grant_id, e.uid, e.request_id):
            self._decide("grant", e.grant_id, "issued", uid=e.uid, request_id=e.request_id)
            return
        grant = self.grants.live.get(e.grant_id)
        if grant is not None and grant.moved_to is not None:
            # It moved back before its app followed it away: valid here again, and its
            # models' answers stop saying otherwise.
            grant.moved_to = None
            for model_id in grant.models:
                self.moved.pop(model_id, None)
            self._decide("grant", e.grant_id, "moved back", models=sorted(grant.models))

    def _on_grant_moved(self, e: ev.GrantMoved) -> None:
        """npud's table puts the grant on the device's other host now. Its models here
        keep serving (an app that does not follow is not failed), each answer names the
        host to prepare on (``moved``); a prepare under it here is refused (Grants.check).
        Its end still comes here. O(models of the grant): a flood of moves costs no
        more per move."""
        grant = self.grants.live.get(e.grant_id)
        if grant is None:
            return
        grant.moved_to = e.lane
        for model_id in grant.models:
            self.moved[model_id] = e.lane
        self._decide("grant", e.grant_id, "moved", lane=e.lane or "main",
                     models=sorted(grant.models))

    def _on_grant_ended(self, e: ev.GrantEnded) -> None:
        grant = self.grants.end(e.grant_id, e.revoked)
        if grant is None:
            return
        self._decide("grant", e.grant_id, "revoked" if e.revoked else "ended",
                     models=sorted(grant.models))
        gid = e.grant_id[:8]
        why = (f"grant {gid}… was revoked by npud; the model was released" if e.revoked
               else f"grant {gid}… has ended; the model was released")
        for model_id in sorted(grant.models):
            self._drop_model(self._models[model_id], why)

    def check_attached(self, now: float) -> None:
        """NoManagerAttached once npud went away (until one attaches again): nothing new
        is loaded. Asked at a prepare's start and by a prepare waiting for its grant,
        which no npud will send now."""
        if self.orphaned_at is not None:
            raise NoManagerAttached(
                f"driver {self.params.name} has no manager attached (npud went away "
                f"{now - self.orphaned_at:.1f} s ago): it loads nothing new until npud is "
                "back")

    def _on_prepare_begun(self, e: ev.PrepareBegun) -> None:
        client = self._client(e.conn)
        self.check_attached(e.now)
        if e.prepare_id in self._prepares:
            raise InvalidArgument(f"prepare {e.prepare_id} is already in progress")
        if e.nbytes < 0:
            raise InvalidArgument(f"a prepare cannot read {e.nbytes} bytes")
        uid = client.uid
        self.ledger.check_prepare(uid, e.nbytes)
        self._prepares[e.prepare_id] = PrepareRecord(
            e.prepare_id, e.conn, uid, e.nbytes, self.model_class(uid).value == "background")
        self.ledger.add_prepare(uid, e.nbytes)
        self._lanes_for_loads()

    def _on_prepare_ended(self, e: ev.PrepareEnded) -> None:
        self._end_prepare(e.prepare_id)

    def _end_prepare(self, prepare_id: int) -> None:
        rec = self._prepares.pop(prepare_id, None)
        if rec is not None:
            self.ledger.drop_prepare(rec.uid, rec.nbytes)
            self._lanes_for_loads()

    def _lanes_for_loads(self) -> None:
        """``lanes_except_loads``: background steps started while a BACKGROUND model
        prepares get no lane (they run on the shared, unpinned background threads)."""
        if self.params.lanes_except_loads:
            self._queue.lanes_paused = any(p.background for p in self._prepares.values())

    def _on_model_prepared(self, e: ev.ModelPrepared) -> None:
        client = self._client(e.conn)
        uid = client.uid
        grant = None
        if e.grant_id is not None:
            grant = self.grants.live.get(e.grant_id)
            if grant is None:
                raise GrantRevoked(f"grant {e.grant_id[:8]}… ended while the model was prepared")
            if grant.uid != uid:
                raise GrantRequired(f"that grant was not issued to uid {uid}")
        if e.memory_bytes < 0:
            raise InvalidArgument(f"a model cannot hold {e.memory_bytes} bytes")
        begun = self._prepares.get(e.prepare_id) if e.prepare_id else None
        self.ledger.check_model(uid, e.memory_bytes,
                                counted=begun is not None and begun.uid == uid)
        # Admitted: nothing below raises.
        self._end_prepare(e.prepare_id)
        self.ledger.add_model(uid, e.memory_bytes)
        model_id = next(self._model_ids)
        check = InputCheck(list(e.input_specs)) if e.input_specs else None
        self._models[model_id] = ModelRecord(model_id, e.conn, uid, e.grant_id,
                                             e.memory_bytes, e.inputs, e.outputs, check)
        client.models.add(model_id)
        self._out.append(ev.ModelReady(e.conn, model_id))
        if grant is not None:
            grant.models.add(model_id)
            if grant.moved_to is not None:  # (its prepare began before the grant moved)
                self.moved[model_id] = grant.moved_to
            if self.manager_attached:
                self._out.append(ev.ReportModelMemory(grant.grant_id, e.memory_bytes))
        self._decide("model", model_id, "prepared", uid=client.uid, grant=e.grant_id,
                     memory_bytes=e.memory_bytes)

    def _on_model_released(self, e: ev.ModelReleased) -> None:
        model = self._models.get(e.model_id)
        if model is not None and model.conn == e.conn:
            self._drop_model(model, None)

    def _drop_model(self, model: ModelRecord, revoked: str | None) -> None:
        """Take the model out of service: its work is cancelled (CANCELLED_SYSTEM when
        its grant ended) and it is released once no step of it runs any more."""
        del self._models[model.model_id]
        self.ledger.drop_model(model.uid, model.memory_bytes)
        if self.moved.pop(model.model_id, None) is not None and revoked is None \
                and model.grant_id is not None and self.manager_attached:
            # Its app followed the grant to the other host and released it here: npud
            # counts the grant's memory once, the copy there.
            self._out.append(ev.ReportModelMemory(model.grant_id, model.memory_bytes,
                                                  freed=True))
        client = self._clients.get(model.conn)
        if client is not None:
            client.models.discard(model.model_id)
        if model.grant_id is not None:
            grant = self.grants.live.get(model.grant_id)
            if grant is not None:
                grant.models.discard(model.model_id)
        reason = EndReason.CANCELLED_USER
        if revoked is not None:
            self.grants.bury(model.model_id, model.conn, revoked)
            reason = EndReason.CANCELLED_SYSTEM
        self._decide("model", model.model_id, "revoked" if revoked else "released",
                     jobs=len(model.jobs))
        # Released once its last job ends (_finish), at once when it has none running.
        self._releasing[model.model_id] = model
        for job in sorted(model.jobs, key=lambda j: j.info.id):
            job.revoked = revoked
            self._cancel(job, reason)
        if not model.jobs and self._releasing.pop(model.model_id, None) is not None:
            self._out.append(ev.ReleaseModel(model.model_id))
