"""The HAL conformance suite (the VTS analog), public so a vendor runs it on their driver.

Without pytest::

    report = run_conformance(target)          # {check name: None or the failure}

With pytest, subclass :class:`HalConformance` and provide a ``conformance_target``
fixture (see ``tests/drivers/test_conformance_reference.py``)::

    class TestMyDriver(HalConformance):
        @pytest.fixture(scope="class")
        def conformance_target(self): ...  # start the driver, yield a ConformanceTarget
"""

from __future__ import annotations

import tempfile
import traceback
from pathlib import Path

from npumanager.testing.conformance.checks import CHECKS
from npumanager.testing.conformance.harness import ConformanceTarget, EventLog, Session
from npumanager.testing.conformance.restart import check_driver_restart_and_table_push

try:
    from npumanager.testing.conformance.pytest_suite import HalConformance
except ImportError:  # pytest is not installed: run_conformance still works
    HalConformance = None  # type: ignore[assignment,misc]


def run_conformance(target: ConformanceTarget, *, restart: bool = True
                    ) -> dict[str, BaseException | None]:
    """Run every check against the running driver ``target``; None means passed."""
    report: dict[str, BaseException | None] = {}
    session = Session(target)
    try:
        for name, fn in CHECKS.items():
            try:
                fn(session)
                report[name] = None
            except BaseException as exc:
                traceback.print_exc()
                report[name] = exc
    finally:
        session.close()
    if restart and target.plugin is not None:
        with tempfile.TemporaryDirectory(prefix="npu-conf-", dir="/tmp") as d:
            try:
                check_driver_restart_and_table_push(target, Path(d))
                report["driver_restart_and_table_push"] = None
            except BaseException as exc:
                report["driver_restart_and_table_push"] = exc
    return report


__all__ = ["CHECKS", "ConformanceTarget", "EventLog", "HalConformance", "Session",
           "check_driver_restart_and_table_push", "run_conformance"]
