"""A real ``redis-server`` on a Unix socket in a temporary directory, for tests and benches.

No TCP port (``--port 0``), no persistence, the socket mode 0700: nothing
outside the test can reach it. ``redis_server_binary()`` is None when the
Debian package ``redis-server`` is not installed; tests skip with that reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SKIP_REASON = "redis-server is not installed (Debian package redis-server; .ci/run installs it)"


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


class RedisServer:
    """``with RedisServer() as r: r.url`` -> ``unix:///tmp/.../redis.sock``."""

    def __init__(self, directory: str | os.PathLike[str] | None = None,
                 ready_timeout: float = 10.0) -> None:
        self._own_dir = directory is None
        self.dir = Path(tempfile.mkdtemp(prefix="npu-redis-") if directory is None
                        else directory)
        self.socket_path = self.dir / "redis.sock"
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<RedisServer {self.socket_path}>"

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self) -> RedisServer:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError(SKIP_REASON)
        self.proc = subprocess.Popen(
            [binary, "--port", "0", "--unixsocket", str(self.socket_path),
             "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
             "--dir", str(self.dir), "--daemonize", "no", "--loglevel", "warning",
             "--proto-max-bulk-len", "1gb"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {err}")
            if self._answers():
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"redis-server not ready within {self.ready_timeout} s")
            time.sleep(0.01)

    def _answers(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(1.0)
            s.connect(str(self.socket_path))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False
        finally:
            s.close()

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
