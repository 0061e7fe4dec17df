"""The conformance checks as pytest tests: subclass HalConformance, give a target."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.testing.conformance.checks import CHECKS
from npumanager.testing.conformance.harness import ConformanceTarget, Session
from npumanager.testing.conformance.restart import check_driver_restart_and_table_push


class HalConformance:
    """Every check is one test; the test module provides a ``conformance_target`` fixture
    (module or class scope: one running driver for all checks)."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_session(cls, conformance_target: ConformanceTarget) -> Iterator[Session]:
        session = Session(conformance_target)
        try:
            yield session
        finally:
            session.close()

    @pytest.mark.slow
    @pytest.mark.parametrize("check_name", list(CHECKS))
    def test_hal_conformance(self, conformance_session: Session, check_name: str) -> None:
        CHECKS[check_name](conformance_session)

    @pytest.mark.slow
    def test_driver_restart_and_table_push(self, conformance_target: ConformanceTarget
                                           ) -> None:
        if conformance_target.plugin is None:
            pytest.skip("the target names no plugin for npud's supervisor to start")
        d = Path(tempfile.mkdtemp(prefix="npu-conf-", dir="/tmp"))
        os.chmod(d, 0o755)
        try:
            check_driver_restart_and_table_push(conformance_target, d)
        finally:
            import shutil

            shutil.rmtree(d, ignore_errors=True)
