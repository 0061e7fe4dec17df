"""``background_load`` (drivers/prepare.py): the thread on which the host builds a
BACKGROUND model's session from compiled artifacts (the compile child's, or a verified
cache entry's) is lowered as ``background_sched`` says, or ("normal") one of its own at
normal priority; a foreground model's stays on the normal compile pool either way. Real
compile child, real ONNX Runtime; the policy is read on the thread that built the session."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager.drivers.base import CompileOptions, PreparedModel
from npumanager.drivers.prepare import Preparer
from npumanager.drivers.reference import ReferenceDriver
from npumanager.hal.host_config import HostConfig
from npumanager.proto.v1 import driver_pb2 as pb
from tests.drivers.test_compile_worker import in_process, mlp, prepare


class Watched(ReferenceDriver):
    """The reference driver, noting the policy and name of each thread that loads."""

    def __init__(self) -> None:
        super().__init__({})
        self.loads: list[tuple[str, int]] = []

    def _note(self) -> None:
        self.loads.append((threading.current_thread().name,
                           os.sched_getscheduler(threading.get_native_id())))

    def compile_in_worker(self, worker: Any, onnx: bytes | tuple[int, int],
                          options: CompileOptions, caching: bool,
                          max_bytes: int) -> PreparedModel | None:
        self._note()
        return super().compile_in_worker(worker, onnx, options, caching, max_bytes)

    def load_artifacts(self, model_blobs: list[bytes], data_blobs: list[bytes],
                       options: CompileOptions) -> PreparedModel:
        self._note()
        return super().load_artifacts(model_blobs, data_blobs, options)


@pytest.mark.parametrize("where", ["lowered", "normal"])
def test_a_background_load_runs_where_the_config_says(tmp_path: Path, where: str) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    driver = Watched()
    # nice, not SCHED_IDLE: an idle child may starve while the suite keeps both cores busy.
    hc = HostConfig("reference", background_sched="nice", background_load=where)
    p = Preparer(hc, driver, driver.get_number_of_cache_files_needed(), state)
    fds = [os.memfd_create("m"), os.memfd_create("d")]
    try:
        onnx, token = mlp(), os.urandom(32)
        got = prepare(p, onnx, fds=fds, token=token)  # background: the compile child
        assert p.worker is not None and p.worker.started == 1
        msg = pb.PrepareModelFromCache(token=token, n_model_cache=1, n_data_cache=1,
                                       preference=1, priority=100)
        again = asyncio.run(p.prepare_from_cache(msg, fds, os.getuid(), background=True))
        fg = asyncio.run(p.prepare_from_cache(msg, fds, os.getuid(), background=False))
        x = np.ones((2, 64), np.float32)
        for model in (got.model, again.model, fg.model):
            np.testing.assert_allclose(model.run({"x": x})["y"], in_process(onnx, x),
                                       rtol=1e-5, atol=1e-6)
    finally:
        for fd in fds:
            os.close(fd)
        p.close()
    (worker_name, worker_pol), (cache_name, cache_pol), (fg_name, fg_pol) = driver.loads
    if where == "normal":
        assert "bgload" in worker_name and "bgload" in cache_name, driver.loads
        assert worker_pol == cache_pol == os.SCHED_OTHER
        assert os.getpriority(os.PRIO_PROCESS, 0) == 0
    else:
        assert "bgcompile" in worker_name and "bgcompile" in cache_name, driver.loads
    assert "bgload" not in fg_name and "bgcompile" not in fg_name and fg_pol == os.SCHED_OTHER


def test_an_unknown_place_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="background_load"):
        Preparer(HostConfig("reference", background_load="idle"), ReferenceDriver({}),
                 (1, 1), tmp_path)
