"""Real redis-server processes for the tests: free loopback ports, kill and restart.

The suite only ever talks to servers it started here; it never flushes anything else.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

REDIS_SERVER = shutil.which("redis-server")


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    """SIGTERM ``proc`` and wait; SIGKILL it if it outlives ``timeout``."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server on 127.0.0.1, in its own directory.

    Args:
        aof: turn the append-only file on (``appendfsync everysec``).
        extra: more ``--option value`` arguments.
    """

    def __init__(self, aof: bool = False, extra: list[str] | None = None,
                 port: int | None = None, directory: str | None = None) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server not found: run `make test` (it installs it)")
        self.port = port or free_port()
        self.dir = Path(directory or tempfile.mkdtemp(prefix="taskq-redis-"))
        self.aof = aof
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        a = [REDIS_SERVER or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--dir", str(self.dir), "--save", "", "--daemonize", "no",
             "--logfile", str(self.dir / "redis.log")]
        if self.aof:
            a += ["--appendonly", "yes", "--appendfsync", "everysec",
                  "--auto-aof-rewrite-percentage", "0"]
        else:
            a += ["--appendonly", "no"]
        return a + self.extra

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen(self.args(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    # a restarted server may still be loading its AOF
                    r = redis.Redis(port=self.port, socket_timeout=0.5)
                    if int(r.info("persistence").get("loading", 0)) == 0:
                        return
            except redis.exceptions.RedisError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.dir / 'redis.log'}")
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def kill(self) -> None:
        """SIGKILL the server (as a crash)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """Stop the server and wait for it."""
        stop_process(self.proc)

    def restart(self, kill: bool = True) -> None:
        """Kill (or stop) and start again on the same port and directory."""
        self.kill() if kill else self.stop()
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it is true or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return bool(value)
        time.sleep(interval)


def env_with_url(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["TASKQ_REDIS_URL"] = url
    return env
