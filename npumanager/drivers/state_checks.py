"""The invariants of :class:`~npumanager.drivers.state.DriverState` (``validate()``).

Tests run this after every event; it reads the state's private tables, which is
why it lives next to it rather than in the tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npumanager.constants import ThermalStatus
from npumanager.drivers.bounds import Holdings
from npumanager.drivers.classes import ExecClass
from npumanager.drivers.events import JobState

if TYPE_CHECKING:
    from npumanager.drivers.state import DriverState


def validate_driver_state(s: DriverState) -> None:
    q = s._queue
    q.check()
    queued = {id(j) for j in q.queued()}
    running = {id(j) for j in q.running.values()}
    # Every live job is in exactly one place: the queue or a channel.
    for ticket, job in s._jobs.items():
        assert job.ticket == ticket, job
        assert (id(job) in queued) != (id(job) in running), f"{job}: queued and running"
        assert (job.state is JobState.RUNNING) == (id(job) in running), job
        assert 0 <= job.step < job.steps, f"{job}: step out of range"
        assert job.state is not JobState.PAUSED or job.step > 0, f"{job}: paused before a step"
        assert job.cancel_reason is None or job.state is JobState.RUNNING, (
            f"{job}: cancel pending but not running")
        model = s._models.get(job.model_id) or s._releasing.get(job.model_id)
        assert model is not None and job in model.jobs, f"{job}: not listed by its model"
        if job.model_id in s._releasing:
            assert job.cancel_reason is not None, f"{job}: its model was dropped, it runs on"
        client = s._clients.get(job.conn)
        if client is not None:
            assert job in client.jobs, f"{job}: not listed by its connection"
        else:
            assert job.cancel_reason is not None, f"{job}: its connection is gone, it runs on"
    assert len(queued) + len(running) == len(s._jobs), "a queued or running job is not live"
    # A model marked moved is live, under a live grant that moved there (drivers/state_models).
    for model_id, lane in s.moved.items():
        model = s._models.get(model_id)
        assert model is not None and model.grant_id is not None, f"moved {model_id}: not live"
        grant = s.grants.live.get(model.grant_id)
        assert grant is not None and grant.moved_to == lane, f"moved {model_id}: not its grant's"
    # Work conservation: no free channel while work that may run waits.
    cutoff = s._cutoff
    waiting = [j for j in q.queued() if cutoff is None or j.info.effective_priority <= cutoff]
    if s.quiet is not None and s.quiet.holding:  # background work held by the window
        waiting = [j for j in waiting if j.cls is ExecClass.FOREGROUND]
    if q.reserved:  # background work may wait while only kept channels are free
        bg_room = q.channels - q.reserved - sum(
            1 for j in q.running.values() if j.cls is ExecClass.BACKGROUND)
        waiting = [j for j in waiting if j.cls is ExecClass.FOREGROUND or bg_room > 0]
    assert not (waiting and q.free()), f"{q.free()} channels free while {waiting} wait"
    hold = s.load_hold
    if hold is not None and hold.stopped_at is not None:
        # A stopped compile is continued by a timer at the latest: a stop is bounded.
        assert s._load_at is not None and s._load_at <= hold.stopped_at + hold.max_stop_s, (
            f"compile stopped at {hold.stopped_at} with no timer to end it ({s._load_at})")
    expected = s.params.thermal_cutoff if s.thermal >= ThermalStatus.CRITICAL else None
    assert cutoff == expected, f"cutoff {cutoff} at thermal {s.thermal.name}"
    # Ids only grow; nothing is in use twice.
    ids = [j.info.id for j in s._jobs.values()]
    assert len(set(ids)) == len(ids), "a work id is used twice"
    # Connections own their models, pools and jobs.
    for conn, client in s._clients.items():
        assert client.conn == conn
        for model_id in client.models:
            model = s._models.get(model_id)
            assert model is not None and model.conn == conn, f"conn {conn}: model {model_id}"
        for job in client.jobs:
            assert s._jobs.get(job.ticket) is job, f"conn {conn}: {job} is not live"
    pools = [p for c in s._clients.values() for p in c.pools]
    assert len(set(pools)) == len(pools), "a pool id is owned twice"
    for model_id, model in s._models.items():
        assert model.model_id == model_id
        assert model_id not in s._releasing, f"model {model_id} live and releasing"
        client = s._clients.get(model.conn)
        assert client is not None and model_id in client.models, (
            f"model {model_id}: its connection does not list it")
        if model.grant_id is not None:
            grant = s.grants.live.get(model.grant_id)
            assert grant is not None and model_id in grant.models, (
                f"model {model_id} lives on under an ended grant")
        for job in model.jobs:
            assert s._jobs.get(job.ticket) is job, f"model {model_id}: {job} is not live"
    for model_id, model in s._releasing.items():
        assert model.jobs, f"model {model_id} waits to be released for no running step"
        assert all(j.state is JobState.RUNNING for j in model.jobs)
    for grant_id, grant in s.grants.live.items():
        assert grant.grant_id == grant_id
        assert grant_id not in s.grants.ended, f"grant {grant_id} live and ended"
        for model_id in grant.models:
            model = s._models.get(model_id)
            assert model is not None and model.grant_id == grant_id, (
                f"grant {grant_id}: model {model_id}")
    # Debounce: bursts count exactly the live work per uid; a pending end has a timer.
    live: dict[int, int] = {}
    for job in s._jobs.values():
        live[job.info.uid] = live.get(job.info.uid, 0) + 1
    s._debounce.check(live)
    deadline = s._debounce.next_deadline()
    if deadline is not None:
        assert s.listening, "an end is pending while nobody listens"
        assert s._timer_at is not None and s._timer_at <= deadline, (
            f"no timer armed for the debounce deadline {deadline}")
    # Bounds: the ledger says exactly what the records hold, and nobody is past a bound.
    want: dict[int, Holdings] = {}
    for job in s._jobs.values():
        want.setdefault(job.info.uid, Holdings()).jobs += 1
    for model in s._models.values():
        h = want.setdefault(model.uid, Holdings())
        h.models += 1
        h.model_bytes += model.memory_bytes
    for rec in s._prepares.values():
        h = want.setdefault(rec.uid, Holdings())
        h.prepares += 1
        h.prepare_bytes += rec.nbytes
    for client in s._clients.values():
        for size in client.pools.values():
            h = want.setdefault(client.uid, Holdings())
            h.pools += 1
            h.pool_bytes += size
    held = s.ledger.held()
    assert held == want, f"ledger {held} != records {want}"
    lim = s.params.limits
    for uid, h in held.items():
        for have, bound in ((h.jobs, lim.max_jobs_per_uid), (h.pools, lim.max_pools_per_uid),
                            (h.models + h.prepares, lim.max_models_per_uid),
                            (h.pool_bytes, lim.max_pool_bytes_per_uid),
                            (h.model_bytes, lim.max_model_bytes_per_uid),
                            (h.prepare_bytes, lim.max_prepare_bytes_per_uid)):
            assert bound <= 0 or have <= bound, f"uid {uid} is past a bound: {h}"
    per_conn_jobs, per_conn_pools = lim.max_jobs_per_connection, lim.max_pools_per_connection
    for client in s._clients.values():
        assert per_conn_jobs <= 0 or len(client.jobs) <= per_conn_jobs, client
        assert per_conn_pools <= 0 or len(client.pools) <= per_conn_pools, client
    for job in s._jobs.values():
        assert lim.max_steps <= 0 or job.steps <= lim.max_steps, job
    # The manager link: orphaned only while no manager is attached.
    assert s.orphaned_at is None or not s.manager_attached, "orphaned with a manager"
