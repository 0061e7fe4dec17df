"""Attack 3: pinning fds in npud or a driver, then exhausting its fd table.

fds sent with frames that do not announce them used to stay queued until the
connection closed: two connections took npud to its fd limit. Now an fd beyond
what the frame being received announces is a ProtocolError that closes the
connection and every fd it sent; fds waiting for their frame are bounded per
connection (npud: 0, none of its methods takes fds; a driver: one frame's 253)
and per uid (506). Each test sends pipe write ends and closes its own copies:
the read ends see EOF only once the server has closed every one it received."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from npumanager.paths import driver_socket, manager_socket
from npumanager.testing import procs
from npumanager.wire.framing import REQUEST, pack
from tests.security.conftest import StartDaemon
from tests.security.harness import (
    ATTACKER,
    assert_device_served,
    assert_served,
    driver_pid,
    fd_count,
    needs_root,
    pipes_closed_by_peer,
    read_until_closed,
    said_hello,
    send_with_fds,
)

pytestmark = needs_root



def _pipes(n: int) -> tuple[list[int], list[int]]:
    pairs = [os.pipe() for _ in range(n)]
    return [r for r, _ in pairs], [w for _, w in pairs]


def unannounced(path: str, service: str, method: str, n: int) -> dict[str, Any]:
    """A frame that announces no fds, sent with ``n``."""
    s = said_hello(path, service)
    reads, writes = _pipes(n)
    send_with_fds(s, pack(REQUEST, 2, method.encode(), b""), writes)
    for w in writes:
        os.close(w)
    got, _ = read_until_closed(s, 10)
    return {"said": got, "all_closed": pipes_closed_by_peer(reads, 10)}


def flood(path: str, service: str, conns: int, chunks: int, per_chunk: int
          ) -> dict[str, Any]:
    """On each of ``conns`` connections: ``chunks`` single bytes (a frame header never
    completed), each with ``per_chunk`` fds. Reports which connections the server
    closed and what it said, then closes everything and checks every fd came back."""
    socks = [said_hello(path, service) for _ in range(conns)]
    reads: list[int] = []
    closed: list[int] = []
    said = b""
    for i, s in enumerate(socks):
        for _ in range(chunks):
            r, w = _pipes(per_chunk)
            reads += r
            try:
                send_with_fds(s, b"\0", w)
            except OSError:
                pass  # already cut off
            for fd in w:
                os.close(fd)
        s.settimeout(0.5)
        try:
            data = s.recv(65536)
        except TimeoutError:
            continue  # still open: within the bounds
        said += data
        closed.append(i)
    for s in socks:
        s.close()
    return {"closed": closed, "said": said, "all_closed": pipes_closed_by_peer(reads, 10)}


def test_unannounced_fds_to_npud_close_the_connection_and_every_fd(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud()
    before = fd_count(npud.pid)
    out = procs.run_as(ATTACKER, None, unannounced, str(manager_socket(runtime_dir)),
                       "manager", "dump", 20)
    assert b"ProtocolError" in out["said"] and b"this service takes no fds" in out["said"]
    assert out["all_closed"], "npud kept fds it was sent"
    assert fd_count(npud.pid) == before
    assert_served(runtime_dir)


def test_unannounced_fds_to_a_driver_close_the_connection_and_every_fd(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    driver = driver_pid(runtime_dir)
    before = fd_count(driver)
    out = procs.run_as(ATTACKER, None, unannounced, str(driver_socket("reference", runtime_dir)),
                       "driver", "device.capabilities", 20)
    assert b"ProtocolError" in out["said"], out
    assert b"20 fds arrived that no frame announced" in out["said"], out
    assert out["all_closed"], "the driver kept fds it was sent"
    assert fd_count(driver) == before
    assert_device_served(runtime_dir)


def test_fd_flood_to_npud_is_cut_off_at_the_first_fd(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud()
    before = fd_count(npud.pid)
    out = procs.run_as(ATTACKER, None, flood, str(manager_socket(runtime_dir)), "manager",
                       2, 3, 64)
    assert out["closed"] == [0, 1], out
    assert b"64 fds received: this service takes no fds" in out["said"], out
    assert out["all_closed"]
    assert fd_count(npud.pid) == before
    assert_served(runtime_dir)


def test_fd_flood_to_a_driver_stops_at_the_per_connection_and_per_uid_bounds(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    driver = driver_pid(runtime_dir)
    before = fd_count(driver)
    path = str(driver_socket("reference", runtime_dir))
    # One connection: 3 x 64 = 192 fds wait for a frame (allowed), the 4th chunk (256) is not.
    one = procs.run_as(ATTACKER, None, flood, path, "driver", 1, 4, 64)
    assert one["closed"] == [0], one
    assert b"256 fds received: at most 253 may wait for their frame" in one["said"], one
    assert one["all_closed"]
    # Three connections of 192 each: the uid's 506 runs out on the third.
    many = procs.run_as(ATTACKER, None, flood, path, "driver", 3, 3, 64)
    assert many["closed"] == [2], many
    assert b"uid 50001 has 512 fds waiting for their frames; the bound is 506" in many["said"]
    assert many["all_closed"]
    assert fd_count(driver) == before
    assert_device_served(runtime_dir)


def announced_to_a_call_that_takes_none(path: str, methods: list[str]) -> dict[str, Any]:
    out = {}
    for method in methods:
        s = said_hello(path, "driver")
        reads, writes = _pipes(5)
        send_with_fds(s, pack(REQUEST, 2, method.encode(), b"", 5), writes)
        for w in writes:
            os.close(w)
        got, _ = read_until_closed(s, 10)
        out[method] = (b"takes no fds" in got, pipes_closed_by_peer(reads, 10))
    return out


def test_fds_announced_with_a_driver_call_that_takes_none_close_the_connection(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    # They used to reach handlers that never close them: pinned until the driver exits.
    start_npud(drivers=True)
    driver = driver_pid(runtime_dir)
    before = fd_count(driver)
    methods = ["device.capabilities", "device.release", "device.cancel",
               "device.unregister_pool", "device.get_number_of_cache_files_needed",
               "device.execute"]
    out = procs.run_as(ATTACKER, None, announced_to_a_call_that_takes_none,
                       str(driver_socket("reference", runtime_dir)), methods)
    assert out == {m: (True, True) for m in methods}, out
    assert fd_count(driver) == before
    assert_device_served(runtime_dir)
