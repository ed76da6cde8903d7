"""What the tests share: the server binary, local servers and clusters, job factories.

The servers themselves come from ``taskq.devserver`` (the demo and the bench start theirs
there too). ``TASKQ_TEST_SERVER`` names the binary (default ``redis-server``; CI also runs
a subset with ``valkey-server``). The suite only ever talks to servers it started.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
from pathlib import Path
from typing import Any

import redis
import yaml

import taskq
from taskq.devserver import (
    LOOPBACK,
    RedisServer,
    find_cli,
    find_server,
    free_port,
    stop_process,
    wait_until,
)

__all__ = [
    "LOOPBACK", "SERVER_BINARY", "RedisClusterProcs", "RedisServer",
    "ROOT", "free_port", "load_yaml", "load_yaml_all", "make_job", "server_version",
    "stop_process", "wait_until",
]

#: The server binary every test starts (``$TASKQ_TEST_SERVER`` or redis-server); a missing
#: one fails the run at collection: the test command installs it, nothing is skipped.
SERVER_BINARY = find_server()


def server_version() -> str:
    """``<binary> <version>`` of the server the tests start, e.g. ``valkey-server 8.0.1``."""
    out = subprocess.run([SERVER_BINARY, "--version"], capture_output=True, text=True,
                         timeout=30).stdout
    version = next((w[2:] for w in out.split() if w.startswith("v=")), out.strip())
    return f"{os.path.basename(SERVER_BINARY)} {version}"


def make_job(client: taskq.Client, name: str, n: int = 4, **kw: Any) -> taskq.JobStatus:
    """Create job ``name`` of ``n`` one-chunk tasks ``{"i": i}``; ``kw`` go to create_job."""
    return client.create_job(name, [{"i": i} for i in range(n)], **kw)


# -- Redis Cluster -----------------------------------------------------------------------
def cluster_port() -> int:
    """A port free on 127.0.0.1 whose cluster-bus port (+10,000) is free too.

    Cluster mode needs both, so ports come from below 45,000 rather than ``free_port``.
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


class RedisClusterProcs:
    """``masters`` server processes joined by ``<redis|valkey>-cli --cluster create``."""

    def __init__(self, masters: int = 3) -> None:
        cli = find_cli(SERVER_BINARY)
        self.servers: list[RedisServer] = []
        try:
            for _ in range(masters):
                self.servers.append(RedisServer(port=cluster_port(), extra=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000"]))
            subprocess.run(
                [cli, "--cluster", "create",
                 *[f"{LOOPBACK}:{s.port}" for s in self.servers],
                 "--cluster-replicas", "0", "--cluster-yes"],
                check=True, capture_output=True, timeout=60)
            if not wait_until(self.ok, timeout=30, interval=0.1):
                raise RuntimeError("the test cluster did not reach cluster_state:ok")
        except BaseException:
            self.cleanup()
            raise

    def ok(self) -> bool:
        """True when every node says cluster_state:ok."""
        return all(self.node(s.port).cluster("info")["cluster_state"] == "ok"
                   for s in self.servers)

    @staticmethod
    def node(port: int) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=port, decode_responses=True)

    @property
    def url(self) -> str:
        return f"redis+cluster://{LOOPBACK}:{self.servers[0].port}"

    def owner_port(self, key: str) -> int:
        """The port of the master serving ``key``'s slot (asked of the cluster)."""
        slot = self.node(self.servers[0].port).cluster("keyslot", key)
        for start, end, master, *_ in self.node(self.servers[0].port).execute_command(
                "CLUSTER", "SLOTS"):
            if int(start) <= int(slot) <= int(end):
                return int(master[1])
        raise AssertionError(f"no master serves slot {slot}")

    def cleanup(self) -> None:
        for s in self.servers:
            s.cleanup()


# -- files of the repo -------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def load_yaml(path: Path) -> Any:
    """The one YAML document of ``path``."""
    with path.open() as f:
        return yaml.safe_load(f)


def load_yaml_all(path: Path) -> list[Any]:
    """Every non-empty YAML document of ``path``."""
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]
