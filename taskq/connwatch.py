"""Closed connections: the reaper notices a SIGKILLed trainer in about a second.

The kernel closes a dead process's sockets at once and Redis drops them from CLIENT
LIST within milliseconds. Every trainer names its heartbeat connection
(``connection.trainer_conn_name``) and sends that connection's CLIENT ID with its
heartbeats; the worker record keeps it (``lua/heartbeat.lua``). Each tick the reaper
lists the ids of a job's workers (``lua/conns.lua``, bounded batches), looks only those
up with ``CLIENT LIST ID ...`` (at most ``batch`` ids a call, never the whole list), and
declares a worker lost (``lua/closed.lua``, fenced on its incarnation and connection id)
when a connection it has seen carrying the worker's name has been gone for ``grace`` and
the worker has made no call for ``quiet``. Heartbeats and the ttl stay the backstop.

It never misfires on:

- a Redis restart or failover: every connection drops, the reaper's own too. A changed
  id of its own connection resets everything it had seen; ids seen before count for
  nothing afterwards (a new connection may reuse an old id: it is only "the worker's"
  once seen under the worker's name). ``quiet`` is measured on the job's liveness clock,
  which the silence rule freezes over an outage.
- a network blip: the trainer's next heartbeat reconnects and records its new id; until
  then ``quiet`` (more than one heartbeat interval) holds off, and the script refuses an
  id that is no longer the recorded one.
- proxies, Redis Cluster, managed services: where CLIENT LIST is refused, or does not show
  the reaper's own connection, or the client is a cluster client, the watch turns itself
  off (logged once) and the ttl decides, as without it; it looks again every
  ``recheck`` seconds.

Data flow: reaper.py -> connwatch.py -> scripts.py (conns, closed) and CLIENT LIST ID
-> Redis <- trainer heartbeats (CLIENT ID).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from . import errors
from .connection import trainer_conn_name, translate
from .scripts import MAX_RECLAIM, PAGE_MAX, Code

log = logging.getLogger("taskq.reaper")

#: Ids looked up per CLIENT LIST ID call at most (each costs Redis ~1 us per id).
ID_BATCH = 100
#: Worker ids listed per job per tick at most (the rest waits for later ticks).
MAX_IDS_PER_JOB = 5000
#: Workers listed per conns script call.
_LIST_BATCH = PAGE_MAX  # workers listed per conns call

_Key = tuple[str, str, str, str]  # job, worker, incarnation, connection id


def _parse_client_list(text: Any) -> list[dict[str, str]]:
    """``CLIENT LIST`` lines as dicts (``id=.. addr=.. name=..``; a name holds no space)."""
    if isinstance(text, bytes):
        text = text.decode()
    return [
        dict(kv.split("=", 1) for kv in line.split(" ") if "=" in kv)
        for line in str(text).splitlines()
        if line.strip()
    ]


class _OwnConnection:
    """One connection of the reaper's own, taken from its client's pool and kept: its id
    changes only when it reconnects, which every Redis restart or failover forces (a
    pooled connection would change with whichever the pool hands out)."""

    def __init__(self, redis_client: Any) -> None:
        self.pool = redis_client.connection_pool
        self.conn: Any = None

    def call(self, *args: Any) -> Any:
        if self.conn is None:
            self.conn = self.pool.get_connection()
        try:
            self.conn.send_command(*args)
            return self.conn.read_response()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            self.conn.disconnect()  # the next call connects again (a new id)
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.pool.release(self.conn)
            self.conn = None


class ConnWatch:
    """Tracks trainers' heartbeat connections for ``Reaper``.

    Args:
        client: the ``taskq.Client`` (its Redis connection must be a plain or Sentinel
            one: a cluster client turns the watch off).
        grace: seconds a seen connection must stay gone; None: half the job's heartbeat
            interval.
        quiet: the worker must also have made no call for this many heartbeat intervals.
        recheck: seconds between looks while the watch is off.
        clock: a monotonic clock (seconds).
    """

    def __init__(
        self,
        client: Any,
        grace: float | None = None,
        quiet: float = 1.25,
        recheck: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if grace is not None and grace < 0:
            raise errors.InvalidInput(f"grace must be >= 0, got {grace!r}")
        if quiet < 1.0:
            raise errors.InvalidInput(f"quiet must be >= 1 heartbeat interval, got {quiet!r}")
        self.client = client
        self.grace = grace
        self.quiet = float(quiet)
        self.recheck = float(recheck)
        self.clock = clock
        #: Why the watch is off ('' while on).
        self.off = ""
        #: When the next tick could declare a worker lost (monotonic), else None.
        self.next_due: float | None = None
        #: Workers declared lost by a closed connection, since start.
        self.declared = 0
        self._own_id: str | None = None
        self._own: _OwnConnection | None = None
        self._off_until = 0.0
        self._gone: dict[_Key, float | None] = {}  # seen keys -> gone since (None: present)
        # (job, worker, incarnation) -> a connection id seen under its name since this
        # watch's own connection was made: the heartbeat's connection replaces the one
        # the worker registered on, and a trainer killed before the next look is judged
        # by the new id too (both belong to its process; a restart clears this)
        self._incs: dict[tuple[str, str, str], str] = {}

    # -- once per tick ------------------------------------------------------------------
    def begin_tick(self) -> bool:
        """Check that this reaper can see connections; False while the watch is off.

        Raises:
            ConnectionLost: Redis unreachable.
        """
        self.next_due = None
        now = self.clock()
        if self.off and now < self._off_until:
            return False
        r = self.client.redis
        if not isinstance(r, redis.Redis):
            return self._turn_off("a Redis Cluster client (connections live on many nodes)")
        if self._own is None:
            self._own = _OwnConnection(r)
        try:
            with translate(self.client.url):
                own = str(self._own.call("CLIENT", "ID"))
                listed = _parse_client_list(self._own.call("CLIENT", "LIST", "ID", own))
        except redis.exceptions.ResponseError as e:
            return self._turn_off(f"CLIENT LIST refused ({e})")
        except errors.TaskqError as e:
            if isinstance(e, errors.ConnectionLost):
                raise
            return self._turn_off(f"CLIENT LIST refused ({e})")
        if own != self._own_id:
            # a new connection of our own: Redis restarted, failed over, or we reconnected.
            # Ids seen before may now name other connections: start over.
            self._gone.clear()
            self._incs.clear()
            self._own_id = own
        if not any(str(c.get("id")) == own for c in listed):
            return self._turn_off(
                "CLIENT LIST does not show this reaper's own connection "
                "(a proxy or a managed service?)"
            )
        if self.off:
            log.info("closed connections are watched again")
            self.off = ""
        return True

    def _turn_off(self, why: str) -> bool:
        if self.off != why:
            log.warning(
                "closed connections are not watched: %s; lost workers are found after their ttl",
                why,
            )
        self.off = why
        self._off_until = self.clock() + self.recheck
        self._gone.clear()
        self._incs.clear()
        return False

    # -- per job ------------------------------------------------------------------------
    def check(self, job: str) -> int:
        """Look up the job's workers' connections; declare lost those gone long enough.

        Args:
            job: the job name.

        Returns:
            The number of leases re-dispatched by the declarations.

        Raises:
            ConnectionLost: Redis unreachable.
            JobNotFound: the job vanished.
        """
        hbi_ms, rows = self._rows(job)
        grace = self.grace if self.grace is not None else hbi_ms / 2000.0
        min_quiet_ms = int(self.quiet * hbi_ms)
        present = self._present([row[2] for row in rows])
        now = self.clock()
        listed: set[_Key] = set()
        reclaimed = 0
        for worker, winc, cid, quiet_ms in rows:
            key = (job, worker, winc, cid)
            listed.add(key)
            name = present.get(cid)
            if name is not None:
                if name == trainer_conn_name(winc) or key in self._gone:
                    self._gone[key] = None  # seen (a rename later does not unsee it)
                    self._incs[key[:3]] = cid
                continue
            if key not in self._gone and self._incs.get(key[:3]) in (None, cid):
                continue  # never seen as this worker's: not ours to judge
            since = self._gone.get(key)
            if since is None:
                since = self._gone[key] = now
            due = max(since + grace, now + (min_quiet_ms - int(quiet_ms)) / 1000.0)
            if due > now:
                self._due(due)
                continue
            reply = self.client.run(
                job, "closed", ["", worker, winc, cid, min_quiet_ms, MAX_RECLAIM]
            )
            if int(reply[0]) == Code.OK:
                self.declared += 1
                reclaimed += int(reply[1])
                log.info(
                    "job %s: worker %s/%s declared lost: its connection %s closed %.0f ms ago",
                    job,
                    worker,
                    winc,
                    cid,
                    (now - since) * 1000,
                )
                del self._gone[key]
            else:
                self._due(now + grace)
        for key in [k for k in self._gone if k[0] == job and k not in listed]:
            del self._gone[key]
        incs = {k[:3] for k in listed}
        for inc in [i for i in self._incs if i[0] == job and i not in incs]:
            del self._incs[inc]
        return reclaimed

    def close(self) -> None:
        """Give the watch's own connection back to the pool."""
        if self._own is not None:
            self._own.close()
            self._own = None
        self._own_id = None

    def watched(self, job: str) -> list[tuple[str, str, str]]:
        """(worker, incarnation, connection id) of ``job``'s workers the watch has seen
        under the worker's name: those it would declare lost once gone."""
        return [(w, i, c) for (j, w, i, c) in self._gone if j == job]

    def forget(self, job: str) -> None:
        """Drop what was seen of ``job`` (it vanished or is reaped by another reaper)."""
        for key in [k for k in self._gone if k[0] == job]:
            del self._gone[key]
        for inc in [i for i in self._incs if i[0] == job]:
            del self._incs[inc]

    def _due(self, t: float) -> None:
        if self.next_due is None or t < self.next_due:
            self.next_due = t

    def _rows(self, job: str) -> tuple[int, list[tuple[str, str, str, int]]]:
        rows: list[tuple[str, str, str, int]] = []
        offset, hbi_ms = 0, 1000
        while len(rows) < MAX_IDS_PER_JOB:
            reply = self.client.run(job, "conns", [offset, _LIST_BATCH])
            hbi_ms = int(reply[1])
            rows += [(str(w), str(i), str(c), int(q)) for w, i, c, q in reply[3]]
            offset = int(reply[2])
            if offset == 0:
                break
        return hbi_ms, rows

    def _present(self, ids: list[str]) -> dict[str, str]:
        """Connection id -> name, for those of ``ids`` that exist (bounded batches)."""
        out: dict[str, str] = {}
        r = self.client.redis
        uniq = sorted({i for i in ids if i.isdigit()})  # a trainer's word, not trusted
        with translate(self.client.url):
            for i in range(0, len(uniq), ID_BATCH):
                for c in r.client_list(client_id=uniq[i : i + ID_BATCH]):
                    out[str(c.get("id"))] = str(c.get("name") or "")
        return out
