"""What one uid (and one connection) may make a driver host hold (pure, no I/O).

Every local user is hostile until proven otherwise, and a driver host serves
them all from one process: without bounds one uid could take its memory
(model bytes being read, prepared models, shared-memory pools), its address
space (20k pool mappings), or its queue (endless or countless jobs), and
every other app would starve. :class:`Limits` holds the bounds (config keys in
``[manager]``, see npumanager/defaults.toml); :class:`Holdings` is what one
uid holds now. A uid at a bound gets :class:`~npumanager.errors.LimitExceeded`
at once, naming the bound; every other uid is served as before.

Bytes are charged as the driver sees them, not as they cost the sender: a
pool or a model memfd by its size (fstat), so a sparse 1 GiB memfd that costs
its sender nothing counts as 1 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from npumanager.errors import LimitExceeded

GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Bounds a driver host keeps per uid and per connection (0 or less: no bound)."""

    #: Steps one execution may ask for (beyond: InvalidArgument).
    max_steps: int = 1_000_000
    #: Executions queued or running.
    max_jobs_per_uid: int = 1024
    max_jobs_per_connection: int = 256
    #: Prepared models, counting prepares in progress.
    max_models_per_uid: int = 256
    #: Memory of prepared models (as their backend reports it).
    max_model_bytes_per_uid: int = 64 * GiB
    #: Bytes being read for prepares in progress: model memfds, external data files and
    #: cache files, each by its size.
    max_prepare_bytes_per_uid: int = 8 * GiB
    #: Registered shared-memory pools, and their bytes.
    max_pools_per_uid: int = 1024
    max_pools_per_connection: int = 256
    max_pool_bytes_per_uid: int = 16 * GiB

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass(slots=True)
class Holdings:
    """What one uid holds in a driver host now."""

    jobs: int = 0
    models: int = 0
    model_bytes: int = 0
    prepares: int = 0
    prepare_bytes: int = 0
    pools: int = 0
    pool_bytes: int = 0

    def empty(self) -> bool:
        return not (self.jobs or self.models or self.prepares or self.pools
                    or self.model_bytes or self.prepare_bytes or self.pool_bytes)


def size(n: int) -> str:
    """Bytes for a message: ``1.5 GiB``, ``512 MiB``, ``4096 bytes``."""
    for unit, scale in (("GiB", GiB), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"


def check_count(have: int, bound: int, what: str, whose: str, driver: str) -> None:
    """LimitExceeded if one more ``what`` would pass ``bound``."""
    if 0 < bound <= have:
        raise LimitExceeded(f"{whose} already has {have} {what} on driver {driver} "
                            f"(the bound is {bound})")


def check_bytes(have: int, adding: int, bound: int, what: str, whose: str,
                driver: str) -> None:
    """LimitExceeded if ``adding`` more bytes of ``what`` would pass ``bound``."""
    if bound > 0 and have + adding > bound:
        raise LimitExceeded(f"{whose} has {size(have)} of {what} on driver {driver}; "
                            f"{size(adding)} more would pass the bound of {size(bound)}")


class Ledger:
    """What every uid holds, checked against :class:`Limits` before anything is charged.

    ``check_*`` raise LimitExceeded and change nothing; ``add_*``/``drop_*`` keep the
    counts (callers check first). A uid that holds nothing is forgotten."""

    def __init__(self, limits: Limits, driver: str) -> None:
        self.limits = limits
        self.driver = driver
        self._held: dict[int, Holdings] = {}

    def __repr__(self) -> str:
        return f"<Ledger {self.driver}: {len(self._held)} uids hold something>"

    def of(self, uid: int) -> Holdings:
        """What ``uid`` holds now (a copy)."""
        h = self._held.get(uid)
        return Holdings() if h is None else Holdings(
            **{k: getattr(h, k) for k in Holdings.__slots__})

    def held(self) -> dict[int, Holdings]:
        return {uid: self.of(uid) for uid in self._held}

    def _get(self, uid: int) -> Holdings:
        h = self._held.get(uid)
        if h is None:
            h = self._held[uid] = Holdings()
        return h

    def _put(self, uid: int, h: Holdings) -> None:
        if h.empty():
            self._held.pop(uid, None)

    # --- jobs
    def check_job(self, uid: int, conn_jobs: int) -> None:
        lim, h = self.limits, self._held.get(uid) or Holdings()
        check_count(conn_jobs, lim.max_jobs_per_connection, "executions queued or running",
                    "this connection", self.driver)
        check_count(h.jobs, lim.max_jobs_per_uid, "executions queued or running", f"uid {uid}",
                    self.driver)

    def add_job(self, uid: int) -> None:
        self._get(uid).jobs += 1

    def drop_job(self, uid: int) -> None:
        h = self._get(uid)
        h.jobs -= 1
        self._put(uid, h)

    # --- prepares and models
    def check_prepare(self, uid: int, nbytes: int) -> None:
        lim, h = self.limits, self._held.get(uid) or Holdings()
        check_count(h.models + h.prepares, lim.max_models_per_uid,
                    "models (prepared or being prepared)", f"uid {uid}", self.driver)
        check_bytes(h.prepare_bytes, nbytes, lim.max_prepare_bytes_per_uid,
                    "models being read for prepares", f"uid {uid}", self.driver)

    def add_prepare(self, uid: int, nbytes: int) -> None:
        h = self._get(uid)
        h.prepares += 1
        h.prepare_bytes += nbytes

    def drop_prepare(self, uid: int, nbytes: int) -> None:
        h = self._get(uid)
        h.prepares -= 1
        h.prepare_bytes -= nbytes
        self._put(uid, h)

    def check_model(self, uid: int, nbytes: int, *, counted: bool) -> None:
        """``counted``: the model's prepare already holds its slot among the models."""
        lim, h = self.limits, self._held.get(uid) or Holdings()
        if not counted:
            check_count(h.models + h.prepares, lim.max_models_per_uid,
                        "models (prepared or being prepared)", f"uid {uid}", self.driver)
        check_bytes(h.model_bytes, nbytes, lim.max_model_bytes_per_uid, "prepared models",
                    f"uid {uid}", self.driver)

    def add_model(self, uid: int, nbytes: int) -> None:
        h = self._get(uid)
        h.models += 1
        h.model_bytes += nbytes

    def drop_model(self, uid: int, nbytes: int) -> None:
        h = self._get(uid)
        h.models -= 1
        h.model_bytes -= nbytes
        self._put(uid, h)

    # --- pools
    def check_pool(self, uid: int, conn_pools: int, nbytes: int) -> None:
        lim, h = self.limits, self._held.get(uid) or Holdings()
        check_count(conn_pools, lim.max_pools_per_connection, "shared-memory pools",
                    "this connection", self.driver)
        check_count(h.pools, lim.max_pools_per_uid, "shared-memory pools", f"uid {uid}",
                    self.driver)
        check_bytes(h.pool_bytes, nbytes, lim.max_pool_bytes_per_uid, "shared-memory pools",
                    f"uid {uid}", self.driver)

    def add_pool(self, uid: int, nbytes: int) -> None:
        h = self._get(uid)
        h.pools += 1
        h.pool_bytes += nbytes

    def drop_pool(self, uid: int, nbytes: int) -> None:
        h = self._get(uid)
        h.pools -= 1
        h.pool_bytes -= nbytes
        self._put(uid, h)


__all__ = ["Holdings", "Ledger", "Limits", "check_bytes", "check_count", "size"]
