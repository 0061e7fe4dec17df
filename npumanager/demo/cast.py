"""Who is in `npu demo` and how it is paced: the options, the four apps, the record.

:mod:`.scenario` drives the story with these; :mod:`.summary` reads the
:class:`Run` it records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from npumanager.constants import Importance, ModelPriority, ModelSize
from npumanager.demo.apps import AppSpec

#: uids of the apps when the demo runs as root (no such users need to exist).
APP_UIDS = {"camera": 61001, "voice": 61002, "embedder": 61003, "llm": 61004}
SCENES = 6


@dataclass(frozen=True)
class Pace:
    """How long each scene lets things run (``--fast`` halves most of it)."""

    llm_alone_s: float
    llm_backoff_s: float
    contention_s: float
    severe_s: float
    cool_s: float
    between_s: float
    unload_deadline_s: float
    voice_runs: int

    @classmethod
    def for_mode(cls, fast: bool) -> Pace:
        if fast:
            return cls(0.8, 1.2, 1.8, 0.6, 1.0, 0.0, 1.0, 8)
        return cls(2.0, 2.5, 4.0, 1.5, 2.5, 0.8, 2.0, 15)


#: The drivers the demo can start, as its title names them (its models are ONNX).
BACKENDS = {
    "reference": "reference driver (ONNX Runtime on the CPU)",
    "openvino": "openvino driver (OpenVINO on its first device)",
}


@dataclass
class DemoOptions:
    runtime_dir: str | None = None
    fast: bool = False
    color: bool | None = None
    #: where trace.json, timeline.png and summary.json go ("" = none; None = a new dir)
    out: str | None = None
    #: The driver plugin npud starts (its own npud only): "reference" or "openvino".
    driver: str = "reference"


@dataclass
class Phase:
    name: str
    t0: float
    t1: float | None = None


@dataclass
class Run:
    """What the scenario recorded, for the summary."""

    phases: list[Phase] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def begin(self, name: str) -> Phase:
        now = time.monotonic()
        if self.phases and self.phases[-1].t1 is None:
            self.phases[-1].t1 = now
        p = Phase(name, now)
        self.phases.append(p)
        return p

    def end(self) -> None:
        if self.phases and self.phases[-1].t1 is None:
            self.phases[-1].t1 = time.monotonic()


def app_specs(root: bool, pace: Pace) -> dict[str, AppSpec]:
    def uid(name: str) -> int | None:
        return APP_UIDS[name] if root else None

    def first(name: str) -> int:
        return 1 if root else 100 * (list(APP_UIDS).index(name) + 1)

    # Not root, every app shares one uid: npud never preempts within a uid, so the LLM asks
    # for a size that leaves room, and the embedder's BACKGROUND priority is what puts it
    # above the thermal cut (rank = importance + model priority).
    return {
        "llm": AppSpec("llm", uid("llm"), Importance.SERVICE,
                       ModelSize.GREATER_THAN_2G if root else ModelSize.BETWEEN_1GB_AND_2GB,
                       ModelPriority.BACKGROUND, "decode", steps=16, job_priority=100,
                       first_id=first("llm"),
                       retry_size=ModelSize.BETWEEN_1GB_AND_2GB,
                       retry_after_s=pace.llm_backoff_s),
        "camera": AppSpec("camera", uid("camera"), Importance.FOREGROUND,
                          ModelSize.LESS_THAN_1GB, ModelPriority.NORMAL, "frames",
                          period_s=1 / 30, first_id=first("camera"), stream=True),
        "embedder": AppSpec("embedder", uid("embedder"), Importance.SERVICE,
                            ModelSize.LESS_THAN_1GB,
                            ModelPriority.NORMAL if root else ModelPriority.BACKGROUND,
                            "periodic",
                            period_s=0.1, comply=False, exit_on_revoke=True,
                            first_id=first("embedder")),
        "voice": AppSpec("voice", uid("voice"), Importance.VISIBLE, ModelSize.LESS_THAN_1GB,
                         ModelPriority.NORMAL, "burst", period_s=0.03, runs=pace.voice_runs,
                         first_id=first("voice"), stream=True),
    }
