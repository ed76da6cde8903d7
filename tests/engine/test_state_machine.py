"""A hypothesis state machine drives the engine (manual clock) through random steps of
every verb (lease, ack, fail, release, progress, heartbeat, expiry on the manual clock,
reap, retry, revoke, reset, advance and force, pause / resume, a checkpoint's cut and its
later steps interleaved with the rest, rewind, cancel, append and seal; backup leases in a
second machine, split tails in a third, an open stream in a fourth, a mixed job with
weights set at stated slots in a fifth)
and checks the invariants of docs/design.md after every one, against a plain-Python model
of who holds what and which tasks each pass attempt acked. The model is the trainers'
side; Redis is the truth checked for consistency and membership."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support import check_debt_readers

import taskq
from taskq import integrity
from taskq.admin.mix import (
    copies_at,
    copy_field,
    feed_entries,
    feed_log,
    kept_passes,
    pass_life,
    spec_of,
    stores,
    task_fields,
    weight_entries,
    weight_log,
)
from taskq.admin.stats import parse_lease
from taskq.data import order_key, task_size
from taskq.engine.contract import Code
from taskq.mix import Feed, pass_schedule, plan_pass

N_TASKS = 5  # at the create; appends add up to MAX_TASKS
MAX_TASKS = 9
WORKERS = ("w0", "w1", "w2")
_ids = itertools.count()
#: what a worker's loop honours of a lease, as it registers (docs/design.md, "Pieces only
#: to consumers that read ranges"): whole tasks (the README's loop), the range it is
#: handed (``taskq work --ranges``), that range with an end that moves (``read_task(task)``)
READS = {
    "w": {},
    "r": {"ranges": True, "split_tails": False},
    "s": {"ranges": True},
}


@pytest.fixture(scope="module")
def sm_url(redis_server):
    return redis_server.url


#: The machines' jobs' limits: a worker lost after 3 s of silence, no task
#: timeout, a task dead at its first failure or third started lease.
LIMITS: dict[str, Any] = dict(
    worker_ttl=3.0, heartbeat_interval=1.0, task_timeout=None, max_failures=1, max_attempts=3
)


class EngineMachine(RuleBasedStateMachine):
    url: str = ""
    backup_leases = False
    split_tails = False
    stream = False
    shuffle_samples = False
    passes: int | None = None
    chunks: list = list(range(N_TASKS))  # noqa: RUF012 -- (a subclass's, never changed)
    #: each worker's kind (READS)
    kinds: dict = {w: "w" for w in WORKERS}  # noqa: RUF012 -- (copied per machine)

    def __init__(self) -> None:
        super().__init__()
        self.client = taskq.connect(self.url)
        self.job = f"sm-{next(_ids)}"
        self._create()
        self.kinds = dict(self.kinds)
        self.trainers = {w: self._trainer(w) for w in WORKERS}
        self.held: dict[str, list[taskq.Task]] = {w: [] for w in WORKERS}
        self.ended: list[tuple[str, taskq.Task]] = []
        self.max_token = 0
        self.last_pass = 0
        self.last_round = self._meta("round")
        self.last_done = 0
        self.forced = False
        # the model of membership: the tasks each pass attempt (round) acked, each once
        self.acked: dict[int, set[int]] = {self.last_round: set()}
        self.summaries_seen = 0
        self.cancelled = False
        self.open_ck: tuple[str, set[int], set[int]] | None = None
        self.sealed: list[tuple[str, set[int], set[int]]] = []
        # (chunk id, the task it went into): an id is remembered while its task is
        # (docs/streams.md "Ids": the ids go with their task when a stream is trimmed)
        self.appended_ids: list[tuple[str, int]] = []

    def _create(self) -> None:
        """Create the job the machine drives (MixedMachine: a mixed one)."""
        self.client.create_job(
            self.job,
            chunks=list(self.chunks),
            passes=self.passes,
            **LIMITS,
            shuffle=True,
            seed=11,
            backup_leases=self.backup_leases,
            split_tails=self.split_tails,
            stream=self.stream,
            manual_clock=True,
            auto_advance=False,
            shuffle_samples=self.shuffle_samples,
        )

    # -- helpers -----------------------------------------------------------------
    def _trainer(self, w: str) -> taskq.Trainer:
        return taskq.Trainer(
            self.job, client=self.client, worker_id=w, heartbeat=False, **READS[self.kinds[w]]
        )

    def _leased(self, w: str, task: taskq.Task) -> None:
        """A lease granted to ``w``: its task's sample order is the job's (the same key
        for every reader); SplitMachine checks who may be handed a piece."""
        seed = 11 if self.shuffle_samples else None
        want = None if seed is None else order_key(self.job, seed, task.pass_no, task.id)
        assert task.order == want, "a task's sample order is the job's"

    def _meta(self, field: str) -> int:
        return int(float(self.client.redis.hget(self.client.keys(self.job).meta, field) or 0))

    def _piece_round(self) -> int:
        """The round the pass attempt's pieces are recorded under (lib/split.lua): the
        completed attempt's (meta sround), which a retry reopens, or the current one."""
        return self._meta("sround") or self._meta("round")

    def _is_current(self, worker: str, task: taskq.Task) -> bool:
        keys = self.client.keys(self.job)
        lease = parse_lease(self.client.redis.hget(keys.leases, str(task.id)))
        # a task at the tail of a pass may have a backup lease beside it (field b:<task>)
        backup = parse_lease(self.client.redis.hget(keys.leases, f"b:{task.id}"))
        if (
            backup
            and backup["worker"] == worker
            and not (lease and lease["worker"] == worker and lease["live"])
        ):
            lease = backup
        return bool(lease and lease["token"] == task.token and self._holds(worker, lease))

    def _holds(self, worker: str, lease: dict[str, Any]) -> bool:
        """``lease`` is still ``worker``'s: live, of this round and incarnation, and its
        worker alive. The call reclaims first: a worker past its liveness deadline (on the
        job's clock, after the silence rule) has already lost its leases when it writes."""
        keys, t = self.client.keys(self.job), self.trainers[worker]
        now, seen = int(self.client.redis.get(keys.clock) or 0), self._meta("seen")
        offset = self._meta("offset")
        if now - seen > self._meta("ttl") - self._meta("hbi"):
            offset += now - seen
        deadline = self.client.redis.zscore(keys.workers, f"{worker}|{t.incarnation}")
        return bool(
            deadline is not None
            and deadline >= now - offset
            and lease["live"]
            and lease["round"] == self._meta("round")
            and lease["worker"] == worker
            and lease["worker_incarnation"] == t.incarnation
        )

    def _end(self, worker: str, task: taskq.Task, op: str) -> None:
        current = self._is_current(worker, task)
        done_before = self._meta("ndone")
        rnd = self._meta("round")
        fn = getattr(self.trainers[worker], op)
        if current:
            if op == "ack":
                self._took(task)
            fn(task)
            if op == "ack":
                assert task.id not in self._attempt(rnd), "a task acked twice in one attempt"
                self._attempt(rnd).add(task.id)
                self._check_read(task)
                assert self._meta("ndone") == done_before + 1 or self._meta("round") != rnd
        else:
            with pytest.raises(taskq.LeaseLost):
                fn(task)
        if task in self.held[worker]:
            self.held[worker].remove(task)
        self.ended.append((worker, task))

    def _n(self) -> int:
        """The tasks the job has now: the create's (meta) and the appended (their own
        record, keys.APPENDED_FIELDS)."""
        keys = self.client.keys(self.job)
        return self._meta("n") + int(self.client.redis.hget(keys.appended, "tasks") or 0)

    def _attempt(self, rnd: int) -> set[int]:
        """The tasks the model saw acked in pass attempt ``rnd`` (a new round acked none)."""
        return self.acked.setdefault(rnd, set())

    def _sets(self) -> tuple[set[int], set[int]]:
        """(done set, dead set) as Redis holds them."""
        keys, r = self.client.keys(self.job), self.client.redis
        return (
            {i for i in range(self._n()) if r.getbit(keys.done, i)},
            {int(x) for x in r.smembers(keys.dead)},
        )

    def _pieces(self) -> set[int]:
        """Tasks reachable through a piece of a split task (none without splits)."""
        return set()

    def _took(self, task: taskq.Task, n: int | None = None) -> None:
        """A holder's loop took samples of ``task`` up to ``n`` (None: to the end it
        honours, as its ack says): modelled by SplitMachine only."""

    def _check_read(self, task: taskq.Task) -> None:
        """``task`` was just counted done: SplitMachine checks every sample was taken."""

    def _ack_state(self, task: taskq.Task) -> Any:
        """What SplitMachine reads of ``task`` just before a current lease's ack is sent
        (``_counted`` compares it with what the ack left)."""
        return None

    def _counted(self, w: str, task: taskq.Task, rnd: int, before: Any) -> None:
        """``w``'s current ack of ``task`` in pass attempt ``rnd`` was just sent (``before``:
        ``_ack_state`` then): SplitMachine counts the samples it covers."""

    def _drop_held(self) -> None:
        """Every lease held went stale at once (a rewind, a cancel): late writes now."""
        for w in WORKERS:
            self.ended += [(w, t) for t in self.held[w]]
            self.held[w] = []

    # -- rules -------------------------------------------------------------------
    def teardown(self) -> None:
        """The reachability check, then every trainer closed (each would otherwise be
        dropped without ``close()``: a warning per trainer and example)."""
        try:
            self._every_live_task_reachable()
        finally:
            for t in self.trainers.values():
                t.close()

    def _every_live_task_reachable(self) -> None:
        """No live task is unreachable: once every lease is given back, leasing and acking
        finishes the pass (or the job waits with every task dead, or was cancelled)."""
        if self.cancelled:
            return
        self.client.resume_job(self.job)
        if self.stream:
            self.client.job(self.job).seal()  # an open stream's pass never ends
        s = self.client.status(self.job)
        if s.state != "running":
            return
        for w in WORKERS:
            for task in self.held[w]:
                try:
                    self.trainers[w].release(task)
                except (taskq.LeaseLost, taskq.WorkerLost):
                    pass
            # its heartbeat takes back the leases it no longer holds (after a rollback:
            # ones it ended, which the server forgot)
            self.trainers[w].heartbeat()
        pass0 = s.pass_no
        # (a range reader: a head piece whose tail was taken waits for one)
        t = taskq.Trainer(
            self.job, client=self.client, worker_id="closer", heartbeat=False, ranges=True
        )
        try:
            for _ in range(4 * self._n()):
                s = self.client.status(self.job)
                if s.pass_no != pass0 or s.state != "running":
                    break
                try:
                    task = t.lease(timeout=0)
                except taskq.JobCompleted:  # (its last pass ended at this lease's charge)
                    break
                if task is None:
                    # time goes on: a lease of a worker incarnation the server forgot the
                    # end of (a rollback) is taken back once that incarnation's liveness
                    # runs out
                    self.client.advance_clock(self.job, 4000)
                    t.heartbeat()
                    self.client.reap(self.job)
                    continue
                t.ack(task)
        finally:
            t.close()
        s = self.client.status(self.job)
        assert s.pass_no != pass0 or s.state != "running", "a live task is unreachable"

    @precondition(lambda self: not self.cancelled)
    @rule(w=st.sampled_from(WORKERS))
    def lease(self, w: str) -> None:
        task = self.trainers[w].lease(timeout=0)
        if task is not None:
            assert task.token > self.max_token, "a new lease gets a larger token than any before"
            self.max_token = task.token
            assert 0 <= task.id < MAX_TASKS
            self.held[w].append(task)
            self._leased(w, task)

    @precondition(lambda self: not self.cancelled)
    @precondition(lambda self: any(self.held.values()))
    @rule(
        w=st.sampled_from(WORKERS),
        op=st.sampled_from(["ack", "ack", "fail", "release"]),
        i=st.integers(0, 3),
    )
    def end(self, w: str, op: str, i: int) -> None:
        if not self.held[w]:
            return
        self._end(w, self.held[w][i % len(self.held[w])], op)

    @precondition(lambda self: not self.cancelled)
    @rule(w=st.sampled_from(WORKERS), op=st.sampled_from(["ack", "ack", "ack", "fail"]))
    def lease_and_end(self, w: str, op: str) -> None:
        """One task through its whole life at once (passes end, tasks die often)."""
        self.lease(w)
        if self.held[w]:
            self._end(w, self.held[w][-1], op)

    @precondition(lambda self: not self.cancelled)
    @precondition(lambda self: any(self.held.values()))
    @rule(w=st.sampled_from(WORKERS))
    def release_and_lease_again(self, w: str) -> None:
        """The same worker gets the same task back under a new token (front first)."""
        if self.held[w]:
            self._end(w, self.held[w][0], "release")
            self.lease(w)

    @precondition(lambda self: not self.cancelled)
    @rule(w=st.sampled_from(WORKERS), n=st.integers(0, 4))
    def ack_all_and_lease_many(self, w: str, n: int) -> None:
        """The batch path: everything w holds acked and up to n leased in one call (a
        batch's acks read their records in one HMGET and gather their writes, its grants
        too: lib/leases.lua lw_new)."""
        acks = list(self.held[w])
        if not acks and n == 0:
            return
        keys, r = self.client.keys(self.job), self.client.redis
        rnd = self._meta("round")
        current = [t for t in acks if self._is_current(w, t)]
        for task in current:
            self._took(task)
        before = {t.token: self._ack_state(t) for t in current}
        done_before = self._meta("ndone")
        got = self.trainers[w].lease_many(n, timeout=0, acks=acks)
        # the model first (a failed check below must not leave a lease it does not know
        # of: the teardown would then find a task no one can lease)
        self.held[w] = list(got)
        self.ended += [(w, task) for task in acks]
        for task in current:
            self._counted(w, task, rnd, before[task.token])
        if self._meta("round") == rnd:
            # each current ack sets its task's done bit, but a piece of a split task's,
            # which waits for the other piece (SplitMachine)
            done = [t for t in current if r.getbit(keys.done, t.id)]
            for task in done:
                assert task.id not in self._attempt(rnd), "a task acked twice in one attempt"
                self._attempt(rnd).add(task.id)
                self._check_read(task)
            for task in current:
                if task not in done:
                    # a split task's piece, or (SplitMachine) a head whose end the server
                    # forgot in a rollback: that ack is refused (progress.lua)
                    rec = r.hget(keys.leases, f"s:{task.id}") or ""
                    split = rec.split("|")[0] == str(rnd)
                    assert split or task.end is not None, "an ack left a task undone"
            assert self._meta("ndone") == done_before + len(done)
        for task in got:
            assert task.token > self.max_token, "a new lease gets a larger token than any before"
            self.max_token = task.token
            assert 0 <= task.id < MAX_TASKS
            self._leased(w, task)

    @precondition(lambda self: not self.cancelled)
    @precondition(lambda self: bool(self.ended))
    @rule(i=st.integers(0, 50))
    def late_ack(self, i: int) -> None:
        worker, task = self.ended[i % len(self.ended)]
        stale = self._meta("c_stale")
        acked = self._meta("c_acked")
        if self._is_current(worker, task):
            return
        try:
            self.trainers[worker].ack(task)
        except taskq.LeaseLost:
            assert self._meta("c_stale") == stale + 1
        assert self._meta("c_acked") == acked, "a late ack never counts"

    @precondition(lambda self: not self.cancelled)
    @rule(w=st.sampled_from(WORKERS))
    def heartbeat(self, w: str) -> None:
        revoked = set(self.trainers[w].heartbeat())
        self.held[w] = [t for t in self.held[w] if t.id not in revoked and not t.revoked.is_set()]

    @precondition(lambda self: not self.cancelled)
    @rule(ms=st.sampled_from([500, 1000, 2000, 4000]), silent=st.booleans())
    def advance(self, ms: int, silent: bool) -> None:
        self.client.advance_clock(self.job, ms, silent=silent)

    @precondition(lambda self: not self.cancelled)
    @rule()
    def reap(self) -> None:
        self.client.reap(self.job)

    @precondition(lambda self: not self.cancelled)
    @rule()
    def retry(self) -> None:
        before = self.client.status(self.job)
        if before.reason == "rewinding":
            return
        if self.client.retry(self.job) and before.state != "running":
            # a reopened attempt keeps what it acked (a completed job's last pass)
            self._attempt(self._meta("round")).update(self._sets()[0])

    @precondition(lambda self: not self.cancelled)
    @rule(task_id=st.integers(0, N_TASKS - 1))
    def revoke(self, task_id: int) -> None:
        try:
            self.client.revoke(self.job, task_id)
        except taskq.InvalidInput as e:
            # a stopped mixed pass's positions past its end are no tasks of the pass, nor
            # are a stream source's pass's positions not charged yet
            assert "the pass ended at the stop" in str(e) or "tasks so far" in str(e), e
            assert task_id >= self.client.status(self.job, summaries=0).tasks

    @precondition(lambda self: not self.cancelled)
    @rule(force=st.booleans())
    def next_pass(self, force: bool) -> None:
        s = self.client.status(self.job)
        waiting = s.state == "waiting" and s.reason == "manual_advance"
        try:
            self.client.next_pass(self.job, force=force)
            self.forced = force and not waiting
            assert waiting or force, "a pass with work left advanced without force"
        except taskq.PassIncomplete:
            assert not force and not waiting
        except (taskq.PassMismatch, taskq.JobCompleted):
            pass
        except taskq.TaskqError as e:
            assert "half done" in str(e)  # a rewind half done refuses it

    @rule(w=st.sampled_from(WORKERS), i=st.integers(0, 3), samples=st.integers(0, 50))
    def progress(self, w: str, i: int, samples: int) -> None:
        if not self.held[w] or self.cancelled:
            return
        task = self.held[w][i % len(self.held[w])]
        self.trainers[w].progress(task, samples)
        self._took(task, samples)
        self.trainers[w].flush_progress()

    @precondition(lambda self: not self.cancelled)
    @rule(paused=st.booleans())
    def pause(self, paused: bool) -> None:
        if paused:
            self.client.pause_job(self.job)
        else:
            self.client.resume_job(self.job)

    @precondition(lambda self: not self.cancelled)
    @rule()
    def checkpoint_cut(self) -> None:
        """A checkpoint's cut; its later steps come in another rule, so leases, acks,
        deaths, retries and pass ends happen between them."""
        ck = f"ck{len(self.sealed)}-{next(_ids)}"
        code = int(self.client.connection.run(self.job, "checkpoint", ["", ck, "begin", 5])[0])
        if code == Code.LOCKED:
            return
        assert code == Code.OK, "a checkpoint's cut is never refused"
        done, dead = self._sets()
        self.open_ck = (ck, done, dead)

    @precondition(lambda self: not self.cancelled)
    @rule()
    def checkpoint(self) -> None:
        """A whole checkpoint in one go (the cut is its first call)."""
        if self.client.status(self.job).reason == "rewinding":
            return
        done, dead = self._sets()
        rec = self.client.checkpoint(self.job, keep=5)
        assert rec["done"] == len(done) and rec["dead"] == len(dead)
        kept = {c["id"] for c in self.client.checkpoints(self.job)}
        self.sealed = [c for c in self.sealed if c[0] in kept]
        self.sealed.append((rec["id"], done, dead))

    @precondition(lambda self: self.open_ck is not None and not self.cancelled)
    @rule()
    def checkpoint_seal(self) -> None:
        assert self.open_ck is not None
        ck, done, dead = self.open_ck
        self.open_ck = None
        k, cursor = 0, "0"
        while True:
            r = self.client.connection.run(self.job, "checkpoint", ["", ck, "prog", k, cursor])
            if int(r[0]) == Code.STALE:  # a rewind began since and dropped it
                return
            cursor, k = str(r[1]), k + 1
            if cursor == "0":
                break
        assert int(self.client.connection.run(self.job, "checkpoint", ["", ck, "seal", 5])[0]) == 0
        rec = self.client.checkpoints(self.job)[-1]
        assert rec["id"] == ck and rec["done"] == len(done) and rec["dead"] == len(dead)
        kept = {c["id"] for c in self.client.checkpoints(self.job)}
        self.sealed = [c for c in self.sealed if c[0] in kept]
        self.sealed.append((ck, done, dead))

    @precondition(lambda self: bool(self.sealed) and not self.cancelled)
    @rule(i=st.integers(0, 10))
    def rewind(self, i: int) -> None:
        ck, done, dead = self.sealed[i % len(self.sealed)]
        if ck not in {c["id"] for c in self.client.checkpoints(self.job)}:
            return
        assert self.client.rewind(self.job, ck)
        self.open_ck = None
        self._drop_held()
        got_done, got_dead = self._sets()
        assert got_dead == dead, "what was dead at the cut is dead again, the rest live"
        assert got_done == done, "the done set is the cut's"
        # the rewound attempt continues the cut's: it acked what the cut holds
        self.acked[self._meta("round")] = set(got_done)
        self.last_pass = self._meta("pass")

    @precondition(lambda self: not self.cancelled)
    @rule(now=st.integers(0, 15))
    def cancel(self, now: int) -> None:
        """Rare (one draw in 16): after it every trainer call is refused."""
        if now:
            return
        self.client.cancel_job(self.job)
        self.cancelled = True
        self._drop_held()
        with pytest.raises(taskq.JobCancelled):
            self.trainers[WORKERS[0]].lease(timeout=0)

    @precondition(lambda self: not self.cancelled)
    @rule()
    def reset(self) -> None:
        try:
            self.client.reset_pass(self.job)
        except taskq.InvalidInput as e:  # a trimmed stream's done tasks cannot be read again
            assert "trimmed" in str(e) and self._meta("trim_w") > 0

    @rule()
    def trim(self) -> None:
        """A stream in its last pass drops its done prefix (trim.lua); any other job
        is left as it is."""
        got = self.client.job(self.job).trim()
        if not self.stream or self.passes is None:
            assert got == 0

    @rule(k=st.integers(1, 2), dup=st.booleans())
    def append(self, k: int, dup: bool) -> None:
        """New tasks join the current pass; a pass that ended is not reopened (the
        append is refused, nothing written); a repeated id adds nothing; no path writes a
        field of the meta (the producer's credential may not: docs/security.md)."""
        n = self._n()
        if n + k > MAX_TASKS:
            return
        before = self.client.status(self.job, summaries=0)
        meta_key = self.client.keys(self.job).meta
        meta = self.client.redis.hgetall(meta_key)
        ids = [f"c{next(_ids)}" for _ in range(k)]
        skipped = 0
        if dup and self.appended_ids:
            ids[0], task = self.appended_ids[-1]  # appended before
            aside = {
                int(t) for t in self.client.redis.zrange(self.client.keys(self.job).aside, 0, -1)
            }
            trimmed = task < self._meta("trim_w") and task not in aside
            skipped = 0 if trimmed else 1  # skipped while its task is kept, new once trimmed
        job = self.client.job(self.job)
        if self.cancelled:
            with pytest.raises(taskq.JobCancelled):
                job.append([{"a": i} for i in ids], ids=ids)
            return
        if before.stream == "sealed":
            with pytest.raises(taskq.InvalidInput, match="sealed"):
                job.append([{"a": i} for i in ids], ids=ids)
            return
        ended = before.state not in ("running", "paused") and before.reason != "rewinding"
        if ended and k > skipped:
            with pytest.raises(taskq.InvalidInput, match="does not reopen it"):
                job.append([{"a": i} for i in ids], ids=ids)
            assert self._n() == n
            assert self.client.redis.hgetall(meta_key) == meta
            return
        r = job.append([{"a": i} for i in ids], ids=ids)
        self.appended_ids += [(c, n + i) for i, c in enumerate(ids[skipped:])]
        assert (r.tasks, r.skipped) == (k - skipped, skipped)
        assert self._n() == n + k - skipped
        assert self.client.redis.hgetall(meta_key) == meta

    @precondition(lambda self: not self.cancelled)
    @rule()
    def seal(self) -> None:
        if not self.stream:
            with pytest.raises(taskq.InvalidInput, match="not a stream"):
                self.client.job(self.job).seal()
            return
        self.client.job(self.job).seal()
        assert self.client.status(self.job, summaries=0).stream == "sealed"

    # -- invariants (docs/design.md, numbered as there) -------------------------
    @invariant()
    def partition_and_counters(self) -> None:
        if self.client.status(self.job).reason == "rewinding":
            return
        keys = self.client.keys(self.job)
        r = self.client.redis
        rnd = self._meta("round")
        dead = {int(x) for x in r.smembers(keys.dead)}
        n = self._n()
        done = {i for i in range(n) if r.getbit(keys.done, i)}
        raw = r.hgetall(keys.leases)
        leases = {int(k): parse_lease(v) for k, v in raw.items() if k.isdigit()}
        leased = {t for t, ls in leases.items() if ls and ls["live"] and ls["round"] == rnd}
        backups = {int(k[2:]): parse_lease(v) for k, v in raw.items() if k.startswith("b:")}
        backed = {t for t, b in backups.items() if b and b["live"] and b["round"] == rnd}
        # a split task's tail piece (field b:<task> too) stands without its head (lib/split.lua)
        prnd = self._piece_round()
        splits = {
            int(k[2:])
            for k, v in raw.items()
            if k.startswith("s:") and k[2:].isdigit() and v.split("|")[0] == str(prnd)
        }
        # a backup lease only beside its task's current lease, held by another worker, and
        # only while the job runs (its holder's writes follow the same rules)
        for t in backed - splits:
            assert t in leased, "a backup without the task's own lease"
            assert backups[t]["worker"] != leases[t]["worker"], "a backup of one's own task"
        # 1. every live task in exactly one of todo, leased, done; dead in none
        assert not (done & leased), "a task is both done and leased"
        assert not (dead & leased) and not (dead & done), "a dead task is in todo/leased/done"
        # 7. counters agree with the sets and bitmaps they count
        state = r.hget(keys.meta, "state")
        assert self._meta("ndone") == len(done) or state == "cancelled"
        # a split task whose head is acked and whose tail piece is leased is in flight:
        # the tail stands for it in nleased (lib/split.lua), so it is not counted in todo
        standing = {
            t
            for t in splits
            if raw[f"s:{t}"].split("|")[3] == "1" and t in backed and t not in leased
        }
        # a confirmed tail piece waiting among the orphans beside its task's leased head is
        # todo too, though its task is counted leased (lib/split.lua: waiting_tails)
        orph = raw.get("s:orph", "").split("|")
        waiting = {
            int(t)
            for t in (orph[1].split() if len(orph) == 2 and orph[0] == str(prnd) else [])
            if int(t) in splits
            and int(t) not in dead  # a dead task's tail is leased by nobody
            and raw[f"s:{t}"].split("|")[4] == "0"  # the tail not acked
            and raw[f"s:{t}"].split("|")[6] == "1"  # confirmed: a pending one is no todo
            and int(t) not in backed
        }
        if state == "running":
            assert self._meta("nleased") == len(leased) + len(standing)
            st = self.client.status(self.job, summaries=0)
            assert st.todo == n - len(dead) - len(done) - len(leased) - len(standing) + len(
                waiting & leased
            )
            assert st.backlog == st.todo + st.leased
            assert self._meta("nreserved") == r.zcard(keys.reserved)
        assert r.scard(keys.dead) == len(dead)
        # 3. a pass's done count never exceeds its live tasks
        assert len(done) <= n - len(dead)
        # 5. a lost worker holds no lease
        alive = set(r.zrange(keys.workers, 0, -1))
        for t in leased:
            lease = leases[t]
            assert lease is not None
            assert f"{lease['worker']}|{lease['worker_incarnation']}" in alive
        for t in backed:
            b = backups[t]
            assert f"{b['worker']}|{b['worker_incarnation']}" in alive

    @invariant()
    def membership(self) -> None:
        """The done set is the tasks the model saw acked in the current attempt; every
        attempt that completed acked each live task once; no live task is unreachable."""
        s = self.client.status(self.job)
        if self.cancelled or s.reason == "rewinding":
            return
        keys, r = self.client.keys(self.job), self.client.redis
        done, dead = self._sets()
        rnd = self._meta("round")
        if s.state != "completed":
            assert done == self._attempt(rnd), "the done set is what this attempt acked"
        assert not done & dead, "a task both done and dead"
        n = self._n()
        assert {i for i in range(n) if r.getbit(keys.deadbits, i)} == dead
        # summaries written since the last step: a completed one acked every live task
        raw = [json.loads(v) for v in r.hvals(keys.passes)]
        for summary in sorted(raw, key=lambda x: x.get("seq", 0)):
            if summary.get("seq", 0) <= self.summaries_seen:
                continue
            self.summaries_seen = summary["seq"]
            if summary["state"] == "completed" and not summary.get("rewound"):
                live = set(range(n)) - dead
                assert self.acked.get(summary["round"], set()) == live, (
                    "a pass attempt completed without every live task acked once"
                )
                assert summary["acked"] == summary["live"] == len(live)
        if s.state == "running":
            todo = {t["id"] for t in self.client.tasks(self.job, "todo", limit=1000)}
            leased = {t["id"] for t in self.client.tasks(self.job, "leased", limit=1000)}
            left = set(range(n)) - dead - done
            assert left <= todo | leased | self._pieces(), "a live task is unreachable"

    @invariant()
    def trimmed_tasks_are_done_and_the_rest_readable(self) -> None:
        """Below a stream's watermark every task is done and its descriptor gone (never
        leased, rewound to or counted twice: the done set holds it), but for the tasks
        set aside (every dead one there), which keep theirs; above it every task has its
        descriptor."""
        w = self._meta("trim_w")
        s = self.client.status(self.job, summaries=0)
        if self.cancelled or s.reason == "rewinding":
            return
        keys, r = self.client.keys(self.job), self.client.redis
        n = self._n()
        assert w <= n
        aside = {int(t) for t in r.zrange(keys.aside, 0, -1)}
        assert all(t < w for t in aside), "a task above the watermark is set aside"
        trimmed = [i for i in range(w) if i not in aside]
        assert all(r.getbit(keys.done, i) for i in trimmed), "a trimmed task is not done"
        dead = {int(t) for t in r.smembers(keys.dead)}
        assert {t for t in dead if t < w} <= aside, (
            "a dead task below the watermark lost its records"
        )
        held = r.hmget(keys.chunks, [str(i) for i in range(n)]) if n else []
        assert all(held[i] is None for i in trimmed), "a trimmed task kept its descriptor"
        assert all(held[i] is not None for i in aside), "a task set aside lost its descriptor"
        assert all(c is not None for c in held[w:]), "a task above the watermark lost its chunks"

    @invariant()
    def pass_grows_by_one_only_when_complete(self) -> None:
        p = self._meta("pass")
        assert p - self.last_pass in (0, 1), "the pass number grows by exactly one"
        self.last_pass = p
        self.forced = False


EngineMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def test_engine_state_machine(sm_url):
    EngineMachine.url = sm_url
    EngineMachine.TestCase("runTest").runTest()


class BackupMachine(EngineMachine):
    """The same steps with backup leases in play from the start: the job's median task
    time is set to 100 ms as if 10 tasks had been acked, so a task that runs past 200 ms at
    the tail of a pass gets a backup (docs/trainers.md, "Tails")."""

    backup_leases = True

    def __init__(self) -> None:
        super().__init__()
        self.client.redis.hset(
            self.client.keys(self.job).meta, mapping={"acked_job": 10, "dur_med": 100_000}
        )


BackupMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_with_backup_leases(sm_url):
    BackupMachine.url = sm_url
    BackupMachine.TestCase("runTest").runTest()


class SplitMachine(EngineMachine):
    """The same steps on tasks whose size is known (50 samples each, ``records`` of a lines
    chunk), so a lease at a pass's tail splits a started task that reported progress
    (lib/split.lua): a piece's ack leaves the task undone until its other piece is acked,
    a piece that ends without an ack goes back; the model counts a task acked once its
    last piece is. Redis may also go back one or two steps (``rollback``: the job's keys
    restored from after an earlier step, as a lagging replica promoted or a lost last
    second of AOF would), splits made, confirmed or acked since included; the trainers
    keep what they hold. The model of the samples the holders' loops took (``_took``)
    checks that a task counted done had every sample taken in its pass: re-read after a
    rollback, never skipped. The model of the samples each accepted ack counts
    (``counted``, per pass attempt: a piece's ack its piece, [0, m) or [m, n), a whole
    task's all 50) checks that no sample is counted by two acks in one attempt, whatever
    death, retry (after the job's completion too), rewind and rollback did between them,
    and that a task counted done had each sample counted once; the audit's check of the
    pieces (``split_tasks_partitioned``) that every live sample is reachable."""

    split_tails = True
    shuffle_samples = True
    # two range readers that follow a moving end (a split needs both: the caller and the
    # holder), and one whose kind changes (``reregister``)
    kinds = {"w0": "s", "w1": "s", "w2": "r"}  # noqa: RUF012

    def __init__(self) -> None:
        super().__init__()
        #: (pass, task) -> the sample positions holders' loops took (the model of reads)
        self.taken: dict[tuple[int, int], set[int]] = {}
        #: a lease's token -> the kind of its holder, and the positions its loop took
        self.lease_kind: dict[int, str] = {}
        self.by_lease: dict[int, set[int]] = {}
        #: pass attempt (its pieces' round) -> task -> the samples its accepted acks
        #: counted by the record (a piece's range) and as their loops took them
        self.counted: dict[int, dict[int, set[int]]] = {}
        self.read_counted: dict[int, dict[int, set[int]]] = {}
        self.snaps: list[tuple[dict[str, bytes | None], dict]] = []
        self.raw: redis.Redis | None = None  # DUMP / RESTORE (bytes, not decoded)

    def teardown(self) -> None:
        super().teardown()
        if self.raw is not None:
            self.raw.close()

    chunks = [  # noqa: RUF012
        {"format": "lines", "path": f"/nonexistent/{i}", "offset": 0, "length": 1, "records": 50}
        for i in range(N_TASKS)
    ]

    def _pieces(self) -> set[int]:
        """Split tasks whose tail piece is leased or waits among the orphans to be leased
        again (a head piece that went back is in the front, listed as todo)."""
        keys, r = self.client.keys(self.job), self.client.redis
        rnd, prnd = self._meta("round"), str(self._piece_round())
        raw = r.hgetall(keys.leases)
        orph = raw.get("s:orph", "").split("|")
        orphans = set(orph[1].split()) if len(orph) == 2 and orph[0] == prnd else set()
        out = set()
        for k, v in raw.items():
            if k.startswith("s:") and k[2:].isdigit() and v.split("|")[0] == prnd:
                tail = parse_lease(raw.get(f"b:{k[2:]}"))
                live = tail and tail["live"] and tail["round"] == rnd
                if live or k[2:] in orphans:
                    out.add(int(k[2:]))
        return out

    def _is_current(self, worker: str, task: taskq.Task) -> bool:
        keys = self.client.keys(self.job)
        lease = parse_lease(self.client.redis.hget(keys.leases, str(task.id)))
        piece = parse_lease(self.client.redis.hget(keys.leases, f"b:{task.id}"))
        if piece and piece["token"] == task.token:
            lease = piece  # (one worker may hold both pieces: the token picks)
        # the base class's rule, on the record the token picked
        return bool(lease and lease["token"] == task.token and self._holds(worker, lease))

    def _end(self, worker: str, task: taskq.Task, op: str) -> None:
        if op != "ack" or not self._is_current(worker, task):
            super()._end(worker, task, op)
            return
        keys, r = self.client.keys(self.job), self.client.redis
        rnd = self._meta("round")
        done_before = self._meta("ndone")
        self._took(task)
        known = r.hget(keys.leases, f"s:{task.id}")
        before = self._ack_state(task)
        refused = False
        try:
            self.trainers[worker].ack(task)
            self._counted(worker, task, rnd, before)
        except taskq.LeaseLost:
            # the holder honours an end the server does not know (a rollback took the
            # split back): its lease ends there, the rest is leased again (progress.lua)
            assert task.end is not None and task.end < 50, "a current lease's ack refused"
            assert (known or "").split("|")[0] != str(rnd), "refused beside a known split"
            refused = True
        if refused:
            assert not r.getbit(keys.done, task.id), "a refused ack counted"
        elif r.getbit(keys.done, task.id) and self._meta("round") == rnd:
            assert task.id not in self._attempt(rnd), "a task acked twice in one attempt"
            self._attempt(rnd).add(task.id)
            self._check_read(task)
            assert self._meta("ndone") == done_before + 1
        elif self._meta("round") == rnd:
            rec = r.hget(keys.leases, f"s:{task.id}") or ""
            assert rec.split("|")[0] == str(rnd), "an ack left a task undone without a split"
            assert self._meta("ndone") == done_before
        if task in self.held[worker]:
            self.held[worker].remove(task)
        self.ended.append((worker, task))

    def rewind(self, i: int) -> None:
        """The rewound attempt continues the cut's: its acks counted what the cut holds
        (each task done at the cut whole, each split's acked pieces, as restored)."""
        super().rewind(i)
        keys, r = self.client.keys(self.job), self.client.redis
        prnd = self._piece_round()
        counted = self.counted[prnd] = {t: set(range(50)) for t in self._sets()[0]}
        for k, v in r.hgetall(keys.leases).items():
            f = v.split("|")
            if k.startswith("s:") and k[2:].isdigit() and len(f) == 7 and f[0] == str(prnd):
                m, n = int(f[1]), int(f[2])
                got = counted.setdefault(int(k[2:]), set())
                got.update(range(0, m) if f[3] == "1" else ())
                got.update(range(m, n) if f[4] == "1" else ())

    @precondition(lambda self: not self.cancelled)
    @rule(w=st.sampled_from(WORKERS), v=st.sampled_from(WORKERS), samples=st.integers(0, 50))
    def tail(self, w: str, v: str, samples: int) -> None:
        """The tail of a pass: ``w`` takes what is left and reports progress into a task,
        ``v`` leases (a split, pending until ``w`` knows its end: released at once), ``w``
        reports again under the end it learnt (the split is confirmed), ``v`` leases again
        (the piece)."""
        for _ in range(N_TASKS):
            before = len(self.held[w])
            self.lease(w)
            if len(self.held[w]) == before:
                break
        if not self.held[w]:
            return
        task = self.held[w][0]
        task.current_end()  # its loop reads up to the end it knows: the task can be split
        n = max(samples, task.start)
        for _ in range(2):
            self.trainers[w].progress(task, n)
            self._took(task, n)
            self.trainers[w].flush_progress()
            if w != v:
                self.lease(v)

    @precondition(lambda self: not self.cancelled)
    @rule(w=st.sampled_from(WORKERS))
    def read_to_end(self, w: str) -> None:
        """A holder takes its pieces' samples up to the end it knows, reporting them."""
        for task in self.held[w]:
            if task.end is not None:
                self.trainers[w].progress(task, task.end)
                self._took(task, task.end)
        self.trainers[w].flush_progress()

    #: the model's fields that go back with the server in a rollback (the trainers, what
    #: they hold and the tokens seen stay: the trainers' memory does not go back)
    MODEL = (
        "acked",
        "read_counted",
        "last_pass",
        "last_round",
        "last_done",
        "forced",
        "summaries_seen",
        "open_ck",
        "sealed",
        "appended_ids",
        "counted",
    )

    def _took(self, task: taskq.Task, n: int | None = None) -> None:
        """Samples [task.start, n) were taken by the loop (trained, whatever the server
        keeps after): up to the end its holder honours now (``task.end``, or the task's
        50); a loop of whole tasks (kind ``w``) reads all 50 whatever its start. Kept per
        pass, across its attempts (a rewind's or a rollback's re-lease starts where the
        earlier holders' progress got), and per lease."""
        end = task.end if task.end is not None else 50
        hi = end if n is None else min(n, end)
        lo = 0 if self.lease_kind.get(task.token) == "w" else task.start
        if self.lease_kind.get(task.token) == "w":
            hi = 50
        self.taken.setdefault((self._meta("pass"), task.id), set()).update(range(lo, hi))
        self.by_lease.setdefault(task.token, set()).update(range(lo, hi))

    def _leased(self, w: str, task: taskq.Task) -> None:
        """A whole-task reader is never handed a piece, nor one that does not follow a
        moving end a piece still pending."""
        super()._leased(w, task)
        kind = self.lease_kind[task.token] = self.kinds[w]
        if kind == "w":
            assert task.end is None or task.end >= 50, f"a whole-task reader got {task}"
            assert task.start == 0 or not self._is_tail(task), "a tail to a whole-task reader"

    def _is_tail(self, task: taskq.Task) -> bool:
        keys = self.client.keys(self.job)
        piece = parse_lease(self.client.redis.hget(keys.leases, f"b:{task.id}"))
        return bool(piece and piece["token"] == task.token)

    def _ack_state(self, task: taskq.Task) -> Any:
        """(the attempt's pieces' round, whether the lease is the task's tail piece, its
        split record, its done bit), read before the ack."""
        keys, r = self.client.keys(self.job), self.client.redis
        rec = r.hget(keys.leases, f"s:{task.id}")
        return self._piece_round(), self._is_tail(task), rec, bool(r.getbit(keys.done, task.id))

    def _counted(self, w: str, task: taskq.Task, rnd: int, before: Any) -> None:
        """An accepted ack (its piece's ack recorded, or its task done, or the attempt
        ended by it) counts its samples in the pass attempt two ways: the piece's range
        by the record after it (a head [0, m), a tail [m, n), a task not split all 50)
        and the samples its holder's loop took in that lease (a whole-task reader all
        50). Neither counts a sample twice in one attempt, whatever death, retry (after
        the job's completion too), rewind and rollback did between the acks; a task
        counted done had each sample counted once by the record."""
        prnd, is_tail, rec0, done0 = before
        took = self.by_lease.pop(task.token, set())
        keys, r = self.client.keys(self.job), self.client.redis
        f = (r.hget(keys.leases, f"s:{task.id}") or "").split("|")
        f0 = (rec0 or "").split("|")
        split, split0 = len(f) == 7 and f[0] == str(prnd), len(f0) == 7 and f0[0] == str(prnd)
        moved = self._meta("round") != rnd  # the ack ended the attempt
        done = bool(r.getbit(keys.done, task.id))
        span: range | None = range(50)
        if split:
            k = 4 if is_tail else 3
            accepted = f[k] == "1" and not (split0 and f0[k] == "1")
            span = range(int(f[1]), int(f[2])) if is_tail else range(int(f[1]))
        else:
            accepted = (done and not done0) or moved
            span = None if split0 else span  # (the record gone with the attempt)
        if not accepted:
            return  # refused, or a piece whose ack was not recorded
        reads = self.read_counted.setdefault(prnd, {}).setdefault(task.id, set())
        both = reads & took
        assert not both, f"samples {sorted(both)} of task {task.id} taken for two acks"
        reads |= took
        got = self.counted.setdefault(prnd, {}).setdefault(task.id, set())
        if span is not None:
            twice = got & set(span)
            assert not twice, f"task {task.id}: samples counted by two acks: {sorted(twice)}"
            got.update(span)
        if done and not done0 and self._piece_round() == prnd:
            assert got == set(range(50)), f"task {task.id} done, samples counted {got}"

    @precondition(lambda self: not self.cancelled)
    @rule(kind=st.sampled_from(["w", "r", "s"]))
    def reregister(self, kind: str) -> None:
        """w2 leaves and joins again as a loop of another kind (whole tasks, a fixed
        range, a moving end): what it held goes back."""
        w = "w2"
        self.trainers[w].close()
        self.ended += [(w, t) for t in self.held[w]]
        self.held[w] = []
        self.kinds[w] = kind
        self.trainers[w] = self._trainer(w)

    def _check_read(self, task: taskq.Task) -> None:
        """A task counted done had every sample taken in its pass (none skipped)."""
        missing = set(range(50)) - self.taken.get((self._meta("pass"), task.id), set())
        assert not missing, f"task {task.id} done with samples no holder took: {sorted(missing)}"

    @invariant()
    def remember(self) -> None:
        """What a lagging replica or the AOF may hold: the job's keys after each of the
        last three steps (not its clock: time does not go back), with the model then."""
        if self.cancelled:
            return
        keys = self.client.keys(self.job)
        if self.raw is None:
            self.raw = redis.Redis.from_url(self.url)
        pipe = self.raw.pipeline(transaction=False)
        names = [k for k in keys.all if k != keys.clock]
        for k in names:
            pipe.dump(k)
        model = copy.deepcopy({f: getattr(self, f) for f in self.MODEL})
        self.snaps.append((dict(zip(names, pipe.execute(), strict=True)), model))
        del self.snaps[:-3]

    @precondition(lambda self: not self.cancelled and len(self.snaps) > 1)
    @rule(back=st.integers(1, 2))
    def rollback(self, back: int) -> None:
        """Redis goes back ``back`` steps (a lagging replica promoted, the AOF's last
        second lost) under running trainers, splits pending, confirmed or acked since:
        what the server forgot is leased and read again, never skipped (the model of the
        samples taken and the teardown's pass end check it)."""
        dumps, model = self.snaps[-1 - min(back, len(self.snaps) - 1)]
        assert self.raw is not None
        pipe = self.raw.pipeline(transaction=False)
        for key, value in dumps.items():
            if value is None:
                pipe.delete(key)
            else:
                pipe.restore(key, 0, value, replace=True)
        pipe.execute()
        for f, v in copy.deepcopy(model).items():
            setattr(self, f, v)
        self.snaps.clear()

    @invariant()
    def split_tasks_partitioned(self) -> None:
        """The audit's check of the attempt's splits (integrity.split_check): each split
        task's pieces [0, m) and [m, n) partition it (n its size), it is done exactly when
        both are acked, its record outlives death, retry and completion, no piece's
        progress passes its end, a dead task's pieces are leased by nobody, and while the
        attempt runs every piece not acked of a live task is leased or waiting (every live
        sample reachable)."""
        s = self.client.status(self.job)
        if self.cancelled or s.reason == "rewinding":
            return
        keys, r = self.client.keys(self.job), self.client.redis
        running = None
        if s.state in ("running", "paused"):
            running = (self._meta("round"), self._meta("cursor") >= self._n())
        found = integrity.split_check(r, keys, self._piece_round(), task_size, running)
        assert not found["bad"], found

    @invariant()
    def range_readers_counted(self) -> None:
        """The count of range readers (meta rangers: with none, a whole-task reader takes
        a head piece whole) is the number of range-reader records in the leases hash."""
        if self.cancelled:
            return
        keys, r = self.client.keys(self.job), self.client.redis
        records = sum(1 for f, _ in r.hscan_iter(keys.leases, match="r:*"))
        assert self._meta("rangers") == records


SplitMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_with_split_tails(sm_url):
    SplitMachine.url = sm_url
    SplitMachine.TestCase("runTest").runTest()


class StreamMachine(EngineMachine):
    """The same steps on a stream job: its pass does not end until a seal (appends keep
    joining it), then it ends as any pass does."""

    stream = True


class TrimmedStreamMachine(StreamMachine):
    """A stream of one pass, so its trim runs: the watermark moves over done tasks
    interleaved with every verb (checkpoints and rewinds bound it, a reset is refused).
    The stream stays open and its pass is never forced on: the machine's rules are of a
    job that never completes (the unit tests in test_streams.py seal a trimmed stream)."""

    passes = 1

    def next_pass(self, force: bool) -> None:  # not a rule here (see the docstring)
        pass

    def seal(self) -> None:  # not a rule here
        pass


StreamMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_on_a_stream(sm_url):
    StreamMachine.url = sm_url
    StreamMachine.TestCase("runTest").runTest()


TrimmedStreamMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_on_a_trimmed_stream(sm_url):
    TrimmedStreamMachine.url = sm_url
    TrimmedStreamMachine.TestCase("runTest").runTest()


class MixedMachine(EngineMachine):
    """The same steps on a mixed job (docs/mixing.md) of three sources (2, 2 and 1 tasks),
    with weights set at stated slots among them: after every step the sequence the job
    handed out in its pass equals the reference schedule recomputed from the weight log
    (``taskq.mix.pass_schedule``), so every prefix is within the bound and each source's
    tasks come once per pass (the membership invariants: once per pass attempt). A mixed
    job takes no appends; a rewind to a pass whose sequence is no longer kept (the last 3)
    is refused with nothing changed."""

    SIZES = (2, 2, 1)
    #: per source, its tasks' samples when the weights count them (``mix_by="samples"``)
    TASK_SIZES: tuple[tuple[int, ...], ...] | None = None
    #: what a source running out does (``on_exhausted``)
    ON_EXHAUSTED = "drop"

    def __init__(self) -> None:
        super().__init__()
        #: per pass, the positions leased in it (the model's, not the engine's 'mixd')
        self.granted: dict[int, set[int]] = {}
        #: per pass entered by an advance, the positions the pass before handed out: those
        #: leased and the dead ones the cursor walked past (its charge made them dead)
        self.left: dict[int, set[int]] = {}
        #: the passes from which those records hold (a reset or a rewind moves the cursor
        #: back: what the pass handed out is then the engine's reach, not the model's)
        self.sure_from = 0

    def _leased(self, w: str, task: taskq.Task) -> None:
        super()._leased(w, task)
        self.granted.setdefault(task.pass_no, set()).add(task.id)

    def _walked_past(self) -> None:
        """The dead slots of the pass the cursor walked past are handed out (counted with
        the leased: a retry makes them live again, the cursor does not come back)."""
        p, cursor = self._meta("pass"), self._meta("cursor")
        dead = {int(t) for t in self.client.redis.smembers(self.client.keys(self.job).dead)}
        self.granted.setdefault(p, set()).update(t for t in dead if t < cursor)

    @precondition(lambda self: not self.cancelled)
    @rule()
    def retry(self) -> None:
        self._walked_past()
        super().retry()

    def _unsure(self) -> None:
        self.sure_from = max([self._meta("pass"), *self.granted]) + 1
        self.left.clear()

    @precondition(lambda self: not self.cancelled)
    @rule(force=st.booleans())
    def next_pass(self, force: bool) -> None:
        p = self._meta("pass")
        self._walked_past()
        super().next_pass(force)
        if self._meta("pass") == p + 1 and p >= self.sure_from:
            self.left[p + 1] = set(self.granted.get(p, set()))

    @precondition(lambda self: not self.cancelled)
    @rule()
    def reset(self) -> None:
        super().reset()
        self._unsure()

    @precondition(lambda self: not self.cancelled)
    @rule(w=st.sampled_from(WORKERS))
    def die_and_force(self, w: str) -> None:
        """A copy dies (a lease failed: max_failures 1) and the pass is forced on: the
        next pass's charge makes the copy's slot dead at once (retry_ahead_and_force)."""
        self.lease(w)
        if self.held[w]:
            self._end(w, self.held[w][-1], "fail")
        if self.client.status(self.job).state == "running":  # (else the pass ended here)
            self.next_pass(True)

    @precondition(lambda self: not self.cancelled)
    @rule(w=st.sampled_from(WORKERS))
    def retry_ahead_and_force(self, w: str) -> None:
        """A dead slot retried comes from the front, ahead of the cursor, and the pass is
        forced on at once (``cycle``: the positions between the cursor and it, charged and
        never handed out, come in the next pass)."""
        self.lease(w)  # (the pass charged: a dead copy's slot in it is dead at once)
        self.retry()
        self.lease(w)  # (the front first: the retried slot)
        if self.client.status(self.job).state == "running":  # (one pass's end a step)
            self.next_pass(True)
            self.lease(w)  # (the next pass charged: its life checked at once)

    def _create(self) -> None:
        self.sources = [f"{self.job}-s{i}" for i in range(len(self.SIZES))]
        for i, (src, n) in enumerate(zip(self.sources, self.SIZES, strict=True)):
            if self.TASK_SIZES is None:
                chunks: list[dict[str, object]] = [{"s": i, "k": k} for k in range(n)]
            else:
                chunks = [
                    {
                        "format": "lines",
                        "path": f"/nonexistent/{i}/{k}",
                        "offset": 0,
                        "length": 1,
                        "records": r,
                    }
                    for k, r in enumerate(self.TASK_SIZES[i])
                ]
            self.client.create_job(src, chunks)
        self.client.create_job(
            self.job,
            mix=dict(zip(self.sources, (0.5, 0.3, 0.2), strict=True)),
            mix_by="tasks" if self.TASK_SIZES is None else "samples",
            on_exhausted=self.ON_EXHAUSTED,
            passes=self.passes,
            **LIMITS,
            manual_clock=True,
            auto_advance=False,
        )

    @rule(
        ws=st.lists(st.integers(0, 3), min_size=3, max_size=3).filter(any),
        ahead=st.integers(0, 6),
    )
    def set_weights(self, ws: list[int], ahead: int) -> None:
        """New weights from a slot ahead of the next (the next itself at 0): it holds from
        there; refused with nothing logged once the job is cancelled."""
        job = self.client.job(self.job)
        weights = dict(zip(self.sources, ws, strict=True))
        if self.cancelled:
            with pytest.raises(taskq.JobCancelled):
                job.set_weights(weights)
            return
        at = job.mix_status()["next_slot"] + ahead
        assert job.set_weights(weights, at=at) == at

    def append(self, k: int, dup: bool) -> None:  # refused (the rule below)
        pass

    @rule()
    def append_refused(self) -> None:
        """A mixed job takes no appends: refused, nothing written."""
        meta_key = self.client.keys(self.job).meta
        meta = self.client.redis.hgetall(meta_key)
        with pytest.raises((taskq.InvalidInput, taskq.JobCancelled)):
            self.client.job(self.job).append([{"a": 1}], ids=[f"c{next(_ids)}"])
        assert self.client.redis.hgetall(meta_key) == meta

    def _meta_but_clock(self) -> dict[str, str]:
        meta = self.client.redis.hgetall(self.client.keys(self.job).meta)
        return {k: v for k, v in meta.items() if k not in ("seen", "offset")}

    @precondition(lambda self: bool(self.sealed) and not self.cancelled)
    @rule(i=st.integers(0, 10))
    def rewind(self, i: int) -> None:
        """Refused, nothing changed, exactly when the cut's pass is no longer kept (a
        pass charged and then left among the last 3, or dropped by going back before it);
        a cut at a pass's start needs it only once the pass was charged."""
        ck = self.sealed[i % len(self.sealed)][0]
        rec = {c["id"]: c for c in self.client.checkpoints(self.job)}.get(ck)
        kept = kept_passes(self.client.connection, self.job)
        raw = self.client.redis.hget(self.client.keys(self.job).ckpt, ck)
        if rec is not None and raw and json.loads(raw)["cursor"] == 0:
            refused = kept is not None and rec["pass"] not in kept
            refused = refused and rec["pass"] != self._meta("pass")
        else:
            refused = rec is not None and rec["pass"] not in (kept or set())
        if refused:
            # (but the clock: any call that opens the job after a silence records it,
            # 'seen' and 'offset', lib/call.lua open_job; that is no change of the job)
            meta = self._meta_but_clock()
            with pytest.raises(taskq.InvalidInput, match="no longer kept"):
                self.client.rewind(self.job, ck)
            assert self._meta_but_clock() == meta
            return
        super().rewind(i)
        self._unsure()

    def _weight_log(self) -> list[tuple[int, list[str]]]:
        """The weight log the reference is built from: the engine's."""
        return weight_log(self.client.connection, self.job)

    def _feed_log(self) -> list[Feed]:
        """The feed log the reference is built from: the engine's."""
        return feed_log(self.client.connection, self.job)

    def _stored(self, positions: list[int]) -> list[str]:
        """The copies the current pass's stored sequence holds at ``positions``."""
        return copies_at(self.client.connection, self.job, self._meta("pass"), positions)

    @invariant()
    def trimmed_tasks_are_done_and_the_rest_readable(self) -> None:
        """Every copy of its sources' tasks is kept under its copy id but for the copies
        of the positions below the watermark (a mix fed by an open stream source, trimmed
        in its last pass: done, and not set aside), and each slot handed out in the pass
        reads the copy its sequence names (admin/mix.py task_fields, what a lease, ``tasks
        list`` and the audit resolve)."""
        conn, r = self.client.connection, self.client.redis
        keys = self.client.keys(self.job)
        spec = spec_of(conn, self.job)
        aside = {int(t) for t in r.zrange(keys.aside, 0, -1)}
        trimmed = [t for t in range(self._meta("trim_w")) if t not in aside]
        assert all(r.getbit(keys.done, t) for t in trimmed), "a trimmed position is not done"
        gone = set(self._stored(trimmed))
        copies = [
            copy_field(i, j) for i, n in enumerate(stores(conn, self.job, spec)) for j in range(n)
        ]
        held = r.hmget(keys.chunks, copies) if copies else []
        assert all((c is None) == (f in gone) for f, c in zip(copies, held, strict=True)), (
            "a trimmed position's copy is kept, or a copy not trimmed is gone"
        )
        assert r.hlen(keys.chunks) == len(copies) - len(gone)
        rows = self.client.job(self.job).mix_sequence()
        fields = task_fields(conn, self.job, [row["task"] for row in rows])
        assert fields == [
            copy_field(spec.sources.index(row["source"]), row["source_task"]) for row in rows
        ]

    @invariant()
    def dead_slots_are_dead_copies(self) -> None:
        """What dies in a mixed job is the copy: each dead slot of the pass is charged and
        its copy is in ``mixdead`` (lib/mix.lua marks the slot of a dead copy at its
        charge; a new pass keeps no slot dead for its position)."""
        r = self.client.redis
        keys = self.client.keys(self.job)
        dead = sorted(int(t) for t in r.smembers(keys.dead))
        if not dead:
            return
        p = self._meta("pass")  # (stored: charged; positions below MAX_TASKS: block 0)
        fields = [r.getrange(keys.mixseq_block(p, 0), t * 10, t * 10 + 9) for t in dead]
        assert all(len(f) == 10 for f in fields), "a dead slot not charged"
        assert all(r.smismember(keys.mixdead, fields)), "a dead slot whose copy is live"

    @invariant()
    def sequence_is_the_reference(self) -> None:
        job = self.client.job(self.job)
        pass_no = self._meta("pass")
        rows = job.mix_sequence(pass_no)
        start = rows[0]["position"] if rows else 0  # (a trimmed pass: from its watermark)
        seq = [(r["source"], r["source_task"]) for r in rows]
        spec = spec_of(self.client.connection, self.job)
        log = self._weight_log()
        sizes = None if self.TASK_SIZES is None else [list(t) for t in self.TASK_SIZES]
        life = None
        if spec.on_exhausted == "cycle":
            life = pass_life(self.client.connection, self.job, pass_no) or [0] * len(spec.sizes)
        feed = self._feed_log()
        want = [
            (spec.sources[i], j)
            for i, j in pass_schedule(
                spec,
                log,
                pass_no,
                start + len(seq),
                task_sizes=sizes,
                life=life,
                feed=feed,
                first_slot=pass_no * spec.stride,
            )
        ]
        assert seq == want[start:], "the handed-out sequence is the reference schedule's"

    @invariant()
    def each_sources_acked_count_is_the_status(self) -> None:
        """``mix_status()`` counts each source's acked positions of the pass (a trimmed
        mix: from its watermark up, plus what the trim counted: admin/mix.py ``_trim``) as
        the done set and the whole stored sequence say."""
        s = self.client.status(self.job, summaries=0)
        if self.cancelled or s.reason == "rewinding":
            return
        status = self.client.job(self.job).mix_status()
        r, keys = self.client.redis, self.client.keys(self.job)
        acked = [0] * len(self.sources)
        for t, f in enumerate(self._stored(list(range(status["charged"])))):
            if r.getbit(keys.done, t):
                acked[int(f, 16) >> 32] += 1
        assert [row["acked"] for row in status["sources"]] == acked

    @invariant()
    def a_cycle_pass_starts_where_the_pass_before_left_each_source(self) -> None:
        """``cycle``: each source's slots over the job's life at a pass's start are those
        at the start of the pass before plus what that pass handed out of it (a pass left
        early, by an advance, hands out the rest never). What it handed out is the model's
        where it holds (``left``: leased, or dead and walked past; a slot retried and
        leased ahead of the cursor is handed out, those between not), else ``plan_pass``'s
        ``life`` bounds it: at most the life after the first positions up to the last the
        engine says was handed out (``mix_sequence``)."""
        if self.ON_EXHAUSTED != "cycle":
            return
        conn = self.client.connection
        pass_no = self._meta("pass")
        now, before = pass_life(conn, self.job, pass_no), pass_life(conn, self.job, pass_no - 1)
        if pass_no == 0 or now is None or before is None:
            return
        spec, log = spec_of(conn, self.job), weight_log(conn, self.job)
        sizes = None if self.TASK_SIZES is None else [list(t) for t in self.TASK_SIZES]
        if pass_no in self.left:
            slots = plan_pass(spec, log, pass_no - 1, task_sizes=sizes, life=before).slots
            want = list(before)
            for t in self.left[pass_no]:
                want[slots[t].source] += 1
            assert now == want, "a pass's life is not the one before's plus what it handed out"
            return
        handed = len(self.client.job(self.job).mix_sequence(pass_no - 1))
        plan = plan_pass(spec, log, pass_no - 1, length=handed, task_sizes=sizes, life=before)
        assert all(b <= x <= y for b, x, y in zip(before, now, plan.life, strict=True))


MixedMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_on_a_mixed_job(sm_url):
    MixedMachine.url = sm_url
    MixedMachine.TestCase("runTest").runTest()


class SamplesMixedMachine(MixedMachine):
    """MixedMachine with weights counting samples (``mix_by="samples"``): the sources'
    tasks say their sizes (each at least the 50 samples the progress rule records), and
    after every step the handed-out sequence is the reference's on those sizes
    (lib/mix.lua ``choose_by_samples`` against ``taskq.mix._choose_by_samples``)."""

    TASK_SIZES = ((150, 50), (60, 240), (90,))


SamplesMixedMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_on_a_mixed_job_by_samples(sm_url):
    SamplesMixedMachine.url = sm_url
    SamplesMixedMachine.TestCase("runTest").runTest()


class CycleMixedMachine(MixedMachine):
    """MixedMachine with ``on_exhausted="cycle"``: a mixed pass is its ``N`` slots, each
    source's slot over the job's life taking its task in that source's pass; after every
    step the handed-out sequence is the reference's from the life the engine keeps at the
    pass's start, and that life is the pass before's plus what it handed out."""

    ON_EXHAUSTED = "cycle"


CycleMixedMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_on_a_cycle_mixed_job(sm_url):
    CycleMixedMachine.url = sm_url
    CycleMixedMachine.TestCase("runTest").runTest()


class StopMixedMachine(MixedMachine):
    """MixedMachine with ``on_exhausted="stop"``: a mixed pass ends after the slot where
    the first source of positive weight takes its last task. Its length (the model's tasks)
    is the one the charge recorded once it reached the stop (meta ``mixe``, else ``N``);
    after every step the handed-out sequence is the reference's, and a pass whose charge
    stopped is exactly the reference's ``stop`` pass, which the status counts."""

    ON_EXHAUSTED = "stop"

    def _n(self) -> int:
        n, end, pass_no = self.client.redis.hmget(
            self.client.keys(self.job).meta, ["n", "mixe", "pass"]
        )
        base = int(pass_no or 0) * int(n)
        length = int(float(end or -1)) - base
        return length if 0 < length <= int(n) else int(n)

    @invariant()
    def a_stopped_pass_is_the_reference_stop(self) -> None:
        conn = self.client.connection
        pass_no, n = self._meta("pass"), self._meta("n")
        spec, log = spec_of(conn, self.job), weight_log(conn, self.job)
        sizes = None if self.TASK_SIZES is None else [list(t) for t in self.TASK_SIZES]
        plan = plan_pass(spec, log, pass_no, task_sizes=sizes)
        length = self._n()
        if length < n:
            assert (plan.end, len(plan.slots)) == ("stop", length)
            assert self.client.status(self.job).tasks == length
        assert len(self.client.job(self.job).mix_sequence(pass_no)) <= len(plan.slots)


StopMixedMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_on_a_stop_mixed_job(sm_url):
    StopMixedMachine.url = sm_url
    StopMixedMachine.TestCase("runTest").runTest()


class StreamMixedMachine(MixedMachine):
    """MixedMachine whose third source is an open stream (docs/mixing.md, "An open stream
    source: its feed"), ``max_debt=1``: feed appends (ids, a resend skipped) and a seal of
    the feed among every verb; the pass's length is what its charge reached (``tasks_n``)
    and it stays open until the stream is sealed and every source ran out; after every
    step the handed-out sequence is ``pass_schedule(..., feed=<the engine's mixfeed>,
    first_slot=p * N)``'s, a lease that finds nothing while the pass runs is the
    reference's wait, and the debts, the wait and the repaid slots the readers show are
    the reference's."""

    SIZES = (2, 2, 1)

    def _create(self) -> None:
        self.sources = [f"{self.job}-s{i}" for i in range(len(self.SIZES))]
        for i, (src, n) in enumerate(zip(self.sources, self.SIZES, strict=True)):
            chunks: list[dict[str, object]] = [{"s": i, "k": k} for k in range(n)]
            self.client.create_job(src, chunks, stream=i == 2)
        self.fed, self.closing = 1, False
        self.feed_gone: set[str] = set()  # the log entries the trims removed
        self.log_gone: set[str] = set()
        self.client.create_job(
            self.job,
            # (the stream weighs most: picked again after its one task, it owes a slot
            # while the others still have tasks to take it, then waits)
            mix=dict(zip(self.sources, (0.3, 0.2, 0.5), strict=True)),
            max_debt=1,
            passes=self.passes,
            **LIMITS,
            manual_clock=True,
            auto_advance=False,
        )

    def _n(self) -> int:
        if self.closing:  # (the closer's bound: every task of every source)
            return sum(self.SIZES[:2]) + self.fed
        return self.client.status(self.job, summaries=0).tasks

    def _every_live_task_reachable(self) -> None:
        """Sealed, the stream runs out and the pass ends as any mixed pass does."""
        if not self.cancelled:
            self.client.job(self.job).seal(feed=self.sources[2])
        self.closing = True
        super()._every_live_task_reachable()

    @precondition(lambda self: not self.cancelled)
    @rule(k=st.integers(1, 2), resend=st.booleans())
    def feed(self, k: int, resend: bool) -> None:
        """Tasks fed to the stream source (ids: a resend of the last one is skipped); once
        its feed is sealed, or the job ended, refused with nothing written."""
        if sum(self.SIZES[:2]) + self.fed + k > MAX_TASKS:
            return  # (the machine's positions stay below MAX_TASKS, as the appends')
        job, src = self.client.job(self.job), self.sources[2]
        ids = [f"f{self.fed + j}" for j in range(k)]
        known = 0  # a resend is skipped while its copy is kept (its id goes with a trim)
        if resend and self.fed > 1:
            ids = [f"f{self.fed - 1}", *ids]
            known = int(self.client.redis.hexists(self.client.keys(self.job).appids, f"2:{ids[0]}"))
        before = stores(self.client.connection, self.job, spec_of(self.client.connection, self.job))
        try:
            r = job.append([{"s": 2, "k": int(i[1:])} for i in ids], ids=ids, feed=src)
        except taskq.InvalidInput as e:
            assert "is sealed" in str(e) or "does not reopen" in str(e)
            after = stores(
                self.client.connection, self.job, spec_of(self.client.connection, self.job)
            )
            assert after == before
            return
        assert (r.tasks, r.skipped) == (len(ids) - known, known)
        self.fed += r.tasks

    @precondition(lambda self: not self.cancelled)
    @rule()
    def seal_feed(self) -> None:
        assert int(self.client.job(self.job).seal(feed=self.sources[2])) == self.fed

    def _logs(self) -> tuple[set[str], set[str]]:
        keys, r = self.client.keys(self.job), self.client.redis
        return set(r.zrange(keys.mixfeed, 0, -1)), set(r.zrange(keys.mixlog, 0, -1))

    @rule()
    def trim(self) -> None:
        """A mix fed by an open stream source, in its last pass, is trimmed behind a
        watermark (trim.lua); the log entries a trim removes are kept here (read just
        before and after it), so the reference is built from the whole logs."""
        feed, log = self._logs()
        got = self.client.job(self.job).trim()
        feed_after, log_after = self._logs()
        self.feed_gone |= feed - feed_after
        self.log_gone |= log - log_after
        if self.passes is None:
            assert got == 0 and not self.feed_gone and not self.log_gone

    def _weight_log(self) -> list[tuple[int, list[str]]]:
        return weight_entries(self._logs()[1] | self.log_gone)

    def _feed_log(self) -> list[Feed]:
        return feed_entries(self._logs()[0] | self.feed_gone)

    @invariant()
    def the_charge_stops_where_the_reference_stops(self) -> None:
        """The positions the current pass charged are a prefix of the reference's plan from
        the engine's logs (a charge stops at a waiting slot or the pass's end, as the plan;
        a weight change's cut charges again from its slot)."""
        s = self.client.status(self.job, summaries=0)
        if self.cancelled or s.state != "running":
            return
        spec = spec_of(self.client.connection, self.job)
        log, feed = self._weight_log(), self._feed_log()
        plan = plan_pass(spec, log, s.pass_no, feed=feed, first_slot=s.pass_no * spec.stride)
        charged = self._meta("mixh") - s.pass_no * spec.stride
        if 0 <= charged < spec.stride:  # (else the state is another pass's)
            assert charged <= len(plan.slots)

    @invariant()
    def debts_and_repaid_slots_are_the_references(self) -> None:
        """The slots handed out that repaid a debt are the reference's (``Slot.repaid``);
        each source's debt in ``mix_status()`` is the reference's at the charge's
        high-water (``plan_pass(..., length=<high_water>)``, or the pass's plan where it
        ended there), and a wait it names is the reference's wait at the high-water."""
        if self.cancelled:
            return
        conn, job = self.client.connection, self.client.job(self.job)
        status = job.mix_status()
        p = status["pass"]
        spec, log, feed = spec_of(conn, self.job), self._weight_log(), self._feed_log()
        plan = plan_pass(spec, log, p, feed=feed, first_slot=p * spec.stride)
        check_debt_readers(job, spec, log, feed, p, plan)


StreamMixedMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_on_a_stream_mixed_job(sm_url):
    StreamMixedMachine.url = sm_url
    StreamMixedMachine.TestCase("runTest").runTest()


class TrimmedStreamMixedMachine(StreamMixedMachine):
    """StreamMixedMachine of one pass, so its trim runs (docs/mixing.md, "Trim"): the
    watermark moves over done positions interleaved with every verb; after every step
    the positions from the watermark up are the reference's from the whole logs (the
    machine keeps what each trim removed), the copies below it are gone, and each source's
    acked count is the status's. As TrimmedStreamMachine, its pass is never forced on and
    its feed sealed only by the closing check."""

    passes = 1

    def next_pass(self, force: bool) -> None:  # not a rule here (see the docstring)
        pass

    def seal_feed(self) -> None:  # not a rule here
        pass


TrimmedStreamMixedMachine.TestCase.settings = EngineMachine.TestCase.settings


def test_engine_state_machine_on_a_trimmed_stream_mixed_job(sm_url):
    TrimmedStreamMixedMachine.url = sm_url
    TrimmedStreamMixedMachine.TestCase("runTest").runTest()
