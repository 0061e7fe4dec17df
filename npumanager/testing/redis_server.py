"""A real ``redis-server`` on a Unix socket in a temporary directory, for tests and benches.

No TCP port (``--port 0``), no persistence, the socket mode 0700: nothing
outside the test can reach it. ``redis_server_binary()`` is None when the
Debian package ``redis-server`` is not installed; tests skip with that reason.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import tempfile
import threading
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
        self._ready = threading.Event()
        self._serving = False
        self._log: collections.deque[str] = collections.deque(maxlen=50)
        self._reader: threading.Thread | None = None

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
             "--dir", str(self.dir), "--daemonize", "no", "--loglevel", "notice",
             "--proto-max-bulk-len", "1gb"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        # redis-server says when it serves the socket; a reader thread waits for that line
        # (and keeps draining its log so it never blocks on a full pipe).
        self._reader = threading.Thread(target=self._read, name="redis-log", daemon=True)
        self._reader.start()
        if not self._ready.wait(self.ready_timeout):
            self.stop()
            raise TimeoutError(f"redis-server not ready within {self.ready_timeout} s")
        if not self._serving:
            self.proc.wait()
            log = "\n".join(self._log)
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {log}")
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self._log.append(line)
            if "ready to accept connections" in line.lower():
                self._serving = True
                self._ready.set()
        self._ready.set()  # it exited (before it was ready, if _serving is still False)

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            if self._reader is not None:
                self._reader.join(5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
