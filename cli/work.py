"""``taskq work JOB -- CMD ARGS...``: a trainer for any language, one CMD run per task.

Each task's JSON goes to CMD on stdin (and in ``TASKQ_TASK`` when under 64 KiB), with
``TASKQ_JOB``, ``TASKQ_TASK_ID``, ``TASKQ_PASS``, ``TASKQ_TOKEN`` and ``TASKQ_ATTEMPT``
(and a mixed job's ``TASKQ_SOURCE``: the source job of the task, docs/mixing.md).
Exit 0 acks (in the same call that leases the next task); a non-zero exit fails the task
with the tail of CMD's stderr. Heartbeats go on while CMD runs. CMD runs in a session
(process group) of its own: a revoked lease terminates the whole group (SIGTERM, then
SIGKILL after ``--grace``), so the processes CMD started go too. SIGTERM or SIGINT to
``taskq work`` is passed to the group, and whatever CMD's exit code, its lease is
released and the worker leaves; ``taskq work`` then exits 128 + the signal number.

At exit it logs one summary line (done / failed / released / revoked). Exit codes: 0,
the job completed (or was cancelled, or the worker drained) and no task it ran is dead;
3 (``EXIT_DEAD``), a task it ran ended dead; 128 + N after signal N; 1 for errors, 2 for
usage errors.

Any job, plain or sharded, is worked by ``taskq.Trainer(JOB)`` (one class, the same
surface for both): ``TASKQ_JOB`` and ``TASKQ_TASK_ID`` name the
job (a sharded job's shard) and the task in it, ``TASKQ_GLOBAL_ID`` the task in the whole
job (the same id for a plain job).

Data flow: any program <- cli/work.py -> taskq.Trainer -> Redis.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from types import FrameType
from typing import Any

import click

import taskq
from taskq.engine.connection import resolve_url

log = logging.getLogger("taskq.work")

#: ``TASKQ_TASK`` carries the task JSON only below this size (environment limits).
ENV_TASK_MAX = 64 * 1024
#: Bytes of CMD's stderr kept as the failure message.
STDERR_TAIL = 2000
#: Exit code when a task this worker ran ended dead (max failures or max attempts).
EXIT_DEAD = 3
#: How long ``taskq work`` waits at start for an unreachable Redis to answer.
STARTUP_WAIT_S = 60.0


class Seconds(click.ParamType):
    """A finite number of seconds >= ``minimum`` (nan and inf are not durations)."""

    name = "SECONDS"

    def __init__(self, minimum: float, open_min: bool = False) -> None:
        self.minimum = minimum
        self.open_min = open_min

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        too_small = seconds <= self.minimum if self.open_min else seconds < self.minimum
        if not math.isfinite(seconds) or too_small:
            bound = f"> {self.minimum:g}" if self.open_min else f">= {self.minimum:g}"
            self.fail(f"{value!r}: give a finite number of seconds {bound}", param, ctx)
        return seconds


class _Runner:
    """Runs CMD for tasks of one trainer and turns signals into a graceful leave."""

    def __init__(
        self,
        trainer: taskq.Trainer,
        client: taskq.Client,
        cmd: list[str],
        grace: float,
        ranges: bool = False,
    ) -> None:
        self.trainer = trainer
        self.client = client  # the trainer's connection's: its tasks' states
        self.cmd = cmd
        self.grace = grace
        #: CMD reads the range of its task (``--ranges``): TASKQ_START / TASKQ_END are set
        self.ranges = ranges
        self.signum: int | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.in_child = False
        self.counts = {"done": 0, "failed": 0, "released": 0, "revoked": 0}
        self.dead: list[int] = []

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        if not self.in_child:
            # inside the trainer's own calls (leasing, waiting): leave at once
            raise SystemExit(128 + signum)
        child = self.child
        if child is not None:
            _signal_group(child, signum)

    def run_one(self, task: taskq.Task) -> tuple[int | None, str]:
        """Run CMD for ``task``. Returns (exit code or None if it could not start, stderr
        tail)."""
        payload = json.dumps(task.as_dict()).encode()
        env = dict(os.environ)
        env.update(
            TASKQ_JOB=task.job,
            TASKQ_TASK_ID=str(task.id),
            TASKQ_PASS=str(task.pass_no),
            TASKQ_TOKEN=str(task.token),
            TASKQ_ATTEMPT=str(task.attempt),
        )
        env.pop("TASKQ_TASK", None)
        env.pop("TASKQ_SOURCE", None)
        if task.source is not None:
            env["TASKQ_SOURCE"] = task.source
        env["TASKQ_GLOBAL_ID"] = str(self.trainer.global_id(task))
        if self.ranges:  # the range CMD reads (an end moves no more once CMD runs)
            env["TASKQ_START"] = str(task.start)
            env["TASKQ_END"] = "" if task.end is None else str(task.end)
        if len(payload) < ENV_TASK_MAX:
            env["TASKQ_TASK"] = payload.decode()
        tail: deque[bytes] = deque()
        size = [0]

        def pump_stderr(stream: Any) -> None:
            for chunk in iter(lambda: stream.read1(4096), b""):
                try:
                    sys.stderr.write(chunk.decode(errors="replace"))
                    sys.stderr.flush()
                except (OSError, ValueError):
                    pass
                tail.append(chunk)
                size[0] += len(chunk)
                while size[0] - len(tail[0]) > STDERR_TAIL and len(tail) > 1:
                    size[0] -= len(tail.popleft())

        def feed_stdin(stream: Any) -> None:
            try:
                stream.write(payload)
                stream.close()
            except (BrokenPipeError, OSError):
                pass

        self.in_child = True
        try:
            try:
                # a session of its own: what CMD starts can be signalled with it, and a
                # terminal's Ctrl-C reaches CMD only through us (once, not twice)
                self.child = subprocess.Popen(
                    self.cmd,
                    stdin=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    start_new_session=True,
                )
            except OSError as e:
                return None, f"could not start {self.cmd[0]!r}: {e}"
            child = self.child
            if self.signum is not None:  # a signal came while it was starting
                _signal_group(child, self.signum)
            readers = [
                threading.Thread(target=pump_stderr, args=(child.stderr,), daemon=True),
                threading.Thread(target=feed_stdin, args=(child.stdin,), daemon=True),
            ]
            for th in readers:
                th.start()
            stopping_since: float | None = None
            while True:
                try:
                    rc = child.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if task.revoked.is_set() and stopping_since is None:
                    log.warning("task %s: lease revoked; terminating the command", task.id)
                    _signal_group(child, signal.SIGTERM)
                    stopping_since = time.monotonic()
                elif self.signum is not None and stopping_since is None:
                    stopping_since = time.monotonic()
                if stopping_since is not None and time.monotonic() - stopping_since > self.grace:
                    _signal_group(child, signal.SIGKILL)
            if stopping_since is None and (self.signum is not None or task.revoked.is_set()):
                stopping_since = time.monotonic()  # CMD exited before the loop saw why
            if stopping_since is not None:
                # CMD is gone; what it started gets the rest of the grace, then SIGKILL
                _reap_group(child, self.grace - (time.monotonic() - stopping_since))
            readers[0].join(2.0)
            text = b"".join(tail).decode(errors="replace")[-STDERR_TAIL:]
            return rc, text.strip()
        finally:
            self.in_child = False
            self.child = None

    def loop(self) -> int:
        """Work until the job completes or is cancelled, the worker drains, or a signal."""
        trainer = self.trainer
        for task in trainer:
            rc, tail = self.run_one(task)
            if self.signum is not None:
                log.info(
                    "task %s: signal %d; releasing (command exit %s)", task.id, self.signum, rc
                )
                self._end(trainer.release, task)
                self.counts["released"] += 1
                return 128 + self.signum
            if task.revoked.is_set():
                log.warning("task %s: lease revoked (command exit %s); not counted", task.id, rc)
                self.counts["revoked"] += 1
            elif rc == 0:
                log.info("task %s (pass %d%s): done", task.id, task.pass_no, _of(task))
                self.counts["done"] += 1
            else:
                why = f"exit {rc}" if rc is not None else "not started"
                if rc is not None and rc < 0:
                    why = f"killed by signal {-rc}"
                message = failure_message(why, tail)
                log.warning("task %s: failed (%s%s)", task.id, why, _of(task))
                self._end(trainer.fail, task, message)
                self.counts["failed"] += 1
                self._note_if_dead(task)
        return EXIT_DEAD if self.dead else 0

    def _note_if_dead(self, task: taskq.Task) -> None:
        try:
            state = self.client.job(task.job).task(task.id, history=0)["state"]
        except taskq.TaskqError as e:
            log.warning("task %s: cannot read its state after the failure: %s", task.id, e)
            return
        if state == "dead":
            log.error(
                "task %s is dead (max failures or max attempts reached): taskq tasks show %s %s",
                task.id,
                task.job,
                task.id,
            )
            self.dead.append(task.id)

    def summary(self, code: int) -> str:
        """The one line logged at exit."""
        c = self.counts
        dead = f" ({len(self.dead)} now dead: task(s) {self.dead})" if self.dead else ""
        return (
            f"worker {self.trainer.worker_id} leaving: {c['done']} done, {c['failed']} "
            f"failed{dead}, {c['released']} released, {c['revoked']} revoked; exit {code}"
        )

    @staticmethod
    def _end(action: Any, task: taskq.Task, *args: Any) -> None:
        try:
            action(task, *args)
        except taskq.LeaseLost as e:
            log.warning("%s", e)


def failure_message(why: str, tail: str) -> str:
    """``exit 3: <last stderr line>`` then the tail before it, within the 500 characters
    the server keeps: the cause (usually the last line) comes first, so it survives
    every one-line view and the cut."""
    lines = [line for line in tail.splitlines() if line.strip()]
    if not lines:
        return why
    head = f"{why}: {lines[-1].strip()}"[:490]
    rest: list[str] = []
    room = 490 - len(head)
    for line in reversed(lines[:-1]):  # whole lines, the latest that fit
        if len(line) + 1 > room:
            break
        rest.insert(0, line)
        room -= len(line) + 1
    return "\n".join([head, *rest])


def _of(task: taskq.Task) -> str:
    """A mixed job's task's source for a log line (docs/mixing.md), else nothing."""
    return "" if task.source is None else f", source {task.source}"


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to CMD's process group (CMD leads it: start_new_session)."""
    try:
        os.killpg(child.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is empty already


def _reap_group(child: subprocess.Popen[bytes], grace: float) -> None:
    """After CMD exited on a revoke or a signal: wait up to ``grace`` for the rest of its
    group, then SIGKILL whatever is left."""
    deadline = time.monotonic() + max(0.0, grace)
    while time.monotonic() < deadline:
        try:
            os.killpg(child.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    _signal_group(child, signal.SIGKILL)


def _wait_for_redis(client: taskq.Client, bound_s: float) -> None:
    """Return once Redis answers; log what is awaited, where and for how long.

    Raises:
        ConnectionLost: no answer within ``bound_s``.
    """
    began = time.monotonic()
    delay = 0.5
    while True:
        try:
            client.ping()
            if time.monotonic() - began > 1:
                log.info(
                    "Redis at %s answers again after %.1f s", client.url, time.monotonic() - began
                )
            return
        except taskq.ConnectionLost as e:
            waited = time.monotonic() - began
            if waited >= bound_s:
                raise taskq.ConnectionLost(
                    f"Redis at {client.url} did not answer for {waited:.0f} s; giving up"
                ) from e
            delay = min(delay, bound_s - waited)
            log.warning(
                "waiting for Redis at %s to answer: unreachable for %.1f s, next "
                "try in %.1f s, giving up after %.0f s",
                client.url,
                waited,
                delay,
                bound_s,
            )
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


class _RedisDownContext(logging.Filter):
    """Adds where Redis is, and for how long it has been down, to the trainer's
    "Redis unreachable; retrying" lines (each follows a call that spent seconds in its
    own retries, so the bare "retrying in 0.05s" undersold the wait)."""

    def __init__(self, url: str, bound_s: float) -> None:
        super().__init__()
        self.url = url
        self.bound_s = bound_s
        self.since: float | None = None
        self.last = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Redis unreachable; retrying"):
            now = time.monotonic()
            if self.since is None or now - self.last > 30:  # a new outage
                self.since = now
            self.last = now
            record.msg = (
                "Redis at %s unreachable; retrying (%.1f s since the first retry; "
                "a call gives up after %.0f s)"
            )
            record.args = (self.url, now - self.since, self.bound_s)
        return True


def _redis_url(url: str | None) -> tuple[str | None, str | None]:
    """The URL and key prefix: this command's --url, else the group's, else the env."""
    root = click.get_current_context().find_root()
    obj = root.obj
    prefix = getattr(obj, "prefix", None) or root.params.get("prefix")
    return url or getattr(obj, "url", None) or root.params.get("url"), prefix


@click.command("work", context_settings={"ignore_unknown_options": True})
@click.argument("job")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
@click.option(
    "--prefetch",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Tasks kept ahead of the current one (reserved: others may steal them; on a "
    "sharded job, leased to this worker).",
)
@click.option("--worker-id", metavar="ID", help="Worker id (default host:pid:random).")
@click.option(
    "--worker-ttl",
    type=Seconds(0.01),
    metavar="SECONDS",
    help="This worker's own liveness ttl, longer than the job's heartbeat interval "
    "(default: the job's worker_ttl).",
)
@click.option(
    "--heartbeat",
    type=click.Choice(["thread", "process"]),
    default="thread",
    show_default=True,
    help="Send heartbeats from a thread or a helper process.",
)
@click.option(
    "--grace",
    type=Seconds(0),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="After a revoke or a signal, SIGKILL the command if it has not exited.",
)
@click.option(
    "--ranges",
    is_flag=True,
    help="CMD reads the range [start, end) of its task's JSON (TASKQ_START, TASKQ_END): it "
    "may be handed a piece of a task split at a pass's tail. Without it CMD gets whole "
    "tasks only.",
)
@click.option(
    "--on-complete",
    type=click.Choice(["exit", "wait"]),
    default="exit",
    show_default=True,
    help="When the job ends (completed, cancelled, or this worker drained): exit 0, or "
    "leave the job and wait for SIGTERM / SIGINT, then exit 0 (a Deployment's pod, which "
    "an exit would restart in a loop: docs/kubernetes.md).",
)
@click.option(
    "--url", metavar="URL", help="Redis URL (default: the group's --url, env TASKQ_REDIS_URL)."
)
def work(
    job: str,
    cmd: tuple[str, ...],
    prefetch: int,
    worker_id: str | None,
    worker_ttl: float | None,
    heartbeat: str,
    grace: float,
    ranges: bool,
    on_complete: str,
    url: str | None,
) -> None:
    """Run CMD once per task of JOB, in any language.

    The task JSON ({"job", "id", "pass", "token", "attempt", "start", "end", "order",
    "source", "chunks"}) is on CMD's stdin and, under 64 KiB, in TASKQ_TASK; TASKQ_JOB,
    TASKQ_TASK_ID, TASKQ_PASS, TASKQ_TOKEN and TASKQ_ATTEMPT are set (and TASKQ_SOURCE,
    a mixed job's source job of the task: "source" in the JSON). A resumed task
    starts at sample "start" (samples in "order": null, the chunks' order). With --ranges
    CMD reads [start, end) ("end" null: the task's end; TASKQ_START, TASKQ_END too) and
    may be handed a piece of a task split at a pass's tail; without it, whole tasks only. Exit 0 acks the task; another exit fails it with the tail of
    CMD's stderr. A revoked lease terminates CMD. SIGTERM/SIGINT are passed to CMD and
    its lease is released whatever its exit code. Ends when the job completes.

    Exit 0 when the job completed (or was cancelled, or this worker drained), 3 when a
    task it ran ended dead, 128+N after signal N, 1 on errors, 2 on usage errors.

    Example: taskq work mnist -- python train_chunk.py --lr 0.1
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
    argv = list(cmd)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise click.UsageError("missing CMD (taskq work JOB -- CMD ARGS...)")
    if shutil.which(argv[0]) is None:
        raise click.UsageError(f"command not found: {argv[0]!r}")
    redis_url, prefix = _redis_url(url)
    resolved = resolve_url(redis_url)
    client = taskq.Client(resolved, key_prefix=prefix)
    client.keys(job)  # a bad name fails before any wait
    # a probe without redis-py's own retries, so the log says when the next try really is
    _wait_for_redis(taskq.Client(resolved, retries=0, socket_timeout=2.0), STARTUP_WAIT_S)
    config = client.job(job).status(summaries=0).config
    if worker_ttl is not None and worker_ttl <= config["heartbeat_interval"]:
        raise click.UsageError(
            f"--worker-ttl {worker_ttl:g} must be longer than job {job}'s "
            f"heartbeat interval ({config['heartbeat_interval']:g} s)"
        )
    trainer = taskq.Trainer(
        job,
        url=resolved,
        client=client,
        worker_id=worker_id,
        prefetch=prefetch,
        worker_ttl=worker_ttl,
        heartbeat=heartbeat,
        handle_signals=False,
        # a range handed to CMD is fixed while it runs: it is given pieces, never split
        ranges=ranges,
        split_tails=False,
    )
    down = _RedisDownContext(client.url, trainer.reconnect_timeout)
    for name in ("taskq.trainer", "taskq.sharded"):
        logging.getLogger(name).addFilter(down)
    runner = _Runner(trainer, client, argv, grace, ranges)
    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            old[signum] = signal.signal(signum, runner.on_signal)
    code = 1  # what an error raised out of the loop exits with
    try:
        code = runner.loop()
        if code == 0 and on_complete == "wait":
            trainer.close()  # left the job: holds nothing while it waits
            log.info("job %s ended; waiting for SIGTERM (--on-complete wait)", job)
            try:
                while True:
                    time.sleep(3600)
            except SystemExit:  # runner.on_signal, outside any command
                code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        try:
            trainer.close()
        finally:
            for name in ("taskq.trainer", "taskq.sharded"):
                logging.getLogger(name).removeFilter(down)
            for restored, handler in old.items():
                signal.signal(restored, handler)
            log.info("%s", runner.summary(code))
    if code:
        sys.exit(code)
