"""How npud starts a driver host: one [[driver]] entry plus the manager keys it needs.

Kept apart from the driver host itself so npud can build and JSON-encode a
host's config (``npu driver NAME --host-config-json``) without importing the
host (numpy, ONNX Runtime).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from npumanager.config import Config

#: Tensors above this many bytes go through a shared-memory pool when the client has one.
DEFAULT_INLINE_LIMIT = 64 * 1024
#: The [manager] keys that bound what one uid may make a driver host hold
#: (npumanager.drivers.bounds.Limits has a field of each name).
DRIVER_LIMIT_KEYS = ("max_steps", "max_jobs_per_uid", "max_jobs_per_connection",
                     "max_models_per_uid", "max_model_bytes_per_uid",
                     "max_prepare_bytes_per_uid", "max_pools_per_uid",
                     "max_pools_per_connection", "max_pool_bytes_per_uid")


@dataclass
class HostConfig:
    """A [[driver]] entry and the manager keys the host needs."""

    name: str
    plugin: str = "reference"
    channels: int = 2
    enforce_admission: bool = True
    thermal_cutoff: int = 500
    inline_limit: int = DEFAULT_INLINE_LIMIT
    grant_wait_s: float = 0.5
    inline_run_us: float = 150.0
    inline_idle_run_us: float = 5000.0
    max_model_bytes: int = 4 << 30
    socket_mode: int = 0o666
    admin_group: str | int | None = None
    max_frame: int = 1 << 20
    cache_max_entries: int = 4096
    cache_max_entries_per_uid: int = 512
    #: [manager] bounds (DRIVER_LIMIT_KEYS) that differ from the built-in defaults.
    limits: dict[str, int] = field(default_factory=dict)
    orphan_grace_s: float = 10.0
    #: Execution classes (drivers/classes.py): the foreground threshold, channels kept
    #: for foreground work, and how background threads are lowered ("idle", "nice",
    #: "normal") with the nice value for "nice".
    foreground_priority: int = 200
    reserved_channels: int = 0
    background_sched: str = "nice"
    background_nice: int = 10
    options: dict[str, Any] = field(default_factory=dict)
    #: Its device's index in ``nn.devices()`` (the [[driver]] entry's position): what
    #: ``WorkInfo.device_number`` says, so npud charges work to the right device.
    device_number: int = 0
    #: The [fleet] section (the fleet cache tier; off unless it names Redis and trusted keys).
    fleet: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Config, name: str) -> HostConfig:
        listed = cfg.drivers()
        entries = [d for d in listed if d.get("name") == name]
        number = 0
        if entries:
            d = entries[0]
            number = listed.index(d)
        else:  # `npu driver X` for a driver the config does not list: X is the plugin
            template = Config().drivers()[0]
            d = {**template, "name": name, "plugin": name}
        mgr = cfg.section("manager")
        return cls(
            name=name,
            plugin=str(d.get("plugin", name)),
            channels=int(d.get("channels", 2)),
            enforce_admission=bool(mgr.get("enforce_admission", True)),
            thermal_cutoff=int(d.get("thermal_holdback_priority", 500)),
            inline_limit=int(d.get("inline_limit_bytes", DEFAULT_INLINE_LIMIT)),
            grant_wait_s=float(d.get("grant_wait_s", 0.5)),
            inline_run_us=float(d.get("inline_run_us", 150.0)),
            inline_idle_run_us=float(d.get("inline_idle_run_us", 5000.0)),
            max_model_bytes=int(d.get("max_model_bytes", 4 << 30)),
            socket_mode=int(mgr.get("socket_mode", 0o666)),
            admin_group=mgr.get("admin_group") or None,
            max_frame=int(mgr.get("max_frame", 1 << 20)),
            cache_max_entries=int(cfg.section("cache").get("max_entries", 4096)),
            cache_max_entries_per_uid=int(cfg.section("cache").get("max_entries_per_uid", 512)),
            limits={k: int(mgr[k]) for k in DRIVER_LIMIT_KEYS if k in mgr},
            orphan_grace_s=float(mgr.get("orphan_grace_s", 10.0)),
            foreground_priority=int(d.get("foreground_priority", 200)),
            reserved_channels=int(d.get("reserved_channels", 0)),
            background_sched=str(d.get("background_sched", "nice")),
            background_nice=int(d.get("background_nice", 10)),
            options=dict(d.get("options", {})),
            device_number=number,
            fleet=dict(cfg.section("fleet")),
        )
