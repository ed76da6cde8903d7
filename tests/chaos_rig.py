"""The Redis chaos rig: one Redis, a TCP proxy, fleets of trainers, a reaper, probes and a
timeline; and the seeded random schedules of scenario 7.

Used by ``tests/chaos/test_chaos_redis.py`` (scenarios 3, 4 and 7) and the long form
``bench/chaos_random_long.py``. Everything ``Rig`` starts is stopped by ``close()``;
``explained()`` prints its timeline when a check inside fails.

Data flow: test -> chaos_rig.py -> chaos.py / tcp_proxy.py -> trainers -> taskq -> Redis
<- reaper.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chaos import EXIT_EARLY, Fleet, ReaperProc, TrainerProc, audit_job, wait_for
from tcp_proxy import TcpProxy

import taskq
from taskq.devserver import RedisServer

TTL_S = 2.0
HBI_S = 0.5


# -- the rig: one Redis, a proxy, fleets, a reaper, probes, a timeline ---------------------
class Rig:
    """Everything one scenario starts, and its timeline; ``close()`` stops it all."""

    def __init__(self, server: RedisServer, workdir: Path, job: str) -> None:
        self.server = server
        self.workdir = Path(workdir)
        self.job = job
        self.t0 = time.time()
        self.timeline: list[tuple[float, str]] = []
        self.proxy = TcpProxy(server.port)
        self.client = taskq.connect(server.url)
        self.direct = Fleet(server.url, job, self.workdir / "logs")
        self.proxied = Fleet(self.proxy.url, job, self.workdir / "logs")
        self.reaper: ReaperProc | None = None
        self.probes: list[taskq.Trainer] = []
        self.redis_paused = False
        self._seq = 0
        self.note(f"redis on {server.port}, proxy on {self.proxy.port}, job {job}")

    # -- bookkeeping
    def note(self, what: str) -> float:
        now = time.time()
        self.timeline.append((now, what))
        return now

    def story(self) -> str:
        return "\n".join(f"  {t - self.t0:7.2f}s  {what}" for t, what in self.timeline)

    @contextmanager
    def explained(self, header: str = "") -> Iterator[None]:
        """On any failure print the timeline (and ``header``: a seed, a schedule)."""
        try:
            yield
        except BaseException:
            print(f"\n--- chaos timeline of {self.job} ---\n{header}{self.story()}", flush=True)
            raise

    # -- setup
    def create_job(self, n: int, passes: int, **kw: Any) -> None:
        self.client.create_job(
            self.job,
            [{"i": i} for i in range(n)],
            passes=passes,
            worker_ttl=TTL_S,
            heartbeat_interval=HBI_S,
            **kw,
        )
        self.note(f"job created: {n} tasks x {passes} passes, ttl {TTL_S}s, hbi {HBI_S}s")

    def start_reaper(self) -> None:
        self.reaper = ReaperProc(
            self.server.url, interval=0.2, jobs=[self.job], log_path=self.workdir / "reaper.log"
        )
        self.note(f"reaper started (pid {self.reaper.proc.pid})")

    def spawn(self, proxied: bool = False, n: int = 1, **kw: Any) -> list[TrainerProc]:
        fleet = self.proxied if proxied else self.direct
        out = []
        for _ in range(n):
            self._seq += 1
            wid = f"{'p' if proxied else 'd'}{self._seq:02d}"
            out += fleet.spawn(1, worker_id=wid, **kw)
            self.note(f"joined {wid} ({'via proxy' if proxied else 'direct'})")
        return out

    def probe(self, worker_id: str, via_proxy: bool) -> taskq.Trainer:
        """A trainer in this process (its heartbeat thread here), for at_risk/revoked."""
        url = self.proxy.url if via_proxy else self.server.url
        probe = taskq.Trainer(self.job, url=url, worker_id=worker_id, handle_signals=False)
        self.probes.append(probe)
        self.note(f"probe {worker_id} registered ({'via proxy' if via_proxy else 'direct'})")
        return probe

    # -- faults
    def pause_redis(self) -> None:
        assert self.server.proc is not None
        os.kill(self.server.proc.pid, signal.SIGSTOP)
        self.redis_paused = True
        self.note("redis SIGSTOP")

    def resume_redis(self) -> None:
        assert self.server.proc is not None
        os.kill(self.server.proc.pid, signal.SIGCONT)
        self.redis_paused = False
        self.note("redis SIGCONT")

    def crash_redis(self, down_s: float) -> None:
        """kill -9 the server, stay down ``down_s``, restart it on the same port/dir."""
        self.server.kill()
        self.note("redis kill -9")
        time.sleep(down_s)  # the outage
        self.server.start()
        self.note(f"redis restarted after {down_s:.2f}s down")

    def copy_aof(self) -> Path:
        """A consistent copy of ``appendonlydir`` as of now: BGREWRITEAOF (a fresh base and
        manifest), then copy the whole directory while the server is stopped for a few
        milliseconds, into a temp name renamed at the end (a lagging replica's state)."""
        r = self.server.client()
        r.bgrewriteaof()

        def rewritten() -> bool:
            info = r.info("persistence")
            return (
                int(info["aof_rewrite_in_progress"]) == 0
                and int(info["aof_rewrite_scheduled"]) == 0
            )

        wait_for(rewritten, 10, what="BGREWRITEAOF to finish")
        assert r.info("persistence")["aof_last_bgrewrite_status"] == "ok"
        src = self.server.dir / "appendonlydir"
        tmp, dst = self.workdir / "aof-copy.tmp", self.workdir / "aof-copy"
        self.pause_redis()
        try:
            shutil.copytree(src, tmp)
        finally:
            self.resume_redis()
        tmp.rename(dst)
        assert any(p.name.endswith(".manifest") for p in dst.iterdir()), list(dst.iterdir())
        self.note(f"AOF copied: {sorted(p.name for p in dst.iterdir())}")
        return dst

    def restart_from(self, copy: Path, down_s: float = 0.3) -> None:
        """kill -9, replace ``appendonlydir`` with ``copy``, restart on the same port."""
        self.server.kill()
        self.note("redis kill -9 (to restart from the older copy)")
        live = self.server.dir / "appendonlydir"
        shutil.rmtree(live)
        shutil.copytree(copy, live)
        time.sleep(down_s)  # the outage
        self.server.start()
        self.note("redis restarted from the older AOF copy")

    # -- reading
    def counters(self) -> dict[str, int]:
        return dict(self.client.status(self.job, summaries=0).counters)

    def events(self, kind: str) -> list[dict[str, str]]:
        rows, since = [], "-"
        while True:
            batch = self.client.events(self.job, since=since, count=1000)
            rows += [f for _, f in batch if f.get("type") == kind]
            if len(batch) < 1000:
                return rows
            since = batch[-1][0]

    def logs(self) -> list[Path]:
        return self.direct.logs() + self.proxied.logs() + [self.workdir / "logs" / "probes.jsonl"]

    def log_probe_task(self, probe: taskq.Trainer, task: taskq.Task) -> None:
        """Record a task a probe processed (and is about to ack) like a fleet trainer."""
        with open(self.workdir / "logs" / "probes.jsonl", "a") as f:
            f.write(
                json.dumps(
                    {
                        "worker": probe.worker_id,
                        "pass": task.pass_no,
                        "task": task.id,
                        "token": task.token,
                        "t": time.time(),
                        "start": time.time(),
                    }
                )
                + "\n"
            )

    def trainers(self) -> list[TrainerProc]:
        return self.direct.trainers + self.proxied.trainers

    def finish(self, timeout: float) -> dict[str, Any]:
        """Wait for every trainer to exit, check none ended early, and run the audit."""
        ok = self.direct.join_all(timeout) and self.proxied.join_all(5)
        assert ok, (
            f"trainers still running after {timeout}s: "
            f"{[t.worker_id for t in self.trainers() if t.alive()]}; "
            f"status {self.client.status(self.job, summaries=0)}"
        )
        early = [t.worker_id for t in self.trainers() if t.exitcode == EXIT_EARLY]
        assert not early, f"trainers ended while the job still had work: {early}"
        for probe in self.probes:
            probe.close()
        result = audit_job(self.client, self.job, self.logs())
        self.note(
            f"audit: passes {result['passes']} acked {result['acked']} stale "
            f"{result['stale']} dead {result['dead']} processed {result['processed']} "
            f"duplicates {result['duplicates']}"
        )
        return result

    def close(self) -> None:
        if os.environ.get("TASKQ_CHAOS_VERBOSE"):
            print(f"\n--- chaos timeline of {self.job} ---\n{self.story()}", flush=True)
        if self.redis_paused and self.server.proc is not None:
            try:
                os.kill(self.server.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.proxy.stop()
        self.direct.close()
        self.proxied.close()
        for probe in self.probes:
            try:
                probe.reconnect_timeout = 0
                probe.close()
            except Exception:  # noqa: BLE001 - teardown must go on
                pass
        if self.reaper is not None:
            self.reaper.stop()


# -- scenario 7: a seeded random schedule -----------------------------------------------------
#: What a random schedule is made of, with weights.
ACTIONS = {
    "join": 3,
    "join_proxied": 2,
    "leave": 2,
    "kill": 2,
    "pause_short": 2,
    "pause_long": 2,
    "cut_short": 1,
    "cut_long": 1,
    "redis_restart": 1,
}
MAX_LIVE = 5  # trainers at once (a 2-core machine)


def plan(seed: int, duration_s: float, ttl_s: float = TTL_S) -> list[dict[str, Any]]:
    """A schedule of faults drawn from ``random.Random(seed)``: one entry every 0.4-1.5 s
    for ``duration_s``. Durations of pauses and cuts are drawn shorter or longer than the
    ttl; ``pick`` chooses the target among the eligible trainers when the entry runs."""
    rng = random.Random(seed)
    kinds, weights = list(ACTIONS), list(ACTIONS.values())
    out: list[dict[str, Any]] = []
    t = 0.5
    while t < duration_s:
        kind = rng.choices(kinds, weights)[0]
        entry: dict[str, Any] = {"at": round(t, 2), "do": kind, "pick": round(rng.random(), 3)}
        if kind in ("pause_short", "cut_short"):
            entry["for"] = round(rng.uniform(0.2, 0.6 * ttl_s), 2)
        elif kind in ("pause_long", "cut_long"):
            entry["for"] = round(rng.uniform(ttl_s + 0.5, ttl_s + 2.0), 2)
        elif kind == "redis_restart":
            entry["for"] = round(rng.uniform(0.1, ttl_s + 1.0), 2)
        elif kind.startswith("join"):
            entry["prefetch"] = rng.choice([0, 0, 1])
            entry["step"] = round(rng.uniform(0.15, 0.3), 2)
        if kind.startswith("cut"):
            entry["deliver"] = rng.random() < 0.5
        out.append(entry)
        t += rng.uniform(0.4, 1.5)
    return out


class RandomRun:
    """Runs a planned schedule on a rig: one entry at its time, the end of each pause or
    cut at its own; an entry with no eligible target is skipped (and noted)."""

    def __init__(self, rig: Rig, schedule: list[dict[str, Any]], max_live: int = MAX_LIVE) -> None:
        self.rig = rig
        self.schedule = schedule
        self.max_live = max_live
        self.paused: dict[str, float] = {}  # worker id -> SIGCONT due (time.time())
        self.cut_until = 0.0
        self.removed: dict[str, str] = {}  # worker id -> "term" | "kill"
        self._deliver = True
        self.redis_back_at = 0.0  # restart due (time.time()) while Redis is down

    def live(self) -> list[TrainerProc]:
        return [t for t in self.rig.trainers() if t.alive() and t.worker_id not in self.removed]

    def eligible(self) -> list[TrainerProc]:
        return [t for t in self.live() if t.worker_id not in self.paused]

    def job_over(self) -> bool:
        if self.redis_back_at:
            return False  # not while Redis is down
        return self.rig.client.status(self.rig.job, summaries=0).state != "running"

    def run(self) -> None:
        start = time.time()
        for entry in self.schedule:
            while time.time() < start + entry["at"]:
                self._due()
                time.sleep(0.02)  # the schedule's clock
            self._due()
            if self.job_over():
                self.rig.note("job over: the rest of the schedule is skipped")
                break
            self._apply(entry)
        self.end_all()

    def _due(self) -> None:
        now = time.time()
        if self.redis_back_at and now >= self.redis_back_at:
            self.redis_back_at = 0.0
            self.rig.server.start()
            self.rig.note("redis restarted")
        for wid, until in list(self.paused.items()):
            if now >= until:
                del self.paused[wid]
                self._trainer(wid).cont()
                self.rig.note(f"SIGCONT {wid}")
        if self.rig.proxy.is_cut and now >= self.cut_until:
            self.rig.proxy.restore(deliver=self._deliver)
            self.rig.note(f"proxy restored ({'late delivery' if self._deliver else 'dropped'})")

    def _trainer(self, wid: str) -> TrainerProc:
        return next(t for t in self.rig.trainers() if t.worker_id == wid)

    def _apply(self, e: dict[str, Any]) -> None:
        rig, kind = self.rig, e["do"]
        targets = self.eligible()
        pick = targets[int(e["pick"] * len(targets))] if targets else None
        if kind.startswith("join"):
            if len(self.live()) >= self.max_live:
                rig.note(f"skip {kind}: {self.max_live} trainers live")
                return
            options = {"prefetch": e["prefetch"]} if e["prefetch"] else {}
            rig.spawn(proxied=kind == "join_proxied", step_s=e["step"], **options)
        elif kind in ("leave", "kill"):
            # keep one trainer unpaused at least, so the schedule never stalls the job
            if pick is None or len(targets) < 2:
                rig.note(f"skip {kind}: too few trainers")
                return
            self.removed[pick.worker_id] = "term" if kind == "leave" else "kill"
            (pick.term if kind == "leave" else pick.kill)()
            rig.note(f"{'SIGTERM' if kind == 'leave' else 'SIGKILL'} {pick.worker_id}")
        elif kind.startswith("pause"):
            if pick is None or len(targets) < 2:
                rig.note(f"skip {kind}: too few trainers")
                return
            pick.stop()
            self.paused[pick.worker_id] = time.time() + e["for"]
            rig.note(f"SIGSTOP {pick.worker_id} for {e['for']}s")
        elif kind.startswith("cut"):
            if rig.proxy.is_cut:
                rig.note(f"skip {kind}: already cut")
                return
            rig.proxy.cut()
            self.cut_until, self._deliver = time.time() + e["for"], e["deliver"]
            rig.note(f"proxy cut for {e['for']}s")
        elif kind == "redis_restart":
            if self.redis_back_at:
                rig.note(f"skip {kind}: Redis is down")
                return
            # down for a while (joins, pauses and cuts go on meanwhile), back in _due
            rig.server.kill()
            self.redis_back_at = time.time() + e["for"]
            rig.note(f"redis kill -9 (down for {e['for']}s)")
        else:
            raise ValueError(f"unknown schedule entry {e!r}")

    def end_all(self) -> None:
        """Resume everything paused, restore the proxy, and make sure two direct trainers
        run, so the job can finish."""
        if self.redis_back_at:
            wait = self.redis_back_at - time.time()
            time.sleep(max(0.0, wait))  # the rest of the scheduled outage
            self.redis_back_at = 0.0
            self.rig.server.start()
            self.rig.note("redis restarted (schedule over)")
        for wid in list(self.paused):
            del self.paused[wid]
            self._trainer(wid).cont()
            self.rig.note(f"SIGCONT {wid} (schedule over)")
        if self.rig.proxy.is_cut:
            self.rig.proxy.restore()
            self.rig.note("proxy restored (schedule over)")
        direct = [t for t in self.live() if t.worker_id.startswith("d")]
        if len(direct) < 2 and not self.job_over():
            self.rig.spawn(n=2 - len(direct), step_s=0.05)


def random_scenario(
    rig: Rig,
    seed: int,
    duration_s: float,
    n: int,
    passes: int,
    finish_timeout: float = 90.0,
    max_live: int = MAX_LIVE,
) -> dict[str, Any]:
    """Scenario 7 on ``rig``: a job, a reaper, 2 direct trainers and 1 behind the proxy,
    the schedule of ``seed``, then the audit. Returns the audit summary."""
    schedule = plan(seed, duration_s)
    header = (
        f"seed {seed}\nschedule:\n"
        + "\n".join(f"  {json.dumps(e)}" for e in schedule)
        + "\ntimeline:\n"
    )
    with rig.explained(header):
        rig.create_job(n, passes)
        rig.start_reaper()
        rig.spawn(n=2, step_s=0.2)
        rig.spawn(proxied=True, step_s=0.2)
        run = RandomRun(rig, schedule, max_live)
        run.run()
        result = rig.finish(finish_timeout)
        assert result["passes"] == passes, result
        for t in rig.trainers():
            how = run.removed.get(t.worker_id)
            expected = {
                None: (0,),
                "term": (0, 128 + signal.SIGTERM, -signal.SIGTERM),
                "kill": (0, -signal.SIGKILL),
            }[how]
            assert t.exitcode in expected, f"{t.worker_id} ({how}) exited {t.exitcode}"
        result["schedule"] = schedule
        return result
