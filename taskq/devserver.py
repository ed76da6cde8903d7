"""A local redis-server for the demo, the tests and the bench: free loopback port, own dir.

Where it sits: outside the data flow. ``taskq demo`` starts one when no URL is given, the
test suite starts one per session (and more for kills, TLS, ACL, Sentinel, Cluster), and
the bench starts one per measurement; ``RedisCluster`` joins several into a local Redis
Cluster. Nothing here talks to a server it did not start.

The binary is ``redis-server`` unless told otherwise; ``valkey-server`` (7.2 and later)
speaks the same protocol and takes the same options, so ``find_server("valkey-server")``
runs everything against Valkey. ``TASKQ_TEST_SERVER`` names the binary for the test
suite and the bench (README.md says which servers and versions are tested).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from .errors import TaskqError

#: The environment variable naming the server binary the tests and the bench start.
SERVER_ENV = "TASKQ_TEST_SERVER"
LOOPBACK = "127.0.0.1"
INSTALL_HINT = "install with: sudo apt-get install -y redis-server"


def find_server(name: str | None = None) -> str:
    """The path of the server binary to start.

    Args:
        name: a binary name or path (e.g. ``valkey-server``); default ``$TASKQ_TEST_SERVER``,
            else ``redis-server``.

    Returns:
        The absolute path of an executable.

    Raises:
        TaskqError: the binary is not on PATH (the message says how to install it).
    """
    name = name or os.environ.get(SERVER_ENV) or "redis-server"
    path = shutil.which(name)
    if path is None:
        hint = INSTALL_HINT if name == "redis-server" else f"is {name} installed?"
        raise TaskqError(f"{name} not found; {hint}")
    return path


def find_cli(server: str) -> str:
    """The ``*-cli`` next to a server binary (``valkey-cli`` for ``valkey-server``).

    Args:
        server: the server binary's path, as :func:`find_server` returns it.

    Returns:
        The absolute path of the matching CLI.

    Raises:
        TaskqError: no such CLI on PATH.
    """
    name = os.path.basename(server).replace("-server", "-cli")
    path = shutil.which(name)
    if path is None:
        raise TaskqError(f"{name} not found next to {server}")
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (another process may take it before use).

    Returns:
        The port number.
    """
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    """SIGTERM ``proc`` and wait; SIGKILL it if it outlives ``timeout``.

    Args:
        proc: the process (``None`` or an exited one: nothing to do).
        timeout: seconds to wait after each signal.
    """
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


def wait_until(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.02
) -> bool:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes.

    Args:
        predicate: called until it returns something truthy.
        timeout: seconds.
        interval: seconds between calls.

    Returns:
        Whether the last call was truthy.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return bool(value)
        time.sleep(interval)


class RedisServer:
    """One redis-server (or Valkey) process on 127.0.0.1, in a directory of its own.

    Started by the constructor; ``cleanup()`` stops it and removes its directory.

    Args:
        aof: turn the append-only file on (``appendfsync everysec``); off: no persistence.
        extra: more ``--option value`` arguments.
        port: the port (default: a free one, retried on a bind race).
        directory: its ``--dir`` (default: a new temp dir, removed by ``cleanup()``).
        binary: the server binary (default: :func:`find_server`).
        new_session: start it in its own session, so a terminal's Ctrl-C reaches only us.
        ready: says when the server is ready (for TLS-only or ACL-locked servers); default:
            it answers PING on ``port`` and has loaded its data.

    Raises:
        TaskqError: the binary is missing, or the server exited or did not answer in time.
    """

    def __init__(
        self,
        aof: bool = False,
        extra: Sequence[str] = (),
        port: int | None = None,
        directory: str | Path | None = None,
        binary: str | None = None,
        new_session: bool = False,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.binary = find_server(binary)
        self.aof = aof
        self.extra = list(extra)
        self.new_session = new_session
        self.ready = ready or self._answers
        self.dir = Path(directory or tempfile.mkdtemp(prefix="taskq-redis-"))
        self._own_dir = directory is None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = port or free_port()
        for attempt in range(3):
            try:
                self.start()
                return
            except TaskqError:
                stop_process(self.proc)
                if port is not None or attempt == 2:
                    if self._own_dir:
                        shutil.rmtree(self.dir, ignore_errors=True)
                    raise
                self.port = free_port()  # taken between probe and bind

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.dir / "redis.log"

    def args(self) -> list[str]:
        """The command line that starts this server."""
        a = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            LOOPBACK,
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            str(self.log),
        ]
        if self.aof:
            a += [
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--auto-aof-rewrite-percentage",
                "0",
            ]
        else:
            a += ["--appendonly", "no"]
        return a + self.extra

    def start(self, timeout: float = 10.0) -> None:
        """Start the process and wait until it answers PING and has loaded its data.

        Args:
            timeout: seconds.

        Raises:
            TaskqError: it exited, or did not get ready within ``timeout``.
        """
        self.proc = subprocess.Popen(
            self.args(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=self.new_session,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.ready():
                return
            if self.proc.poll() is not None:
                raise TaskqError(f"{self.binary} exited; see {self.log}")
            time.sleep(0.02)
        raise TaskqError(f"{self.binary} on port {self.port} did not start; see {self.log}")

    def _answers(self) -> bool:
        r = redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=0.5)
        try:
            # a restarted server may still be loading its AOF
            return bool(r.ping()) and int(r.info("persistence").get("loading", 0)) == 0
        except redis.exceptions.RedisError:
            return False
        finally:
            r.close()

    def kill(self) -> None:
        """SIGKILL the server (as a crash) and reap it."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and wait for it."""
        stop_process(self.proc)

    def restart(self, kill: bool = True) -> None:
        """Kill (or stop) and start again on the same port and directory."""
        if kill:
            self.kill()
        else:
            self.stop()
        self.start()

    def client(self, **kwargs: object) -> redis.Redis:
        """A redis-py client of this server (``decode_responses=True`` unless overridden)."""
        kwargs.setdefault("decode_responses", True)
        return redis.Redis(host=LOOPBACK, port=self.port, **kwargs)  # type: ignore[arg-type]

    def cleanup(self) -> None:
        """Stop the server and remove its directory (if this object made it)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def cluster_port() -> int:
    """A port free on 127.0.0.1 whose cluster-bus port (+10,000) is free too.

    Cluster mode needs both, so ports come from below 45,000 rather than ``free_port``.

    Returns:
        The port number.
    """
    while True:
        port = random.randint(20000, 45000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind((LOOPBACK, p))
            return port
        except OSError:
            continue


class RedisCluster:
    """``masters`` server processes joined by ``<redis|valkey>-cli --cluster create``.

    Started by the constructor (no replicas); ``cleanup()`` stops every node.

    Args:
        masters: how many masters (3 at least: ``--cluster create`` wants three).
        binary: the server binary (default: :func:`find_server`); its ``*-cli`` joins them.
        spare: also start a master that holds no slot, joined as an operator grows a
            cluster (``--cluster add-node``): ``self.spare``, where slots can be moved to.
        new_session: start every node in its own session, so a terminal's Ctrl-C reaches
            only the process that started them (``taskq dev cluster``), which stops them.

    Raises:
        TaskqError: a server did not start, or the cluster did not reach
            ``cluster_state:ok``.
        subprocess.CalledProcessError: ``--cluster create`` failed.
    """

    def __init__(
        self,
        masters: int = 3,
        binary: str | None = None,
        spare: bool = False,
        new_session: bool = False,
    ) -> None:
        self.new_session = new_session
        server = find_server(binary)
        self.cli = find_cli(server)
        self.servers: list[RedisServer] = []
        self.spare: RedisServer | None = None
        try:
            for _ in range(masters):
                self.servers.append(self._node(server))
            self._cli("create", *[f"{LOOPBACK}:{s.port}" for s in self.servers])
            if not wait_until(self.ok, timeout=30, interval=0.1):
                raise TaskqError("the local cluster did not reach cluster_state:ok")
            if spare:
                self.spare = self._node(server)
                self._cli("add-node", f"{LOOPBACK}:{self.spare.port}", self.first)
                joined = self.node(self.spare.port)
                spare_id = joined.cluster("myid")
                if not wait_until(
                    lambda: (
                        self._all_know(spare_id) and joined.cluster("info")["cluster_state"] == "ok"
                    ),
                    timeout=30,
                    interval=0.1,
                ):
                    raise TaskqError("the spare did not join the local cluster")
        except BaseException:
            self.cleanup()
            raise

    def _node(self, server: str) -> RedisServer:
        return RedisServer(
            port=cluster_port(),
            binary=server,
            new_session=self.new_session,
            extra=[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ],
        )

    def _cli(self, command: str, *args: str) -> None:
        """``<cli> --cluster COMMAND ARGS``: no replicas, no questions."""
        extra = ["--cluster-replicas", "0", "--cluster-yes"] if command == "create" else []
        subprocess.run(
            [self.cli, "--cluster", command, *args, *extra],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def _all_know(self, node_id: str) -> bool:
        return all(
            node_id in self.node(s.port).execute_command("CLUSTER", "NODES") for s in self.servers
        )

    def ok(self) -> bool:
        """True when every node says cluster_state:ok."""
        return all(self.node(s.port).cluster("info")["cluster_state"] == "ok" for s in self.servers)

    @staticmethod
    def node(port: int) -> redis.Redis:
        """A redis-py client of one node (``decode_responses=True``)."""
        return redis.Redis(host=LOOPBACK, port=port, decode_responses=True)

    @property
    def url(self) -> str:
        return f"redis+cluster://{self.first}"

    @property
    def first(self) -> str:
        """``host:port`` of the first master."""
        return f"{LOOPBACK}:{self.servers[0].port}"

    def owner_port(self, key: str) -> int:
        """The port of the master serving ``key``'s slot (asked of the cluster).

        Raises:
            TaskqError: no master serves the slot (the cluster is not whole).
        """
        first = self.node(self.servers[0].port)
        slot = first.cluster("keyslot", key)
        for start, end, master, *_ in first.execute_command("CLUSTER", "SLOTS"):
            if int(start) <= int(slot) <= int(end):
                return int(master[1])
        raise TaskqError(f"no master serves slot {slot}")

    def cleanup(self) -> None:
        """Stop every node and remove their directories."""
        for s in [*self.servers, *([self.spare] if self.spare else [])]:
            s.cleanup()

    def __enter__(self) -> RedisCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()
