"""Helpers of the Ray tests: npuds with the reference driver, a foreground app under
another uid (a real process: ``python -m tests.ray.fg_app``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

#: The uid of the local foreground app (not root: npud only asks other uids to unload).
FG_UID = 50001
REPO = Path(__file__).resolve().parents[2]

needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="needs root: the foreground app runs under another uid")


def npud_config() -> dict[str, Any]:
    # BUDGET 4 (the default): the actor's >2 GB model fills it, so a foreground app's
    # small model only fits once the actor unloads. A short unload deadline keeps a
    # stuck actor from holding the test up.
    return {"manager": {"log_level": "info", "unload_deadline_s": 5.0},
            "policy": {"name": "BUDGET", "max_budget": 4}}


class ForegroundApp:
    """`python -m tests.ray.fg_app RT` under FG_UID; its JSON lines as events."""

    def __init__(self, runtime_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.ray.fg_app", str(runtime_dir)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            user=FG_UID, group=FG_UID, extra_groups=[],
            env={**os.environ, "HOME": "/tmp"})
        self.events: list[dict[str, Any]] = []

    def next_event(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the foreground app exited with {self.proc.wait()}")
        ev: dict[str, Any] = json.loads(line)
        self.events.append(ev)
        return ev

    def wait_for(self, event: str) -> dict[str, Any]:
        while True:
            ev = self.next_event()
            if ev["event"] == event:
                return ev
            if ev["event"] == "no_grant":
                raise AssertionError(f"the foreground app got no grant: {self.events}")

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()
        self.wait_for("released")
        assert self.proc.wait(10) == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
