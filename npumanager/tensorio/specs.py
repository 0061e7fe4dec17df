"""A model input or output as the driver describes it and the client reads it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    """Name, numpy dtype name and shape (-1 = a dynamic dimension)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def static_nbytes(self) -> int | None:
        """Bytes of a tensor of this spec, or None while a dimension is dynamic."""
        if any(d < 0 for d in self.shape):
            return None
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize
