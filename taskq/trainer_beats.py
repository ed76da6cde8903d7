"""A trainer as the heartbeat sees it (``heartbeat.HeartbeatHost``).

``TrainerBeats`` is the part of ``Trainer`` (trainer.py) the heartbeat thread and the
helper process's reader call: send one heartbeat, apply an answer (revocations, pass,
state, drain), and mark what is held at risk while out of contact.

Data flow: heartbeat.py -> trainer_beats.py -> protocol.py -> heartbeat script -> Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from . import errors, protocol
from .inputwait import InputBeat, InputMeter
from .protocol import HeartbeatReply
from .scripts import Code
from .trainer_calls import TrainerCalls

log = logging.getLogger("taskq.trainer")


class TrainerBeats(TrainerCalls):
    """The heartbeat's view of a ``Trainer``; not used on its own."""

    #: the training loop's data wait and steps (inputwait.py): timed by the iterator
    #: (trainer_iter.py) or a ``taskq.torch.DataLoader``, sent with a heartbeat at most
    #: every ``inputwait.SEND_EVERY_S``
    input_meter: InputMeter
    _input_beat: InputBeat

    def heartbeat(self) -> list[int]:
        """Send one heartbeat now (what the heartbeat thread does every interval).

        Returns:
            The ids of held tasks the server revoked (their ``revoked`` is set).

        Raises:
            ConnectionLost: Redis could not be reached (``RedisOutOfMemory``: it is full).
        """
        args = self._beat_args()
        # the loop's data wait since the last answered beat: one more argument, no call
        waited = self._input_beat.arg()
        if waited is not None:
            args.append(waited[0])
        reply = self._wire.heartbeat(self._hb_scripts or self.client.scripts, args)
        if waited is not None and reply.code in (Code.OK, Code.DRAINING):
            self._input_beat.sent(waited[1])
        revoked = self.apply_heartbeat(reply, args)
        self.flush_progress()
        return revoked

    def apply_heartbeat(self, reply: HeartbeatReply, args: Sequence[Any]) -> list[int]:
        """Act on the answer to a heartbeat sent with ARGV ``args`` (by ``heartbeat()`` or
        the helper process); for ``taskq.heartbeat``, not needed by trainer code.

        Answers may land after newer lease replies (see ``_note_info``): only the leases
        ``args`` listed are revoked, and pass, generation and state never move backwards.

        Args:
            reply: the decoded answer.
            args: the heartbeat's ARGV (``protocol.heartbeat_args``).

        Returns:
            The ids of held tasks now marked revoked.
        """
        self.heartbeats_sent += 1
        self._last_contact = time.monotonic()
        pairs = protocol.heartbeat_pairs(args)
        if reply.code == Code.JOB_NOT_FOUND:
            self._ended = errors.JobNotFound
            self._mark_all_revoked()
            return [tid for tid, _ in pairs]
        if reply.code == Code.REREGISTER:
            self._rejoin(protocol.heartbeat_incarnation(args))
            return [tid for tid, _ in pairs]
        if reply.code < 0:
            return []
        if reply.info is not None:
            self._note_info(reply.info)
        tokens = dict(pairs)
        out = []
        with self._lock:
            for tid in reply.revoked:
                task = self._held.get(tid)
                # only the lease that was listed: the id may be held again under a new token
                if task is not None and task.token == tokens.get(tid):
                    task.revoked.set()
                    self._forget(task)
                    out.append(tid)
            for task in self._held.values():
                if task._at_risk is not None:  # never set if never made
                    task._at_risk.clear()
        if out:
            log.info("job %s: lease(s) revoked by the server: %s", self.job, out)
            self._changed()
        if reply.code == Code.DRAINING:
            self._draining = True
        if self._state == "cancelled":
            self._mark_all_revoked()
        return out

    def keep_beating(self) -> bool:
        """After each beat, answered or not: set ``at_risk`` on everything held while out
        of contact for longer than the ttl (this process's monotonic clock; the server's
        answer on reconnect decides); for ``taskq.heartbeat``.

        Returns:
            False once there is nothing to beat for (closed, or the job is gone).
        """
        if time.monotonic() - self._last_contact > self.ttl_s:
            with self._lock:
                held = list(self._held.values())
            for task in held:
                if not task.at_risk.is_set():
                    log.warning(
                        "job %s: out of contact with Redis for > %.1fs; task %s at risk",
                        self.job,
                        self.ttl_s,
                        task.id,
                    )
                    task.at_risk.set()
        return self._ended is None and not self._closed
