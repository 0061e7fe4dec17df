"""The openvino and torch drivers pass the same cache security suite as the reference driver.

Each class holds one driver for all its cases; the torch driver compiles each of its
two models once (AOTInductor takes seconds) and reuses the package afterwards.
"""

from __future__ import annotations

import pytest

from npumanager.testing.cache_security import CacheBackend, CacheSecuritySuite
from tests.drivers.backends import (
    inductor_dir,
    make_openvino,
    make_torch,
    needs_openvino,
    needs_torch,
)


@needs_openvino
class TestOpenVinoCacheSecurity(CacheSecuritySuite):
    cache_kinds = ("model",)  # the exported blob holds the weights: no data cache files

    @pytest.fixture(scope="class", params=[(1, 0), (2, 0)], ids=["1+0", "2+0"])
    @classmethod
    def cache_backend(cls, request: pytest.FixtureRequest) -> CacheBackend:
        from npumanager.testing.backend_models import onnx_linear

        return CacheBackend("openvino", make_openvino, onnx_linear(1), onnx_linear(2),
                            counts=request.param)


@needs_torch
@pytest.mark.timeout(900)  # the first AOTInductor compile of a process takes tens of seconds
class TestTorchCacheSecurity(CacheSecuritySuite):
    cache_kinds = ("model",)  # the package holds the weights: no data cache files

    @pytest.fixture(scope="class")
    @classmethod
    def cache_backend(cls) -> CacheBackend:
        from npumanager.testing.backend_models import torch_linear

        return CacheBackend("torch", make_torch, torch_linear(1), torch_linear(2),
                            options={"inductor_cache_dir": str(inductor_dir())})
