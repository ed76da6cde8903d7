"""Heartbeats from a helper process, for trainers whose steps hold the GIL.

``Trainer(heartbeat="process")`` starts one: it heartbeats on the trainer's behalf
whatever the trainer's threads are doing, and dies with the trainer.

Also the heartbeat thread's loop and what any heartbeat answer does to the trainer.

Data flow: trainer.py -> heartbeat.py (pipe) -> helper process -> heartbeat script -> Redis.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from . import errors
from .connection import make_redis, translate
from .keys import JobKeys
from .scripts import Code, Scripts

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("taskq.trainer")


def apply_answer(t: Trainer, code: int, revoked: list[int], info: list[Any] | None,
                 pairs: list[tuple[int, int]], incarnation: str) -> list[int]:
    """Act on a heartbeat's answer (from the trainer's process or its helper process).

    Answers may land after newer lease replies (see ``Trainer._note_info``): only the
    listed leases are revoked, and pass, generation and state never move backwards.

    Args:
        t: the trainer.
        code: the heartbeat script's code.
        revoked: ids of listed leases the server no longer counts as this worker's.
        info: (pass, gen, state, reason) of the job, when the answer carries it.
        pairs: the (task, token) pairs the heartbeat listed.
        incarnation: the worker incarnation the heartbeat was sent under.

    Returns:
        The ids of held tasks now marked revoked.
    """
    t._last_contact = time.monotonic()
    if code == Code.JOB_NOT_FOUND:
        t._ended = errors.JobNotFound
        t._mark_all_revoked()
        return [tid for tid, _ in pairs]
    if code == Code.REREGISTER:
        t._rejoin(incarnation)
        return [tid for tid, _ in pairs]
    if code < 0:
        return []
    if info is not None:
        t._note_info(info)
    tokens = dict(pairs)
    out = []
    with t._lock:
        for tid in revoked:
            task = t._held.get(tid)
            # only the lease that was listed: the id may be held again under a new token
            if task is not None and task.token == tokens.get(tid):
                task.revoked.set()
                t._forget(task)
                out.append(tid)
        for task in t._held.values():
            if task._at_risk is not None:  # never set if never made
                task._at_risk.clear()
    if out:
        log.info("job %s: lease(s) revoked by the server: %s", t.job, out)
        t._changed()
    if code == Code.DRAINING:
        t._draining = True
    if t._state == "cancelled":
        t._mark_all_revoked()
    return out


def check_contact(t: Trainer) -> None:
    """Set ``at_risk`` on everything ``t`` holds while it has been out of contact for
    longer than its ttl (its own monotonic clock; the server's answer on reconnect
    decides)."""
    if time.monotonic() - t._last_contact > t.ttl_s:
        with t._lock:
            held = list(t._held.values())
        for task in held:
            if not task.at_risk.is_set():
                log.warning("job %s: out of contact with Redis for > %.1fs; task %s at risk",
                            t.job, t.ttl_s, task.id)
                task.at_risk.set()


def heartbeat_state(t: Trainer) -> tuple[list[Any], list[tuple[int, int]]]:
    """(heartbeat ARGV, the (task, token) pairs it lists), taken together under the lock."""
    with t._lock:
        pairs = [(task.id, task.token) for task in t._held.values()]
        args: list[Any] = [t.job_incarnation, t.worker_id, t.incarnation, t._last_reply_no,
                           len(pairs)]
    for tid, tok in pairs:
        args += [tid, tok]
    return args, pairs


def send_heartbeat(t: Trainer, scripts: Scripts) -> list[int]:
    """One heartbeat of ``t`` from this process (``Trainer.heartbeat``), its answer applied.

    Returns:
        The ids of held tasks the server revoked.

    Raises:
        ConnectionLost: Redis could not be reached.
    """
    args, pairs = heartbeat_state(t)
    with translate(t.client.url):
        reply = scripts.call("heartbeat", t.keys.all, args)
    t.heartbeats_sent += 1
    return apply_answer(t, int(reply[0]), [int(x) for x in reply[1]] if len(reply) > 1 else [],
                        reply[2] if len(reply) > 2 else None, pairs, args[2])


def _beat(t: Trainer) -> bool:
    """One beat of the heartbeat thread; False once there is nothing to beat for."""
    try:
        t.heartbeat()
    except errors.ConnectionLost:
        pass
    except Exception:  # the thread must survive anything transient
        log.exception("heartbeat failed")
    check_contact(t)
    return t._ended is None and not t._closed


def heartbeat_loop(ref: weakref.ref[Trainer], stop: threading.Event, interval: float) -> None:
    """The heartbeat thread: one beat per interval on a fixed schedule (a slow call is not
    added on top) until ``stop`` is set, the trainer is gone or has nothing to beat for.

    Args:
        ref: the trainer, weakly: this thread must not keep a dropped Trainer alive.
        stop: set by ``close()`` or by the trainer's finalizer.
        interval: seconds between beats.
    """
    next_due = time.monotonic() + interval
    while not stop.wait(max(0.0, next_due - time.monotonic())):
        next_due = max(next_due + interval, time.monotonic())
        trainer = ref()
        if trainer is None or not _beat(trainer):
            return
        del trainer


class HelperHeartbeat:
    """Heartbeats from a helper process (``Trainer(heartbeat="process")``).

    The helper runs ``python -c 'from taskq.heartbeat import helper_main; ...'`` and talks
    JSON lines over its stdin/stdout: the trainer pushes its held pairs and last reply
    number whenever they change; the helper heartbeats every interval with the latest
    state, whatever this process is doing (a step holding the GIL does not delay it), and
    sends back each answer, applied here by a reader thread. It exits when its stdin
    closes, when its parent changes (``getppid``), or on ``PR_SET_PDEATHSIG`` (Linux):
    nothing of a SIGKILLed trainer keeps its leases alive. It holds the trainer weakly, so
    a Trainer dropped without ``close()`` is collected and its finalizer stops the helper.
    """

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = weakref.ref(trainer)
        self.job = trainer.job
        self._wlock = threading.Lock()
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from taskq.heartbeat import helper_main; helper_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin = self.proc.stdin
        self._stdout = self.proc.stdout
        self._send({"url": trainer._raw_url, "prefix": trainer.client.prefix,
                    "job": trainer.job, "interval": trainer.heartbeat_interval,
                    "ttl": trainer.ttl_s, "ppid": os.getpid()})
        self.push(heartbeat_state(trainer)[0])
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"taskq-heartbeat-reader-{trainer.job}")
        self._reader.start()
        # the helper needs a moment to start Python; do not lease before it heartbeats
        if not self._ready.wait(15.0):
            log.warning("job %s: the heartbeat helper process has not answered yet", trainer.job)

    def _send(self, msg: dict[str, Any]) -> None:
        with self._wlock:
            try:
                self._stdin.write((json.dumps(msg) + "\n").encode())
                self._stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass

    def push(self, args: list[Any]) -> None:
        """Send the trainer's current heartbeat arguments to the helper.

        Args:
            args: the heartbeat script's ARGV (``heartbeat_state``).
        """
        self._send({"args": args})

    def _read_loop(self) -> None:
        for line in self._stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            self._ready.set()
            t = self._trainer()
            if t is None:
                break
            if "error" not in msg:
                self._apply(t, msg)
            check_contact(t)
            del t
        t = self._trainer()
        if t is not None and not t._closed:
            log.error("job %s: the heartbeat helper process exited (code %s)", self.job,
                      self.proc.poll())

    @staticmethod
    def _apply(t: Trainer, msg: dict[str, Any]) -> None:
        args = msg["args"]
        pairs = [(int(args[5 + 2 * k]), int(args[6 + 2 * k])) for k in range(int(args[4]))]
        t.heartbeats_sent += 1
        try:
            apply_answer(t, int(msg["code"]), msg["revoked"], msg.get("info"), pairs, args[2])
        except Exception:  # the reader must survive anything transient
            log.exception("heartbeat reply failed")

    def stop(self, wait: bool = True) -> None:
        """Close the helper's stdin (it exits at once) and reap it.

        Args:
            wait: wait up to 2 s for it to exit, then kill it; False (the garbage
                collector's finalizer) only closes its stdin.
        """
        with self._wlock:
            try:
                self._stdin.close()
            except OSError:
                pass
        if not wait:
            return
        try:
            self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_thread(t: Trainer, stop: threading.Event) -> tuple[threading.Thread, Scripts | None]:
    """Start the heartbeat thread of ``t`` (a daemon: it dies with the process).

    Args:
        t: the trainer, held weakly by the thread (a dropped Trainer is collected).
        stop: ends the thread when set.

    Returns:
        The thread, and the scripts of its own connection (None with a given client:
        the client's connection is used).
    """
    scripts = None
    if t._raw_url is not None:
        # its own connection, failing fast: a heartbeat stuck in retries for longer than
        # the ttl would be worse than one missed beat
        hb_redis, _ = make_redis(t._raw_url, retries=1,
                                 socket_timeout=max(0.5, min(t.ttl_s / 2, 5.0)))
        scripts = Scripts(hb_redis)
    thread = threading.Thread(target=heartbeat_loop, name=f"taskq-heartbeat-{t.job}",
                              args=(weakref.ref(t), stop, t.heartbeat_interval), daemon=True)
    thread.start()
    return thread, scripts


def stop_dropped(job: str, stop: threading.Event, helper: HelperHeartbeat | None) -> None:
    """The finalizer of a Trainer dropped without ``close()``: stop its heartbeats, so what
    it held goes back after its ttl. No Redis call: this runs inside the garbage collector.

    Args:
        job: the trainer's job (logged).
        stop: the trainer's stop event (ends its heartbeat thread).
        helper: its helper process, if any (its stdin is closed: it exits).
    """
    stop.set()
    if helper is not None:
        helper.stop(wait=False)
    try:
        log.warning("job %s: a Trainer was dropped without close(); its leases go back "
                    "after its ttl", job)
    except Exception:  # logging torn down at interpreter exit
        pass


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (best effort elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def helper_main() -> None:
    """The helper heartbeat process (see ``HelperHeartbeat``)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer, which leaves
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fd = sys.stdin.fileno()
    out = sys.stdout
    buf = b""

    def read_lines(timeout: float) -> list[dict[str, Any]] | None:
        nonlocal buf
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return []
        data = os.read(fd, 65536)
        if not data:
            return None
        buf += data
        *lines, buf = buf.split(b"\n")
        return [json.loads(x) for x in lines if x.strip()]

    first: list[dict[str, Any]] | None = []
    while first == []:
        first = read_lines(5.0)
    if not first:
        return
    conf, pending = first[0], first[1:]
    ppid = int(conf["ppid"])
    if os.getppid() != ppid:
        return
    interval = float(conf["interval"])
    redis_client, masked = make_redis(conf["url"], retries=1,
                                      socket_timeout=max(0.5, min(float(conf["ttl"]) / 2, 5.0)))
    scripts = Scripts(redis_client)
    keys = JobKeys(conf["job"], conf["prefix"]).all
    args: list[Any] | None = None
    for msg in pending:
        args = msg.get("args", args)
    next_due = time.monotonic()  # the first beat at once: the trainer waits for it
    while True:
        msgs = read_lines(max(0.0, next_due - time.monotonic()))
        if msgs is None or os.getppid() != ppid:
            return
        for msg in msgs:
            args = msg.get("args", args)
        if time.monotonic() < next_due or args is None:
            continue
        next_due = max(next_due + interval, time.monotonic())
        try:
            with translate(masked):
                reply = scripts.call("heartbeat", keys, args)
            answer: dict[str, Any] = {
                "code": int(reply[0]), "revoked": [int(x) for x in reply[1]] if len(reply) > 1
                else [], "info": reply[2] if len(reply) > 2 else None, "args": args}
        except errors.TaskqError as e:
            answer = {"error": str(e)}
        try:
            out.write(json.dumps(answer) + "\n")
            out.flush()
        except (BrokenPipeError, OSError):
            return
