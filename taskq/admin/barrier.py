"""A sharded job's barrier lock: the barrier step and a checkpoint's cut exclude each other.

The barrier step (jobs.py, ``Job.advance``) holds it while it moves the shards' passes,
a checkpoint or rewind of the whole job (jobs.py) while it takes or restores its cut, so
no pass moves under a cut. One string per sharded job (``keys.barrier_key``, beside the
shard-set record), ``SET NX PX`` with a token: a holder that dies leaves it for its
lifetime at most; the holder renews it (``keep()``) and deletes it only while it is
still its own. A lock is not a proof: the cut also checks that no pass moved.

Data flow: jobs.py (the step, the cut) -> barrier.py -> Redis.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Iterator

from taskq.engine.connection import Connection, translate
from taskq.keys import barrier_key

#: How long an operator's ``next_pass`` waits for a checkpoint's cut to let go of the lock.
ADMIN_WAIT_S = 10.0

#: How long the barrier step may hold the barrier lock (it is a few calls per shard; a
#: step that died holding it delays the next one this long at most).
STEP_LOCK_MS = 2000


@contextlib.contextmanager
def barrier_lock(
    conn: Connection, name: str, holder: str, ttl_ms: int, wait_s: float = 0.0
) -> Iterator[Callable[[], bool] | None]:
    """Hold sharded job ``name``'s barrier lock (``keys.barrier_key``) for the block.

    The barrier step holds it while it moves passes, a checkpoint or rewind while it
    takes or restores its cut: the passes do not move under a cut. A holder that dies
    leaves it for ``ttl_ms`` at most.

    Args:
        holder: what holds it (``step``, ``checkpoint``, ``rewind``), for the message of
            the one refused.
        ttl_ms: the lock's lifetime; ``keep()`` (yielded) renews it.
        wait_s: how long to wait for a lock another holds.

    Yields:
        ``keep``: renews the lock, False when it was lost (expired and taken); None when
        the lock could not be had within ``wait_s``.
    """
    key = barrier_key(name, conn.prefix)
    token = f"{holder}:{secrets.token_hex(8)}"
    deadline = time.monotonic() + wait_s
    with translate(conn.url):
        while not conn.redis.set(key, token, nx=True, px=ttl_ms):
            if time.monotonic() >= deadline:
                yield None
                return
            time.sleep(0.02)

    def keep() -> bool:
        with translate(conn.url):
            if conn.redis.get(key) != token:
                return False
            return bool(conn.redis.pexpire(key, ttl_ms))

    try:
        yield keep
    finally:
        with translate(conn.url):
            if conn.redis.get(key) == token:  # not one taken after ours expired
                conn.redis.delete(key)
