"""A hypothesis state machine drives the engine (manual clock) through random steps and
checks the invariants of docs/design.md after every one, against a plain-Python model of
who holds what. The model is the trainers' side; Redis is the truth checked for
consistency."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import taskq
from taskq.stats import parse_lease

N_TASKS = 5
WORKERS = ("w0", "w1", "w2")
_ids = itertools.count()


@pytest.fixture(scope="module")
def sm_url(redis_server):
    return redis_server.url


class EngineMachine(RuleBasedStateMachine):
    url: str = ""
    backup_leases = False

    def __init__(self) -> None:
        super().__init__()
        self.client = taskq.connect(self.url)
        self.job = f"sm-{next(_ids)}"
        self.client.create_job(
            self.job,
            chunks=list(range(N_TASKS)),
            passes=None,
            worker_ttl=3.0,
            heartbeat_interval=1.0,
            task_timeout=None,
            max_failures=2,
            max_attempts=3,
            shuffle=True,
            seed=11,
            backup_leases=self.backup_leases,
            manual_clock=True,
        )
        self.trainers = {
            w: taskq.Trainer(self.job, client=self.client, worker_id=w, heartbeat=False)
            for w in WORKERS
        }
        self.held: dict[str, list[taskq.Task]] = {w: [] for w in WORKERS}
        self.ended: list[tuple[str, taskq.Task]] = []
        self.max_token = 0
        self.last_pass = 0
        self.last_round = self._meta("round")
        self.last_done = 0
        self.forced = False

    # -- helpers -----------------------------------------------------------------
    def _meta(self, field: str) -> int:
        return int(float(self.client.redis.hget(self.client.keys(self.job).meta, field) or 0))

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
        t = self.trainers[worker]
        # the call reclaims first: a worker past its liveness deadline (on the job's
        # clock, after the silence rule) has already lost its leases when it writes
        now, seen = int(self.client.redis.get(keys.clock) or 0), self._meta("seen")
        offset = self._meta("offset")
        if now - seen > self._meta("ttl") - self._meta("hbi"):
            offset += now - seen
        deadline = self.client.redis.zscore(keys.workers, f"{worker}|{t.incarnation}")
        alive = deadline is not None and deadline >= now - offset
        return bool(
            alive
            and lease
            and lease["live"]
            and lease["round"] == self._meta("round")
            and lease["worker"] == worker
            and lease["worker_incarnation"] == t.incarnation
            and lease["token"] == task.token
        )

    def _end(self, worker: str, task: taskq.Task, op: str) -> None:
        current = self._is_current(worker, task)
        done_before = self._meta("ndone")
        fn = getattr(self.trainers[worker], op)
        if current:
            fn(task)
            if op == "ack":
                assert self._meta("ndone") == done_before + 1 or self._meta("round") != 0
        else:
            with pytest.raises(taskq.LeaseLost):
                fn(task)
        if task in self.held[worker]:
            self.held[worker].remove(task)
        self.ended.append((worker, task))

    # -- rules -------------------------------------------------------------------
    @rule(w=st.sampled_from(WORKERS))
    def lease(self, w: str) -> None:
        task = self.trainers[w].lease(timeout=0)
        if task is not None:
            assert task.token > self.max_token, "a new lease gets a larger token than any before"
            self.max_token = task.token
            assert 0 <= task.id < N_TASKS
            self.held[w].append(task)

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

    @precondition(lambda self: any(self.held.values()))
    @rule(w=st.sampled_from(WORKERS))
    def release_and_lease_again(self, w: str) -> None:
        """The same worker gets the same task back under a new token (front first)."""
        if self.held[w]:
            self._end(w, self.held[w][0], "release")
            self.lease(w)

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

    @rule(w=st.sampled_from(WORKERS))
    def heartbeat(self, w: str) -> None:
        revoked = set(self.trainers[w].heartbeat())
        self.held[w] = [t for t in self.held[w] if t.id not in revoked and not t.revoked.is_set()]

    @rule(ms=st.sampled_from([500, 1000, 2000, 4000]), silent=st.booleans())
    def advance(self, ms: int, silent: bool) -> None:
        self.client.advance_clock(self.job, ms, silent=silent)

    @rule()
    def reap(self) -> None:
        self.client.reap(self.job)

    @rule()
    def retry(self) -> None:
        self.client.retry(self.job)

    @rule(task_id=st.integers(0, N_TASKS - 1))
    def revoke(self, task_id: int) -> None:
        self.client.revoke(self.job, task_id)

    @rule()
    def force_next(self) -> None:
        try:
            self.client.next_pass(self.job, force=True)
            self.forced = True
        except (taskq.PassMismatch, taskq.JobCompleted):
            pass

    @rule()
    def reset(self) -> None:
        self.client.reset_pass(self.job)

    # -- invariants (docs/design.md, numbered as there) -------------------------
    @invariant()
    def partition_and_counters(self) -> None:
        keys = self.client.keys(self.job)
        r = self.client.redis
        rnd = self._meta("round")
        dead = {int(x) for x in r.smembers(keys.dead)}
        done = {i for i in range(N_TASKS) if r.getbit(keys.done, i)}
        raw = r.hgetall(keys.leases)
        leases = {int(k): parse_lease(v) for k, v in raw.items() if not k.startswith("b:")}
        leased = {t for t, ls in leases.items() if ls and ls["live"] and ls["round"] == rnd}
        backups = {int(k[2:]): parse_lease(v) for k, v in raw.items() if k.startswith("b:")}
        backed = {t for t, b in backups.items() if b and b["live"] and b["round"] == rnd}
        # a backup lease only beside its task's current lease, held by another worker, and
        # only while the job runs (its holder's writes follow the same rules)
        for t in backed:
            assert t in leased, "a backup without the task's own lease"
            assert backups[t]["worker"] != leases[t]["worker"], "a backup of one's own task"
        # 1. every live task in exactly one of todo, leased, done; dead in none
        assert not (done & leased), "a task is both done and leased"
        assert not (dead & leased) and not (dead & done), "a dead task is in todo/leased/done"
        # 7. counters agree with the sets and bitmaps they count
        state = r.hget(keys.meta, "state")
        assert self._meta("ndone") == len(done) or state == "cancelled"
        if state == "running":
            assert self._meta("nleased") == len(leased)
            assert self._meta("nreserved") == r.zcard(keys.reserved)
        assert r.scard(keys.dead) == len(dead)
        # 3. a pass's done count never exceeds its live tasks
        assert len(done) <= N_TASKS - len(dead)
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
    def pass_grows_by_one_only_when_complete(self) -> None:
        p = self._meta("pass")
        assert p - self.last_pass in (0, 1), "the pass number grows by exactly one"
        self.last_pass = p
        self.forced = False


EngineMachine.TestCase.settings = settings(
    max_examples=40,
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
