"""Heartbeats of a trainer: its daemon thread, or a helper process for GIL-bound steps,
and ``Heartbeat``, the worker's part they see.

``Trainer(heartbeat="process")`` starts a helper process: it heartbeats on the trainer's
behalf whatever the trainer's threads are doing, and dies with the trainer. Both see the
trainer only through ``HeartbeatHost``, which ``Heartbeat`` is: it owns the thread or helper,
the heartbeat's own connection, the count of beats and the loop's data wait to send
(``inputwait.InputBeat``); it builds a beat's ARGV from the session and the held leases,
applies an answer (revocations, pass, state, drain, a rejoin), tells the helper what is
held whenever that changes, and marks what is held at risk while out of contact. The
wire format is ``protocol.py``'s.

Data flow: worker.py -> heartbeat.py (``Heartbeat``; thread, or pipe -> helper process) ->
leases.py / session.py; -> protocol.py -> heartbeat script -> Redis.
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
from collections.abc import Sequence
from typing import Any, Protocol

from taskq import errors
from taskq.engine.connection import make_redis
from taskq.engine.contract import Code
from taskq.engine.transport import Scripts
from taskq.inputwait import InputBeat, InputMeter
from taskq.keys import JobKeys
from taskq.trainer import protocol
from taskq.trainer.leases import HeldLeases
from taskq.trainer.progress import ProgressSender
from taskq.trainer.protocol import HeartbeatReply, Registered, call_heartbeat
from taskq.trainer.session import JobView, Session

log = logging.getLogger("taskq.heartbeat")


class HeartbeatHost(Protocol):
    """What the heartbeat thread and the helper process's reader need of a trainer."""

    job: str

    def heartbeat(self) -> list[int]:
        """Send one heartbeat from this process and apply its answer.

        Raises:
            ConnectionLost: Redis could not serve the call.
        """
        ...

    def apply_heartbeat(self, reply: HeartbeatReply, args: Sequence[Any]) -> list[int]:
        """Apply an answer to a heartbeat sent elsewhere (the helper process) with ARGV
        ``args``; returns the ids of held tasks now revoked."""
        ...

    def keep_beating(self) -> bool:
        """Called after every beat, answered or not: mark what is held at risk while out of
        contact for longer than the ttl; False once there is nothing to beat for."""
        ...


class _Health:
    """A heartbeat's state, logged once per change (ok -> failing: the error in one line;
    failing -> ok: "recovered"), not once per failing beat."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.failing = ""  # the kind of error the last beat failed with; "" = ok

    def ok(self) -> None:
        if self.failing:
            log.warning("job %s: heartbeat recovered", self.job)
            self.failing = ""

    def failed(self, kind: str, text: str, traceback: bool = False) -> None:
        if kind != self.failing:
            log.warning("job %s: heartbeat failing: %s", self.job, text, exc_info=traceback)
            self.failing = kind


def _beat(host: HeartbeatHost, health: _Health) -> bool:
    """One beat of the heartbeat thread; False once there is nothing to beat for."""
    try:
        host.heartbeat()
        health.ok()
    except errors.TaskqError as e:
        health.failed(type(e).__name__, f"{type(e).__name__}: {e}")
    except Exception as e:  # the thread must survive anything; a bug shows its traceback once
        health.failed(type(e).__name__, f"{type(e).__name__}: {e}", traceback=True)
    return host.keep_beating()


def heartbeat_loop(ref: weakref.ref[HeartbeatHost], stop: threading.Event, interval: float) -> None:
    """The heartbeat thread: one beat per interval on a fixed schedule (a slow call is not
    added on top) until ``stop`` is set, the trainer is gone or has nothing to beat for.

    Args:
        ref: the trainer, weakly: this thread must not keep a dropped Trainer alive.
        stop: set by ``close()`` or by the trainer's finalizer.
        interval: seconds between beats.
    """
    host = ref()
    if host is None:
        return
    health = _Health(host.job)
    del host
    next_due = time.monotonic() + interval
    while not stop.wait(max(0.0, next_due - time.monotonic())):
        next_due = max(next_due + interval, time.monotonic())
        host = ref()
        if host is None or not _beat(host, health):
            return
        del host


class HelperHeartbeat:
    """Heartbeats from a helper process (``Trainer(heartbeat="process")``).

    The helper runs ``python -c 'from taskq.trainer.heartbeat import helper_main; ...'`` and talks
    JSON lines over its stdin/stdout: the trainer pushes its held pairs and last reply
    number whenever they change; the helper heartbeats every interval with the latest
    state, whatever this process is doing (a step holding the GIL does not delay it), and
    sends back each answer, applied here by a reader thread. It exits when its stdin
    closes, when its parent changes (``getppid``), or on ``PR_SET_PDEATHSIG`` (Linux):
    nothing of a SIGKILLed trainer keeps its leases alive. It holds the trainer weakly, so
    a Trainer dropped without ``close()`` is collected and its finalizer stops the helper.
    """

    def __init__(
        self,
        host: HeartbeatHost,
        url: str,
        prefix: str,
        interval: float,
        ttl_s: float,
        args: list[Any],
    ) -> None:
        """Start the helper and wait (up to 15 s) for its first beat.

        Args:
            host: the trainer (held weakly).
            url: the raw Redis URL (the helper opens its own connection).
            prefix: the key prefix.
            interval: seconds between beats.
            ttl_s: the worker's ttl (bounds the helper's socket timeout).
            args: the first heartbeat's ARGV (``protocol.heartbeat_args``).
        """
        self._host = weakref.ref(host)
        self.job = host.job
        self._health = _Health(host.job)
        self._wlock = threading.Lock()
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from taskq.trainer.heartbeat import helper_main; helper_main()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdin = self.proc.stdin
        self._stdout = self.proc.stdout
        self._send(
            {
                "url": url,
                "prefix": prefix,
                "job": host.job,
                "interval": interval,
                "ttl": ttl_s,
                "ppid": os.getpid(),
            }
        )
        self.push(args)
        self._ready = threading.Event()
        self._reader = threading.Thread(
            target=self._read_loop, daemon=True, name=f"taskq-heartbeat-reader-{host.job}"
        )
        self._reader.start()
        # the helper needs a moment to start Python; do not lease before it heartbeats
        if not self._ready.wait(15.0):
            log.warning("job %s: the heartbeat helper process has not answered yet", host.job)

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
            host = self._host()
            if host is None:
                break
            self._apply(host, msg)
            host.keep_beating()
            del host
        host = self._host()
        if host is not None and host.keep_beating():
            log.error(
                "job %s: the heartbeat helper process exited (code %s)", self.job, self.proc.poll()
            )

    def _apply(self, host: HeartbeatHost, msg: dict[str, Any]) -> None:
        """One line from the helper: the raw reply to the ARGV it sent, or its error."""
        if "error" in msg:
            kind = str(msg.get("kind", "TaskqError"))
            self._health.failed(kind, f"{kind}: {msg['error']}")
            return
        try:
            host.apply_heartbeat(HeartbeatReply.decode(msg["reply"]), msg["args"])
            self._health.ok()
        except Exception as e:  # the reader must survive anything; a bug shows once
            self._health.failed(type(e).__name__, f"{type(e).__name__}: {e}", traceback=True)

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


def start_thread(
    host: HeartbeatHost, stop: threading.Event, url: str | None, interval: float, ttl_s: float
) -> tuple[threading.Thread, Scripts | None]:
    """Start the heartbeat thread of ``host`` (a daemon: it dies with the process).

    Args:
        host: the trainer, held weakly by the thread (a dropped Trainer is collected).
        stop: ends the thread when set.
        url: the raw Redis URL for a connection of its own; None: beat on the client's.
        interval: seconds between beats.
        ttl_s: the worker's ttl (bounds the connection's socket timeout).

    Returns:
        The thread, and the scripts of its own connection (None without ``url``).
    """
    scripts = None
    if url is not None:
        # its own connection, failing fast: a heartbeat stuck in retries for longer than
        # the ttl would be worse than one missed beat
        hb_redis, _ = make_redis(url, retries=1, socket_timeout=max(0.5, min(ttl_s / 2, 5.0)))
        scripts = Scripts(hb_redis)
    thread = threading.Thread(
        target=heartbeat_loop,
        name=f"taskq-heartbeat-{host.job}",
        args=(weakref.ref(host), stop, interval),
        daemon=True,
    )
    thread.start()
    return thread, scripts


def heartbeat_mode(heartbeat: bool | str, raw_url: str | None) -> str | bool:
    """``Trainer(heartbeat=)`` checked: ``"thread"`` (True too), ``"process"`` (needs
    the raw URL: the helper opens its own connection) or False."""
    if heartbeat is True:
        heartbeat = "thread"
    if heartbeat not in (False, "thread", "process"):
        raise errors.InvalidInput(
            f"heartbeat must be 'thread', 'process' or False, not {heartbeat!r}"
        )
    if heartbeat == "process" and raw_url is None:
        raise errors.InvalidInput(
            "heartbeat='process' needs url= (the helper process opens its own connection)"
        )
    return heartbeat


class Heartbeat:
    """A trainer as the heartbeat sees it (``heartbeat.HeartbeatHost``)."""

    def __init__(
        self,
        session: Session,
        leases: HeldLeases,
        view: JobView,
        progress: ProgressSender,
        input_meter: InputMeter,
    ) -> None:
        self.job = session.job
        self._connection = session.connection
        self._session = session
        self._leases = leases
        self._view = view
        self._progress = progress
        #: the training loop's data wait and steps (inputwait.py): timed by the iterator
        #: (trainer/iteration.py) or a ``taskq.torch.DataLoader``, sent with a heartbeat at
        #: most every ``inputwait.SEND_EVERY_S``
        self._input_beat = InputBeat.of(input_meter)
        self.sent = 0
        self.helper: HelperHeartbeat | None = None
        self.thread: threading.Thread | None = None
        self._scripts: Scripts | None = None

    def start(self, mode: bool | str, raw_url: str | None) -> None:
        """Start the heartbeat: ``"thread"``, ``"process"`` (the helper) or none."""
        session = self._session
        if mode == "thread":
            self.thread, self._scripts = start_thread(
                self, session.stop, raw_url, session.heartbeat_interval, session.ttl_s
            )
        elif mode == "process":
            assert raw_url is not None
            self.helper = HelperHeartbeat(
                self,
                raw_url,
                self._connection.prefix,
                session.heartbeat_interval,
                session.ttl_s,
                self.args(),
            )

    def stop(self) -> None:
        """End the thread (a beat in flight is bounded by its socket timeout) or the
        helper process."""
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.5, min(self._session.ttl_s / 2, 5.0)) + 0.5)
        if self.helper is not None:
            self.helper.stop()

    def args(self) -> list[Any]:
        """The next heartbeat's ARGV: the held (task, token) pairs, the last reply's call
        number and the incarnation's secret."""
        session = self._session
        incarnation, secret = session.creds
        last_reply_no, pairs = self._leases.beat_state()
        return protocol.heartbeat_args(
            session.job_incarnation, session.worker_id, incarnation, secret, last_reply_no, pairs
        )

    def changed(self) -> None:
        """Tell the helper heartbeat process what this trainer holds now."""
        if self.helper is not None:
            self.helper.push(self.args())

    def revoke_all(self) -> None:
        """Everything held is lost (the job ended, or this worker was declared lost)."""
        self._leases.revoke_all()
        self.changed()

    def rejoin(self, incarnation: str) -> None:
        """Join again once ``incarnation`` was declared lost (``Session.rejoin``)."""
        self._session.rejoin(incarnation, self.revoke_all, self._joined)

    def _joined(self, reg: Registered) -> None:
        self._view.note(reg.info)
        self.changed()

    # -- heartbeat.HeartbeatHost ----------------------------------------------------------
    def heartbeat(self) -> list[int]:
        """``Trainer.heartbeat``: send one now and apply its answer."""
        args = self.args()
        # the loop's data wait since the last answered beat: one more argument, no call
        waited = self._input_beat.arg()
        if waited is not None:
            args.append(waited[0])
        conn = self._connection
        reply = HeartbeatReply.decode(
            call_heartbeat(self._scripts or conn.scripts, conn.url, self._session.keys.script, args)
        )
        if waited is not None and reply.code in (Code.OK, Code.DRAINING):
            self._input_beat.sent(waited[1])
        revoked = self.apply_heartbeat(reply, args)
        self._progress.flush()
        return revoked

    def apply_heartbeat(self, reply: HeartbeatReply, args: Sequence[Any]) -> list[int]:
        """``Trainer.apply_heartbeat``: act on the answer to a beat sent with ``args``.

        Answers may land after newer lease replies (see ``JobView``): only the leases
        ``args`` listed are revoked, and pass, generation and state never move backwards.
        """
        self.sent += 1
        self._session.heard()
        pairs = protocol.heartbeat_pairs(args)
        if reply.code == Code.JOB_NOT_FOUND:
            self._session.gone()
            self.revoke_all()
            return [tid for tid, _ in pairs]
        if reply.code == Code.REREGISTER:
            self.rejoin(protocol.heartbeat_incarnation(args))
            return [tid for tid, _ in pairs]
        if reply.code < 0:
            return []
        if reply.info is not None:
            self._view.note(reply.info)
        out = self._leases.revoke_listed(reply.revoked, dict(pairs))
        if out:
            log.info("job %s: lease(s) revoked by the server: %s", self.job, out)
            self.changed()
        if reply.code == Code.DRAINING:
            self._view.drain()
        if self._view.state == "cancelled":
            self.revoke_all()
        return out

    def keep_beating(self) -> bool:
        """``Trainer.keep_beating``: after each beat, answered or not, set ``at_risk`` on
        everything held while out of contact for longer than the ttl (this process's
        monotonic clock; the server's answer on reconnect decides); False once there is
        nothing to beat for (closed, or the job is gone)."""
        session = self._session
        if time.monotonic() - session.last_contact > session.ttl_s:
            for task in self._leases.held():
                if not task.at_risk.is_set():
                    log.warning(
                        "job %s: out of contact with Redis for > %.1fs; task %s at risk",
                        self.job,
                        session.ttl_s,
                        task.id,
                    )
                    task.at_risk.set()
        return session.ended is None and not session.closed


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
        log.warning(
            "job %s: a Trainer was dropped without close(); its leases go back after its ttl", job
        )
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
    redis_client, masked = make_redis(
        conf["url"], retries=1, socket_timeout=max(0.5, min(float(conf["ttl"]) / 2, 5.0))
    )
    scripts = Scripts(redis_client)
    keys = JobKeys(conf["job"], conf["prefix"]).script
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
            answer: dict[str, Any] = {
                "reply": call_heartbeat(scripts, masked, keys, args),
                "args": args,
            }
        except errors.TaskqError as e:
            answer = {"error": str(e), "kind": type(e).__name__}
        try:
            out.write(json.dumps(answer) + "\n")
            out.flush()
        except (BrokenPipeError, OSError):
            return
