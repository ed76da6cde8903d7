"""The reaper: re-dispatches expired leases and what lost workers held, within seconds.

The lease script already reclaims lazily when a trainer asks for work; the reaper bounds
recovery when nobody asks (every other trainer busy with long tasks). Each tick runs the
reap script (``lua/reap.lua``) per job in bounded batches: leases past their task
timeout, and every lease of a worker whose liveness deadline passed, go back to the
front of todo (or dead at their caps), waiters are woken, and each re-dispatch records
its lateness in the job's ``hist`` hash. The server judges everything, including the
silence rule, so several reapers may run at once: a short per-job lock keeps them from
stampeding and the scripts' atomicity keeps any lease from being re-dispatched twice.

Data flow: ``taskq reaper`` (cli/reaper.py) -> reaper.py -> ``taskq.Client`` (the job
handles; jobs.py's barrier step) -> engine/transport.py (lua) -> Redis <- trainer/core.py.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import time

import redis
from redis.backoff import AbstractBackoff, EqualJitterBackoff

from taskq import errors
from taskq.admin.client import Client
from taskq.admin.jobs import advance_all
from taskq.ops.connwatch import ConnWatch
from taskq.ops.stopping import StopOnSignals

log = logging.getLogger("taskq.reaper")

#: ``run()`` exit codes.
EXIT_OK = 0
EXIT_GAVE_UP = 1

#: Reap calls per job per tick at most (each reclaims at most ``batch`` leases); what is
#: left waits for the next tick, which then starts at once.
MAX_BATCHES_PER_TICK = 10

_INDEX = "<job index>"  # the name problems with the job index are logged under


def default_reaper_id() -> str:
    """``host:pid:random``: the owner name of the per-job lock, unique per reaper."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


#: At most this many tasks are named in one job's part of a tick's log line.
LOGGED_TASKS = 10


class Reaper:
    """Re-dispatches expired and orphaned leases of some or all jobs, tick after tick.

    Args:
        client: the ``taskq.Client`` to work through.
        jobs: job names to reap; every job in the index (listed anew each tick) when None.
        interval: seconds from the start of one tick to the start of the next.
        give_up_after: seconds of continuous Redis unreachability after which ``run()``
            returns ``EXIT_GAVE_UP``; retry for ever when None.
        batch: leases reclaimed per script call at most (bounds the time Redis is busy).
        max_batches: script calls per job per tick at most.
        lock_ms: the per-job lock's lifetime; another reaper skips a locked job until it
            lapses (a standby takes over this long after the active reaper stops).
            Default: three intervals, at least 1 s.
        reaper_id: the lock's owner name (``host:pid:random`` by default).
        backoff: a redis-py backoff deciding the wait between attempts while Redis is
            unreachable (default ``EqualJitterBackoff(cap=5.0, base=0.1)``).
        watch_connections: also declare lost, in about a second, a worker whose heartbeat
            connection closed (a SIGKILLed trainer; connwatch.py); off where Redis does not
            show connections (logged once), and then the ttl alone decides.
        conn_grace: seconds a closed connection must stay gone (default: half the job's
            heartbeat interval).

    Raises:
        InvalidInput: a non-positive interval, batch or max_batches, or a negative
            give_up_after.
    """

    def __init__(
        self,
        client: Client,
        jobs: list[str] | None = None,
        interval: float = 0.5,
        give_up_after: float | None = None,
        *,
        batch: int = 1000,
        max_batches: int = MAX_BATCHES_PER_TICK,
        lock_ms: int | None = None,
        reaper_id: str | None = None,
        backoff: AbstractBackoff | None = None,
        watch_connections: bool = True,
        conn_grace: float | None = None,
    ) -> None:
        if not interval > 0:
            raise errors.InvalidInput(f"interval must be positive, got {interval!r}")
        if give_up_after is not None and give_up_after < 0:
            raise errors.InvalidInput(f"give_up_after must be >= 0, got {give_up_after!r}")
        if batch < 1 or max_batches < 1:
            raise errors.InvalidInput(
                f"batch and max_batches must be >= 1, got {batch}, {max_batches}"
            )
        if jobs is not None:
            for job in jobs:
                client.keys(job)  # validates the name up front
        self.client = client
        self.jobs = list(jobs) if jobs is not None else None
        self.interval = float(interval)
        self.give_up_after = give_up_after
        self.batch = int(batch)
        self.max_batches = int(max_batches)
        self.lock_ms = int(lock_ms) if lock_ms else max(1000, int(3000 * self.interval))
        self.reaper_id = reaper_id or default_reaper_id()
        self.backoff = backoff or EqualJitterBackoff(cap=5.0, base=0.1)
        #: Jobs another reaper held the lock of during the last tick.
        self.locked: list[str] = []
        #: Jobs that still had work left when the last tick's batches ran out.
        self.backlog: list[str] = []
        self._problems: dict[str, str] = {}
        self.watch = ConnWatch(client, grace=conn_grace) if watch_connections else None
        self._watching = False

    # -- one pass over the jobs -------------------------------------------------------
    def tick(self) -> dict[str, int]:
        """Reap every job once (bounded batches per job).

        A job that vanished, holds data the scripts cannot read, or otherwise fails is
        logged (once per distinct problem) and skipped; the others are still reaped.

        Returns:
            Job name -> leases reclaimed in this tick, for every job reaped without error
            (0 for a job locked by another reaper, see ``self.locked``).

        Raises:
            ConnectionLost: Redis is unreachable (``run()`` retries with backoff).
        """
        started = time.monotonic()
        jobs = self._jobs()
        self.locked, self.backlog = [], []
        self._watching = self.watch is not None and self.watch.begin_tick()
        reclaimed: dict[str, int] = {}
        for job in jobs:
            if job == _INDEX:
                continue
            try:
                reclaimed[job] = self._reap_job(job)
            except errors.ConnectionLost:
                raise
            except errors.JobNotFound as e:
                self._problem(job, logging.INFO, f"skipped: {e}")
            except (errors.TaskqError, redis.exceptions.ResponseError) as e:
                self._problem(job, logging.ERROR, f"cannot reap ({type(e).__name__}): {e}")
            else:
                if self._problems.pop(job, None) is not None:
                    log.info("job %s: reaping again", job)
        if self.jobs is None:  # all jobs: sharded ones whose trainers all died at a pass
            try:  # boundary move on (docs/sharding.md)
                for name, to in advance_all(self.client.connection).items():
                    log.info("sharded job %s: every shard finished its pass; now pass %d", name, to)
            except errors.ConnectionLost:
                raise
            except (errors.TaskqError, redis.exceptions.ResponseError) as e:
                self._problem("(sharded jobs)", logging.ERROR, f"barrier step failed: {e}")
        # forget problems of jobs no longer listed, so a re-created job is reported anew
        for job in set(self._problems) - set(jobs):
            del self._problems[job]
        total = sum(reclaimed.values())
        if total:
            took_ms = (time.monotonic() - started) * 1000
            detail = "; ".join(self._what(job, n) for job, n in reclaimed.items() if n)
            more = f"; work left in {', '.join(self.backlog)}" if self.backlog else ""
            log.info("re-dispatched %d lease(s) in %.0f ms: %s%s", total, took_ms, detail, more)
        return reclaimed

    def _what(self, job: str, n: int) -> str:
        """``J=2: task 3 (worker_lost, worker w1, 12 ms late), ...``: the newest ``n`` expiry events
        (this tick's, as the job's reap lock keeps other reapers out), at most
        ``LOGGED_TASKS`` named. Reading them is best effort: the count is the record."""
        try:
            expired = self.client.job(job).latest_events(
                "expired", min(n, LOGGED_TASKS), scan=min(1000, 4 * n + 50)
            )
        except (errors.TaskqError, redis.exceptions.RedisError):
            return f"{job}={n}"
        named = ", ".join(
            f"task {e.get('task', '?')} ({e.get('reason', '?')}, worker "
            f"{e.get('worker', '?')}, {e.get('lateness_ms', '?')} ms late)"
            for e in expired
        )
        rest = f", +{n - len(expired)} more" if n > len(expired) else ""
        return f"{job}={n}: {named}{rest}" if named else f"{job}={n}"

    def _jobs(self) -> list[str]:
        if self.jobs is not None:
            return self.jobs
        try:
            jobs = self.client.list_jobs()
        except (errors.CorruptData, redis.exceptions.ResponseError) as e:
            self._problem(_INDEX, logging.ERROR, f"cannot list jobs: {e}")
            return [_INDEX]  # keeps the problem remembered (and logged once)
        if self._problems.pop(_INDEX, None) is not None:
            log.info("the job index is readable again")
        return jobs

    def _reap_job(self, job: str) -> int:
        total = 0
        for _ in range(self.max_batches):
            did, more, locked = self.client.job(job).reap(
                budget=self.batch, lock_ms=self.lock_ms, owner=self.reaper_id
            )
            if locked:
                self.locked.append(job)
                if self.watch is not None:
                    self.watch.forget(job)  # the lock holder watches it
                return total
            total += did
            if not more:
                if self._watching and self.watch is not None:
                    total += self.watch.check(job)
                # a stream's done tasks behind its watermark go, one bounded step a tick
                # (a job not trimmed, neither a stream nor fed by one, answers at once: trim.lua)
                self.client.job(job).trim()
                return total
        self.backlog.append(job)
        return total

    def _problem(self, job: str, level: int, message: str) -> None:
        if self._problems.get(job) != message:
            self._problems[job] = message
            if job == _INDEX:
                log.log(level, "%s", message)
            else:
                log.log(level, "job %s: %s", job, message)

    # -- the loop ---------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> int:
        """Tick every ``interval`` seconds until ``stop`` is set (or SIGTERM / SIGINT
        arrives, when called on the main thread: the current tick finishes first and the
        previous handlers are restored).

        While Redis is unreachable it logs and retries with backoff; after
        ``give_up_after`` seconds of it, it logs why and returns ``EXIT_GAVE_UP``.

        Args:
            stop: an event that ends the loop when set.

        Returns:
            The process exit code: ``EXIT_OK`` after a requested stop, ``EXIT_GAVE_UP``.
        """
        stop = stop if stop is not None else threading.Event()

        def on_signal(signum: int) -> None:
            log.info("%s received: stopping after the current tick", signal.Signals(signum).name)

        try:
            with StopOnSignals(stop, on_signal=on_signal):
                return self._loop(stop)
        finally:
            if self.watch is not None:
                self.watch.close()

    def _loop(self, stop: threading.Event) -> int:
        jobs = "every job" if self.jobs is None else ", ".join(self.jobs) or "no job"
        log.info(
            "reaper %s: %s at %s, every %.2f s",
            self.reaper_id,
            jobs,
            self.client.url,
            self.interval,
        )
        failures = 0
        down_since: float | None = None
        while not stop.is_set():
            tick_start = time.monotonic()
            try:
                reclaimed = self.tick()
            except errors.ConnectionLost as e:
                if down_since is None:
                    down_since = tick_start
                down_for = time.monotonic() - down_since
                if self.give_up_after is not None and down_for >= self.give_up_after:
                    log.error(
                        "giving up: Redis unreachable for %.1f s (give-up-after %g s): %s",
                        down_for,
                        self.give_up_after,
                        e,
                    )
                    return EXIT_GAVE_UP
                failures += 1
                delay = self.backoff.compute(failures)
                if self.give_up_after is not None:
                    delay = min(delay, max(0.0, self.give_up_after - down_for))
                log.warning(
                    "Redis unreachable for %.1f s; retrying in %.2f s (attempt %d): %s",
                    down_for,
                    delay,
                    failures,
                    e,
                )
                stop.wait(delay)
                continue
            if down_since is not None:
                log.info("Redis reachable again after %.1f s", time.monotonic() - down_since)
                down_since, failures = None, 0
                self.backoff.reset()
            if self.backlog and sum(reclaimed.values()):
                continue  # bounded work per call; the rest goes on at once
            wait = self.interval - (time.monotonic() - tick_start)
            if self.watch is not None and self.watch.next_due is not None:
                # a closed connection's grace ends before the next tick: wake for it
                wait = min(wait, self.watch.next_due - time.monotonic())
            stop.wait(max(0.0, wait))
        log.info("reaper %s stopped", self.reaper_id)
        return EXIT_OK
