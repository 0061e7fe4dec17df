"""What a device's background lane ([[driver]] background_host) costs in memory: the driver
hosts' RSS and PSS (``/proc/PID/smaps_rollup``, each host with its descendants) with the
contention bench's four models loaded (camera and voice NORMAL, the LLM and the embedder
BACKGROUND), with one host per device and with the background lane, alternated.

    python bench/host_memory.py [--repeat N]

Not timed: no CPU lock needed beyond the shared one (it compiles four small models).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from npumanager import (
    ModelLoadRequest,
    ModelPriority,
    NpuManager,
    nn,
)
from npumanager.demo.contention import build_models, driver_config
from npumanager.demo.contention_memory import descendants
from npumanager.testing.daemon import DaemonProcess, driver_hosts
from npumanager.testing.grants import Granted

APPS = {"camera": ModelPriority.NORMAL, "voice": ModelPriority.NORMAL,
        "llm": ModelPriority.BACKGROUND, "embedder": ModelPriority.BACKGROUND}


def rollup(pid: int) -> tuple[int, int]:
    """(RSS, PSS) bytes of ``pid`` and its descendants."""
    rss = pss = 0
    for p in [pid, *descendants(pid)]:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key == "Rss":
                        rss += int(rest.split()[0]) * 1024
                    elif key == "Pss":
                        pss += int(rest.split()[0]) * 1024
        except OSError:
            continue
    return rss, pss


def measure(lane: bool) -> dict[str, Any]:
    rt = Path(tempfile.mkdtemp(prefix="npu-mem-", dir="/tmp"))
    os.chmod(rt, 0o755)
    st = Path(tempfile.mkdtemp(prefix="npu-mst-", dir="/tmp"))
    cfg = driver_config(**({"background_host": True} if lane else {}))
    env = dict(os.environ, NPU_STATE_DIR=str(st))
    models = build_models()
    with DaemonProcess(rt, cfg, drivers=True, env=env, ready_timeout=60), \
            NpuManager(rt) as mgr:
        idle = {pid: rollup(pid) for pid in driver_hosts(rt)}
        dev = nn.device("reference", rt)
        try:
            for rid, (app, prio) in enumerate(APPS.items(), 1):
                req = ModelLoadRequest(rid, priority=prio)
                cb = Granted()
                mgr.request_can_load_model(req, cb)
                assert cb.event.wait(30), f"{app} not granted"
                model = dev.prepare_model(models[app].onnx, grant=cb.listener)
                model.execute(dict(models[app].inputs))
            loaded = {pid: rollup(pid) for pid in driver_hosts(rt)}
        finally:
            dev.close()
    return {"idle": idle, "loaded": loaded}


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    totals: dict[str, list[tuple[int, int, int, int]]] = {"one host": [], "background_host": []}
    for i in range(args.repeat):
        order = [False, True] if i % 2 == 0 else [True, False]
        for lane in order:
            r = measure(lane)
            name = "background_host" if lane else "one host"
            hosts = sorted(r["loaded"].items())
            print(f"run {i + 1} {name}: " + "; ".join(
                f"pid {pid} idle RSS {mib(r['idle'].get(pid, (0, 0))[0])} PSS "
                f"{mib(r['idle'].get(pid, (0, 0))[1])}, loaded RSS {mib(rss)} PSS {mib(pss)} MiB"
                for pid, (rss, pss) in hosts), flush=True)
            totals[name].append((sum(v[0] for v in r["idle"].values()),
                                 sum(v[1] for v in r["idle"].values()),
                                 sum(v[0] for v in r["loaded"].values()),
                                 sum(v[1] for v in r["loaded"].values())))
    print("\nthe driver hosts together, MiB: median (min-max) over the runs")
    print("| configuration | idle RSS | idle PSS | loaded RSS | loaded PSS |")
    print("|---|---|---|---|---|")
    for name, rows in totals.items():
        cells = []
        for k in range(4):
            vals = [row[k] for row in rows]
            cells.append(f"{mib(statistics.median(vals))} ({mib(min(vals))}-{mib(max(vals))})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
