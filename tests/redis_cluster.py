"""A real Redis Cluster of local redis-server processes, for the cluster tests.

Cluster mode needs the port plus 10,000 free too (the cluster bus), so ports come from
below 45,000 here rather than from ``free_port``.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess

import redis
from redis_server import RedisServer, wait_until

REDIS_CLI = shutil.which("redis-cli")


def cluster_port() -> int:
    """A port free on 127.0.0.1 whose cluster-bus port (+10,000) is free too."""
    while True:
        port = random.randint(20000, 45000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue


class RedisClusterProcs:
    """``masters`` redis-server processes joined by ``redis-cli --cluster create``."""

    def __init__(self, masters: int = 3) -> None:
        if REDIS_CLI is None:
            raise RuntimeError("redis-cli not found: run `make test` (it installs it)")
        self.servers: list[RedisServer] = []
        try:
            for _ in range(masters):
                self.servers.append(RedisServer(port=cluster_port(), extra=[
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000"]))
            subprocess.run(
                [REDIS_CLI, "--cluster", "create",
                 *[f"127.0.0.1:{s.port}" for s in self.servers],
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
        return redis.Redis(port=port, decode_responses=True)

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

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
