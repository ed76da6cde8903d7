"""``taskq work JOB -- CMD ARGS...``: a trainer for any language, one CMD run per task.

Each task's JSON goes to CMD on stdin (and in ``TASKQ_TASK`` when under 64 KiB), with
``TASKQ_JOB``, ``TASKQ_TASK_ID``, ``TASKQ_PASS``, ``TASKQ_TOKEN`` and ``TASKQ_ATTEMPT``.
Exit 0 acks (in the same call that leases the next task); a non-zero exit fails the task
with the tail of CMD's stderr. Heartbeats go on while CMD runs; a revoked lease
terminates CMD (SIGTERM, then SIGKILL after ``--grace``). SIGTERM or SIGINT to
``taskq work`` is passed to CMD, and whatever CMD's exit code, its lease is released and
the worker leaves; ``taskq work`` then exits 128 + the signal number.

Data flow: any program <- cli/work.py -> taskq.Trainer -> Redis.
"""

from __future__ import annotations

import json
import logging
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
from taskq.connection import resolve_url

log = logging.getLogger("taskq.work")

#: ``TASKQ_TASK`` carries the task JSON only below this size (environment limits).
ENV_TASK_MAX = 64 * 1024
#: Bytes of CMD's stderr kept as the failure message.
STDERR_TAIL = 2000


class _Runner:
    """Runs CMD for tasks of one trainer and turns signals into a graceful leave."""

    def __init__(self, trainer: taskq.Trainer, cmd: list[str], grace: float) -> None:
        self.trainer = trainer
        self.cmd = cmd
        self.grace = grace
        self.signum: int | None = None
        self.child: subprocess.Popen[bytes] | None = None
        self.in_child = False

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        if not self.in_child:
            # inside the trainer's own calls (leasing, waiting): leave at once
            raise SystemExit(128 + signum)
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def run_one(self, task: taskq.Task) -> tuple[int | None, str]:
        """Run CMD for ``task``. Returns (exit code or None if it could not start, stderr
        tail)."""
        payload = json.dumps(task.as_dict()).encode()
        env = dict(os.environ)
        env.update(TASKQ_JOB=task.job, TASKQ_TASK_ID=str(task.id), TASKQ_PASS=str(task.pass_no),
                   TASKQ_TOKEN=str(task.token), TASKQ_ATTEMPT=str(task.attempt))
        env.pop("TASKQ_TASK", None)
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
                self.child = subprocess.Popen(self.cmd, stdin=subprocess.PIPE,
                                              stderr=subprocess.PIPE, env=env)
            except OSError as e:
                return None, f"could not start {self.cmd[0]!r}: {e}"
            child = self.child
            if self.signum is not None:  # a signal came while it was starting
                child.send_signal(self.signum)
            readers = [threading.Thread(target=pump_stderr, args=(child.stderr,), daemon=True),
                       threading.Thread(target=feed_stdin, args=(child.stdin,), daemon=True)]
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
                    child.terminate()
                    stopping_since = time.monotonic()
                elif self.signum is not None and stopping_since is None:
                    stopping_since = time.monotonic()
                if stopping_since is not None and time.monotonic() - stopping_since > self.grace:
                    child.kill()
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
                log.info("task %s: signal %d; releasing (command exit %s)", task.id,
                         self.signum, rc)
                self._end(trainer.release, task)
                return 128 + self.signum
            if task.revoked.is_set():
                log.warning("task %s: lease revoked (command exit %s); not counted", task.id, rc)
            elif rc == 0:
                log.info("task %s (pass %d): done", task.id, task.pass_no)
            else:
                why = f"exit {rc}" if rc is not None else "not started"
                if rc is not None and rc < 0:
                    why = f"killed by signal {-rc}"
                # the server keeps 500 characters of an error: keep the end of the tail
                message = f"{why}: {tail[-(490 - len(why)):]}" if tail else why
                log.warning("task %s: failed (%s)", task.id, why)
                self._end(trainer.fail, task, message)
        return 0

    @staticmethod
    def _end(action: Any, task: taskq.Task, *args: Any) -> None:
        try:
            action(task, *args)
        except taskq.LeaseLost as e:
            log.warning("%s", e)


def _redis_url(url: str | None) -> tuple[str | None, str | None]:
    """The URL and key prefix: this command's --url, else the group's, else the env."""
    root = click.get_current_context().find_root()
    obj = root.obj
    prefix = getattr(obj, "prefix", None) or root.params.get("prefix")
    return url or getattr(obj, "url", None) or root.params.get("url"), prefix


@click.command("work", context_settings={"ignore_unknown_options": True})
@click.argument("job")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD [ARGS]...")
@click.option("--prefetch", type=click.IntRange(min=0), default=0, show_default=True,
              help="Reserved tasks kept ahead of the current one (others may steal them).")
@click.option("--worker-id", metavar="ID", help="Worker id (default host:pid:random).")
@click.option("--worker-ttl", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="This worker's own liveness ttl (default: the job's worker_ttl).")
@click.option("--heartbeat", type=click.Choice(["thread", "process"]), default="thread",
              show_default=True, help="Send heartbeats from a thread or a helper process.")
@click.option("--grace", type=click.FloatRange(min=0), default=10.0, show_default=True,
              metavar="SECONDS",
              help="After a revoke or a signal, SIGKILL the command if it has not exited.")
@click.option("--url", envvar="TASKQ_REDIS_URL", metavar="URL",
              help="Redis URL (default: the group's --url, env TASKQ_REDIS_URL).")
def work(job: str, cmd: tuple[str, ...], prefetch: int, worker_id: str | None,
         worker_ttl: float | None, heartbeat: str, grace: float, url: str | None) -> None:
    """Run CMD once per task of JOB, in any language.

    The task JSON ({"job", "id", "pass", "token", "attempt", "chunks"}) is on CMD's stdin
    and, under 64 KiB, in TASKQ_TASK; TASKQ_JOB, TASKQ_TASK_ID, TASKQ_PASS, TASKQ_TOKEN and
    TASKQ_ATTEMPT are set. Exit 0 acks the task; another exit fails it with the tail of
    CMD's stderr. A revoked lease terminates CMD. SIGTERM/SIGINT are passed to CMD and
    its lease is released whatever its exit code. Ends when the job completes.

    Example: taskq work mnist -- python train_chunk.py --lr 0.1
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    trainer = taskq.Trainer(job, url=resolved, client=client, worker_id=worker_id,
                            prefetch=prefetch, worker_ttl=worker_ttl, heartbeat=heartbeat,
                            handle_signals=False)
    runner = _Runner(trainer, argv, grace)
    old: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            old[signum] = signal.signal(signum, runner.on_signal)
    code = 0
    try:
        code = runner.loop()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        try:
            trainer.close()
        finally:
            for restored, handler in old.items():
                signal.signal(restored, handler)
    if code:
        sys.exit(code)
