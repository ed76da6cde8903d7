"""``taskq dev cluster``: a local Redis Cluster to try a sharded job on, in one command.

It starts the suite's own local cluster (``taskq.devserver.RedisCluster``: 3 masters or
more on free loopback ports, joined by ``redis-cli --cluster create``), prints the
``TASKQ_REDIS_URL`` to use, and keeps the nodes running until Ctrl-C or SIGTERM, which stop
every node and remove its files.

Data flow: operator -> cli/dev.py -> taskq.devserver (server processes); nothing else.
"""

from __future__ import annotations

import threading

import click

import taskq
from taskq import devserver
from taskq.ops.stopping import StopOnSignals


@click.group("dev")
def dev() -> None:
    """Local servers to try taskq on (loopback only, stopped on exit)."""


@dev.command("cluster")
@click.option(
    "--masters",
    type=click.IntRange(min=3, max=16),
    default=3,
    show_default=True,
    help="Masters of the cluster (redis-cli --cluster create wants 3 at least).",
)
@click.option(
    "--server",
    metavar="BINARY",
    help="The server binary (default: $TASKQ_TEST_SERVER, else redis-server; "
    "valkey-server works too).",
)
def cluster(masters: int, server: str | None) -> None:
    """Start a local Redis Cluster on loopback ports and print its URL as an
    ``export TASKQ_REDIS_URL=...`` line; run until Ctrl-C or SIGTERM, then stop every node.

    Then, in another shell: export that line, and ``taskq job create web --files
    'data/*.jsonl' --shards 3`` makes a job spread over the masters (docs/sharding.md)."""
    stop = threading.Event()
    with StopOnSignals(stop):
        with devserver.RedisCluster(masters, binary=server, new_session=True) as nodes:
            ports = ", ".join(str(s.port) for s in nodes.servers)
            click.echo(f"export TASKQ_REDIS_URL={nodes.url}")
            click.echo(
                f"taskq: a local cluster of {masters} masters on 127.0.0.1 ports {ports}; "
                "Ctrl-C stops it",
                err=True,
            )
            while not stop.wait(0.5):
                gone = [
                    s.port for s in nodes.servers if s.proc is None or s.proc.poll() is not None
                ]
                if gone:
                    raise taskq.TaskqError(f"dev cluster: the node on port {gone[0]} exited")
    click.echo("taskq: the local cluster is stopped", err=True)
