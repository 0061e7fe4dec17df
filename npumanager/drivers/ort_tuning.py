"""ONNX Runtime session options for the reference driver's BACKGROUND sessions
(``[[driver]] options``: ``graph_optimization_background``, ``mem_arena_background``,
``mem_pattern_background``), opt-ins measured for #15's embedder (bench/README.md: "ONNX
Runtime's session options for background sessions").

Why these: the contention bench's managed embedder is bound by one batch's latency, and
its run on one intra-op thread (12 kernels of ~14 µs) is a third of it; an arena, a
memory pattern or the graph's optimization level are the session-wide knobs that touch a
tiny kernel's fixed cost. Each applies on every path that builds a background session
(an eager compile, a compile with artifacts, the compile child's artifacts loaded, JIT);
the optimization level is a compile-time choice (the artifacts hold the optimized graph),
so it is also part of the driver's version, and so of the compilation cache's key.

Not an option: ``execution_mode`` parallel. ONNX Runtime (1.32) runs a session with
``inter_op_num_threads = 1`` (every session of this driver) sequentially whatever the
mode says (read back from the session: ORT_SEQUENTIAL), and the embedder's graph is a
chain (MatMul -> Tanh six times), so an inter-op pool would have nothing to run beside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: graph_optimization_background's values (ONNX Runtime's levels by name).
LEVELS = ("disabled", "basic", "extended", "all")


@dataclass(frozen=True, slots=True)
class SessionTuning:
    """What a background session's options change from the driver's defaults (None or
    True: ONNX Runtime's default, left alone)."""

    level: str | None = None
    mem_arena: bool = True
    mem_pattern: bool = True

    @classmethod
    def background(cls, options: Mapping[str, Any]) -> SessionTuning:
        """The tuning ``options`` (the driver's) ask of background sessions; ValueError
        for a value check-config refuses (a host started without the check)."""
        level = options.get("graph_optimization_background")
        if level is not None and level not in LEVELS:
            raise ValueError(f"graph_optimization_background = {level!r} must be one of "
                             f"{', '.join(LEVELS)}")
        return cls(None if level is None else str(level),
                   int(options.get("mem_arena_background", 1)) != 0,
                   int(options.get("mem_pattern_background", 1)) != 0)

    @property
    def default(self) -> bool:
        return self == SessionTuning()

    def version_tag(self) -> str:
        """What the driver's version carries (the cache key): only the level changes
        the compiled artifacts."""
        return "" if self.level is None else f"+bg-opt-{self.level}"

    def apply(self, so: Any) -> None:
        """Set what differs from ONNX Runtime's defaults on ``so`` (a SessionOptions); the
        level is the caller's (it is chosen before the session's options are made)."""
        if not self.mem_arena:
            so.enable_cpu_mem_arena = False
        if not self.mem_pattern:
            so.enable_mem_pattern = False


__all__ = ["LEVELS", "SessionTuning"]
