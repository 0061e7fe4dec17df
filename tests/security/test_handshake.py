"""Attack 3, continued: holding npud's connections and fds without authenticating, and
what an app sees while npud is out of fds.

A connection that does not say hello within the deadline is closed (the log gets
one line, not one per connection). When npud runs out of fds, accept() backs off
and logs once per episode (it logged 13k lines in 2 minutes); an app's hello
meanwhile ends in ServiceUnavailable after at most 10 s instead of hanging, and
once the fds are back npud serves everyone again."""

from __future__ import annotations

import resource
import socket
import time
from pathlib import Path
from typing import Any

from npumanager import NpuManager
from npumanager.errors import ServiceUnavailable
from npumanager.paths import manager_socket
from npumanager.testing import procs
from tests.security.conftest import StartDaemon
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    assert_served,
    fd_count,
    hello_frame,
    needs_root,
    raw_connect,
    read_until_closed,
)

pytestmark = needs_root



def silent_connections(path: str, n: int) -> dict[str, Any]:
    """``n`` connections that never say hello: when does npud close each, and what says it."""
    socks = [raw_connect(path) for _ in range(n)]
    t0 = time.monotonic()
    said = [read_until_closed(s, 10)[0] for s in socks]
    took = time.monotonic() - t0
    for s in socks:
        s.close()
    return {"took": took, "said": said}


def test_silent_connections_are_closed_at_the_hello_deadline(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(manager={"hello_timeout_s": 0.5, "max_connections_per_uid": 16})
    before = fd_count(npud.pid)
    attack = procs.spawn_as(ATTACKER, None, silent_connections,
                            str(manager_socket(runtime_dir)), 16)
    try:
        assert_served(runtime_dir)  # while the attacker holds all 16 of its slots
        out = attack.wait()
    finally:
        attack.kill()
    assert out["took"] < 5, out
    assert all(b"no hello within 0.5 s" in said for said in out["said"]), out["said"]
    assert fd_count(npud.pid) == before
    assert npud.output.count("no hello within") == 1, npud.output  # not one line each
    assert_served(runtime_dir, request_id=2)


def hold_connections(path: str, n: int) -> int:
    """``n`` authenticated connections (hello sent), held until told to let go."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)  # the backlog takes it even while npud cannot accept
        s.sendall(hello_frame())
        socks.append(s)
    procs.receive(timeout=60)
    for s in socks:
        s.close()
    return n


def hello_while_starved(runtime_dir: str) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        NpuManager(runtime_dir).close()
        outcome = "connected"
    except ServiceUnavailable as exc:
        outcome = f"ServiceUnavailable: {exc}"
    return outcome, time.monotonic() - t0


def test_out_of_fds_npud_backs_off_logs_once_and_apps_get_service_unavailable(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(manager={"hello_timeout_s": 60})
    soft, hard = resource.prlimit(npud.pid, resource.RLIMIT_NOFILE)
    # npud may open a few more: it runs out after accepting about three connections.
    resource.prlimit(npud.pid, resource.RLIMIT_NOFILE, (fd_count(npud.pid) + 3, hard))
    hog = procs.spawn_as(ATTACKER, None, hold_connections, str(manager_socket(runtime_dir)), 12)
    try:
        assert npud.wait_for_output("accept failed"), "npud never ran out of fds"
        outcome, took = procs.run_as(BYSTANDER, None, hello_while_starved, str(runtime_dir),
                                     timeout=30)
        assert outcome.startswith("ServiceUnavailable:") and "hello within 10.0 s" in outcome
        assert 9.5 <= took < 13, took  # bounded by the SDK's hello timeout, not a hang
        # Over those ~10 s npud kept retrying at a bounded rate and said so once.
        assert npud.output.count("accept failed") == 1, npud.output
        hog.send("let go")
        hog.wait()
        resource.prlimit(npud.pid, resource.RLIMIT_NOFILE, (soft, hard))
    finally:
        hog.kill()
    assert_served(runtime_dir)
    assert npud.wait_for_output("accepting again"), "no recovery line"
    assert npud.output.count("accept failed") == 1
    with NpuManager(runtime_dir) as admin:
        failures = admin.dump()["daemon"]["accept_failures"]
    assert 5 <= failures <= 40, failures  # ~1 try a second at most once backed off
