"""A trainer's heartbeat: the part the heartbeat thread and helper process see.

``Beats`` is the part of ``Trainer`` (trainer/core.py) behind ``heartbeat.HeartbeatHost``:
the heartbeat thread (heartbeat.py) and the helper process's reader see only it, never
the trainer. It owns the thread or helper, the heartbeat's own connection, the count of
beats and the loop's data wait to send (``inputwait.InputBeat``); it builds a beat's
ARGV from the session and the lease book, applies an answer (revocations, pass, state,
drain, a rejoin), tells the helper what is held whenever that changes, and marks what
is held at risk while out of contact.

Data flow: heartbeat.py -> trainer/beats.py -> trainer/book.py / trainer/session.py;
trainer/beats.py -> protocol.py -> heartbeat script -> Redis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from taskq import errors
from taskq.admin.client import Client
from taskq.engine.contract import Code
from taskq.engine.transport import Scripts
from taskq.inputwait import InputBeat, InputMeter
from taskq.trainer import protocol
from taskq.trainer.book import LeaseBook
from taskq.trainer.heartbeat import HelperHeartbeat, start_thread
from taskq.trainer.progress_sender import ProgressSender
from taskq.trainer.protocol import HeartbeatReply, Registered, Wire
from taskq.trainer.session import JobView, Session

log = logging.getLogger("taskq.trainer")


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


class Beats:
    """A trainer as the heartbeat sees it (``heartbeat.HeartbeatHost``)."""

    def __init__(
        self,
        client: Client,
        wire: Wire,
        session: Session,
        book: LeaseBook,
        view: JobView,
        progress: ProgressSender,
        input_meter: InputMeter,
    ) -> None:
        self.job = session.job
        self._client = client
        self._wire = wire
        self._session = session
        self._book = book
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
                self._client.prefix,
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
        last_reply_no, pairs = self._book.beat_state()
        return protocol.heartbeat_args(
            session.job_incarnation, session.worker_id, incarnation, secret, last_reply_no, pairs
        )

    def changed(self) -> None:
        """Tell the helper heartbeat process what this trainer holds now."""
        if self.helper is not None:
            self.helper.push(self.args())

    def revoke_all(self) -> None:
        """Everything held is lost (the job ended, or this worker was declared lost)."""
        self._book.revoke_all()
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
        reply = self._wire.heartbeat(self._scripts or self._client.scripts, args)
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
        out = self._book.revoke_listed(reply.revoked, dict(pairs))
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
            for task in self._book.held():
                if not task.at_risk.is_set():
                    log.warning(
                        "job %s: out of contact with Redis for > %.1fs; task %s at risk",
                        self.job,
                        session.ttl_s,
                        task.id,
                    )
                    task.at_risk.set()
        return session.ended is None and not session.closed
