"""npumanager.thermal: where temperatures come from and what status they mean.

- :mod:`.sources` — thermal zones, hwmon, NVML, the drivers' own models.
- :mod:`.status` — the pure ladder logic: thresholds, hysteresis, dwell, headroom, trend.
- :mod:`.monitor` — :class:`ThermalMonitor`, which npud polls; the admin override.
- :mod:`.render` — plain-text ``npu thermal status``.

The governor's actions (budget scaling, unloads with ``UnloadReason.THERMAL``)
live in :class:`npumanager.service.state.ManagerState`.
"""

from npumanager.thermal.monitor import ThermalMonitor
from npumanager.thermal.render import render_thermal

__all__ = ["ThermalMonitor", "render_thermal"]
