"""ONNX's backend node test cases through a real driver host, against the backend in-process.

Every case the backend passes in-process (ONNX's expected outputs, ONNX's own
check) must pass through the driver with the same Python types, dtypes, shapes
and values; every case it fails in-process must fail through the driver too,
and is listed with the backend's reason in tests/drivers/data/ (checked while
the installed versions are the ones the list was written with: a failure that
is not listed fails the test; a listed case that passes on this machine is only
reported. Rewrite the list with
``python -m npumanager.testing.onnx_node_suite --backend NAME --write FILE``).
One driver host serves all cases of a backend; each backend is one test, so the
two run on separate workers.

Every run takes a fixed, representative subset (onnx_node_suite.SUBSETS: every
category; ~250 cases for the reference driver, ~70 for OpenVINO);
NPU_ONNX_NODE_SUITE=all takes all ~1,900 (minutes on 2 cores), as does
``python -m npumanager.testing.onnx_node_suite``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from npumanager import nn
from npumanager.testing import onnx_node_suite as suite
from npumanager.testing.driver_host import running_driver
from tests.drivers.backends import needs_openvino

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

DATA = Path(__file__).parent / "data"


WHOLE = os.environ.get("NPU_ONNX_NODE_SUITE") == "all"


def _run(backend: str) -> suite.Report:
    cases = suite.collect() if WHOLE else suite.collect(modules=suite.SUBSETS[backend])
    rt = Path(tempfile.mkdtemp(prefix="npu-rt-", dir="/tmp"))
    st = Path(tempfile.mkdtemp(prefix="npu-st-", dir="/tmp"))
    try:
        with (running_driver(backend, rt, st, args=["--no-enforce-admission"]),
              nn.device(backend, rt) as dev):
            return suite.run_suite(cases, backend, dev)
    finally:
        shutil.rmtree(rt, ignore_errors=True)
        shutil.rmtree(st, ignore_errors=True)


def _check(report: suite.Report) -> None:
    print(f"\nONNX node suite, {report.backend}:\n{report.table()}")
    failing = report.by_verdict(suite.DRIVER_FAILS)
    assert not failing, (f"{len(failing)} cases {report.backend} passes in-process fail "
                         "through the driver:\n" + "\n".join(f"{r.case.name}: {r.reason}"
                                                             for r in failing))
    passed_only_via_driver = [r.case.name for r in report.by_verdict(suite.BACKEND_FAILS)
                              if not r.driver_failed_too]
    assert not passed_only_via_driver, ("in-process failures the driver does not reproduce: "
                                        + ", ".join(passed_only_via_driver))
    # Not vacuous: most plain-tensor cases pass in-process, and so through the driver.
    plain = [r for r in report.results if "tensors" in r.case.categories]
    assert sum(r.verdict == suite.PASS for r in plain) > len(plain) // 2
    # The subset stays representative: every category ONNX's node cases have (they have
    # no maps: tests/nn/test_values.py takes ZipMap's through the driver).
    ran_categories = {c for r in report.results for c in r.case.categories}
    assert ran_categories >= set(suite.CATEGORIES) - {"maps"}, ran_categories
    listed_file = DATA / f"onnx_node_suite_{report.backend}.txt"
    header, listed = suite.read_failures(listed_file.read_text())
    found = {r.case.name: r.reason for r in report.by_verdict(suite.BACKEND_FAILS)}
    ran = {r.case.name for r in report.results}
    now_passing = sorted((set(listed) & ran) - set(found))
    if now_passing:  # a newer backend, or a machine with more (a locale StringNormalizer wants)
        print(f"listed in {listed_file.name} but passing here: {', '.join(now_passing)}")
    if suite.versions(report.backend) in header:
        unlisted = {n: found[n] for n in sorted(set(found) - set(listed))}
        assert not unlisted, (f"{report.backend} fails these in-process but "
                              f"{listed_file.name} does not list them: {unlisted}")
    else:
        print(f"{listed_file.name} lists the failures of other versions ({header}); "
              f"found {len(found)} with {suite.versions(report.backend)}")


def test_onnx_runtime_node_suite_runs_identically_through_the_reference_driver() -> None:
    _check(_run("reference"))


@needs_openvino
def test_openvino_node_suite_runs_identically_through_the_openvino_driver() -> None:
    _check(_run("openvino"))
