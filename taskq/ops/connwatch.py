"""Closed connections: the reaper notices a SIGKILLed trainer in about a second.

The kernel closes a dead process's sockets at once and Redis drops them from CLIENT
LIST within milliseconds. Every trainer names its heartbeat connection
(``connection.trainer_conn_name``) and sends that connection's CLIENT ID with its
heartbeats; the worker record keeps it (``lua/heartbeat.lua``), and the connection the
worker registered on as its *witness* once the heartbeats go out on another
(``lib/workers.lua`` set_conn). Each tick the reaper lists the ids of a job's workers
(``lua/conns.lua``, bounded batches), looks only those up with ``CLIENT LIST ID ...``
(at most ``batch`` ids a call, never the whole list), and declares a worker lost
(``lua/closed.lua``, fenced on its incarnation and connection id) when a connection it
has seen carrying the worker's name has been gone for ``grace`` and the worker has sent
no heartbeat for ``quiet`` heartbeat intervals and ``quiet_ttl`` of its own ttl. Heartbeats
and the ttl stay the backstop.

A closed connection is evidence, not a verdict: it counts only if the connection was
carrying heartbeats when it closed (the idle time the last look saw, plus the time
since, under two heartbeat intervals and under 2 s at least) and the witness is not open
under the worker's name. A close that does not count is left to the ttl (or to the
trainer's next heartbeat, which records a new connection). So it never misfires on:

- Redis's ``timeout`` closing a stalled trainer's idle connections (SIGSTOP, a VM pause, a
  long GIL-bound step inside the ttl): the last look saw the connection idle.
- ``CLIENT KILL`` of the heartbeat connection, or a proxy dropping it, even with the
  trainer stalled right after: the witness is open; the next heartbeat reconnects,
  and records the new id (``protocol._conn_id`` names the connection again after any
  reconnect, ``Scripts.own_resets``).
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

What it cannot tell from a death (docs/reaper.md): a ``CLIENT KILL`` of a beating
connection with no witness open (a trainer's first heartbeat interval, an idle-closed
witness) followed at once by a stall longer than ``quiet``; a Redis ``timeout`` shorter
than twice the heartbeat interval (or than 2 s) on a stalled trainer.

Data flow: reaper.py -> connwatch.py -> engine/transport.py (conns, closed) and CLIENT LIST ID
-> Redis <- trainer heartbeats (CLIENT ID).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from taskq import errors
from taskq.engine.connection import trainer_conn_name, translate
from taskq.engine.contract import MAX_RECLAIM, PAGE_MAX, Code

log = logging.getLogger("taskq.reaper")

#: Ids looked up per CLIENT LIST ID call at most (each costs Redis ~1 us per id).
ID_BATCH = 100
#: Worker ids listed per job per tick at most (the rest waits for later ticks).
MAX_IDS_PER_JOB = 5000
#: Workers listed per conns script call.
_LIST_BATCH = PAGE_MAX  # workers listed per conns call

_Key = tuple[str, str, str, str]  # job, worker, incarnation, connection id
_Row = tuple[str, str, str, int, int, str]  # worker, incarnation, conn, quiet_ms, ttl_ms, witness


class _Seen:
    """A connection seen under its worker's name: when last seen and how idle (CLIENT
    LIST ``idle``, whole seconds); once gone, since when and whether its closing is
    evidence of the trainer's death."""

    __slots__ = ("at", "idle_s", "gone", "evidence")

    def __init__(self, at: float, idle_s: int) -> None:
        self.at = at
        self.idle_s = idle_s
        self.gone: float | None = None
        self.evidence = False


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
        quiet: the worker must also have sent no heartbeat (nor registered) for this many
            heartbeat intervals,
        quiet_ttl: ... and for this fraction of its own ttl (a trainer given a long ttl
            for long steps is judged against it).
        recheck: seconds between looks while the watch is off.
        clock: a monotonic clock (seconds).
    """

    def __init__(
        self,
        client: Any,
        grace: float | None = None,
        quiet: float = 1.25,
        quiet_ttl: float = 0.25,
        recheck: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if grace is not None and grace < 0:
            raise errors.InvalidInput(f"grace must be >= 0, got {grace!r}")
        if quiet < 1.0:
            raise errors.InvalidInput(f"quiet must be >= 1 heartbeat interval, got {quiet!r}")
        if not 0.0 <= quiet_ttl < 1.0:
            raise errors.InvalidInput(f"quiet_ttl must be in [0, 1), got {quiet_ttl!r}")
        self.client = client
        self.grace = grace
        self.quiet = float(quiet)
        self.quiet_ttl = float(quiet_ttl)
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
        self._seen: dict[_Key, _Seen] = {}  # keys seen under the worker's name
        # (job, worker, incarnation) -> the last connection id seen under its name since
        # this watch's own connection was made, when, and its idle time: the heartbeat's
        # connection replaces the one the worker registered on, and a trainer killed
        # before the next look is judged by the new id too (both belong to its process;
        # a restart clears this)
        self._incs: dict[tuple[str, str, str], tuple[str, float, int]] = {}

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
            self._seen.clear()
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
        self._seen.clear()
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
        # a connection carrying heartbeats shows an idle time (whole seconds) plus time
        # since that look below this; one closed while idle longer (Redis's `timeout`
        # closes at idle > timeout, so any timeout of at least this) says nothing
        beating_ms = 2 * max(hbi_ms, 1000)
        present = self._present([row[2] for row in rows])
        # the witnesses only of connections gone (one more lookup, only when one closed)
        present.update(self._present([r[5] for r in rows if r[2] not in present and r[5]]))
        now = self.clock()
        listed: set[_Key] = set()
        reclaimed = 0
        for worker, winc, cid, quiet_ms, ttl_ms, wid in rows:
            key = (job, worker, winc, cid)
            inc = key[:3]
            mine = trainer_conn_name(winc)
            listed.add(key)
            found = present.get(cid)
            seen = self._seen.get(key)
            if found is not None:
                if found[0] == mine or seen is not None:
                    # seen (a rename later does not unsee it), and how idle it was
                    self._seen[key] = _Seen(now, found[1])
                    self._incs[inc] = (cid, now, found[1])
                continue
            if seen is None:
                last = self._incs.get(inc)
                if last is None or last[0] == cid:
                    continue  # never seen as this worker's: not ours to judge
                # a new id of a connection seen under its name: judged by that sighting
                seen = self._seen[key] = _Seen(last[1], last[2])
            if seen.gone is None:
                seen.gone = now
                # closed while carrying heartbeats, as far as the last look tells?
                seen.evidence = seen.idle_s * 1000 + (now - seen.at) * 1000 < beating_ms
            if seen.evidence:
                other = present.get(wid) if wid and wid != cid else None
                if other is not None and other[0] == mine:
                    # another connection of the same process is open: the heartbeat's
                    # alone was closed (CLIENT KILL, a proxy); the trainer reconnects on
                    # its next heartbeat, or its ttl decides
                    seen.evidence = False
            if not seen.evidence:
                continue  # the ttl decides
            min_quiet_ms = max(int(self.quiet * hbi_ms), int(self.quiet_ttl * ttl_ms))
            due = max(seen.gone + grace, now + (min_quiet_ms - quiet_ms) / 1000.0)
            if due > now:
                self._due(due)
                continue
            reply = self.client.connection.run(
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
                    (now - seen.gone) * 1000,
                )
                del self._seen[key]
            else:
                self._due(now + grace)
        for key in [k for k in self._seen if k[0] == job and k not in listed]:
            del self._seen[key]
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
        return [(w, i, c) for (j, w, i, c) in self._seen if j == job]

    def forget(self, job: str) -> None:
        """Drop what was seen of ``job`` (it vanished or is reaped by another reaper)."""
        for key in [k for k in self._seen if k[0] == job]:
            del self._seen[key]
        for inc in [i for i in self._incs if i[0] == job]:
            del self._incs[inc]

    def _due(self, t: float) -> None:
        if self.next_due is None or t < self.next_due:
            self.next_due = t

    def _rows(self, job: str) -> tuple[int, list[_Row]]:
        """The job's heartbeat interval (ms) and its workers with a known connection."""
        rows: list[_Row] = []
        offset, hbi_ms = 0, 1000
        while len(rows) < MAX_IDS_PER_JOB:
            reply = self.client.connection.run(job, "conns", [offset, _LIST_BATCH])
            hbi_ms = int(reply[1])
            rows += [
                (str(w), str(i), str(c), int(q), int(t), str(x)) for w, i, c, q, t, x in reply[3]
            ]
            offset = int(reply[2])
            if offset == 0:
                break
        return hbi_ms, rows

    def _present(self, ids: list[str]) -> dict[str, tuple[str, int]]:
        """Connection id -> (name, idle seconds), for those of ``ids`` that exist (bounded
        batches)."""
        out: dict[str, tuple[str, int]] = {}
        r = self.client.redis
        uniq = sorted({i for i in ids if i.isdigit()})  # a trainer's word, not trusted
        with translate(self.client.url):
            for i in range(0, len(uniq), ID_BATCH):
                for c in r.client_list(client_id=uniq[i : i + ID_BATCH]):
                    idle = str(c.get("idle") or "0")
                    out[str(c.get("id"))] = (
                        str(c.get("name") or ""),
                        int(idle) if idle.isdigit() else 0,
                    )
        return out
