"""A trainer's held leases: the tasks it holds and has reserved, their tokens, the call
numbers in flight, and the revocations.

``HeldLeases`` is the part of ``Worker`` (trainer/worker.py) that knows what is held. A step's
reply (trainer/iteration.py's ``Calls``) is applied to it, a heartbeat's revocations
(trainer/heartbeat.py) strike from it, the iteration (trainer/iteration.py) takes the reserved
read-ahead from it; everything under its one lock. It also keeps the numbers of
the calls in flight: a heartbeat claims the replies up to ``last_reply_no`` (the server
revokes unlisted leases granted by calls up to it), so it stays below every call still
in flight (another thread's lease may be granted but not yet applied when this thread's
ack reply lands).

Data flow: trainer/iteration.py (step replies) / trainer/heartbeat.py (revocations) ->
trainer/leases.py -> trainer/heartbeat.py (the held pairs a heartbeat lists).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from threading import RLock

from taskq.engine.contract import Code
from taskq.models import Task
from taskq.trainer.protocol import Step

OK, STOLEN = int(Code.OK), int(Code.STOLEN)  # plain ints: an IntEnum member read is slow


class HeldLeases:
    """What one trainer holds (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = RLock()
        self._held: dict[int, Task] = {}
        self._reserved: deque[Task] = deque()
        self.call_no = 0
        self.last_reply_no = 0
        self._replied = 0
        self._in_flight: set[int] = set()
        self.stolen_from_me = 0

    # -- reading ------------------------------------------------------------------
    def held(self) -> list[Task]:
        """The tasks held (current and reserved)."""
        with self._lock:
            return list(self._held.values())

    def still_held(self, tasks: Sequence[Task]) -> list[Task]:
        """Those of ``tasks`` whose lease is still this one's."""
        with self._lock:
            return [t for t in tasks if self._held.get(t.id) is t]

    def reserved(self) -> list[Task]:
        with self._lock:
            return list(self._reserved)

    def beat_state(self) -> tuple[int, list[tuple[int, int]]]:
        """The heartbeat's part: the last reply it may claim and the held (id, token)
        pairs, taken together."""
        with self._lock:
            return self.last_reply_no, [(t.id, t.token) for t in self._held.values()]

    # -- a step's call ------------------------------------------------------------
    def begin(self) -> int:
        """Number a call about to be sent (in flight until ``applied`` or ``lost``)."""
        with self._lock:
            self.call_no += 1
            call_no = self.call_no
            self._in_flight.add(call_no)
            return call_no

    def lost(self, call_no: int) -> None:
        """The call's reply is lost: later replies may count."""
        with self._lock:
            self._in_flight.discard(call_no)
            self._note_replied()

    def applied(self, call_no: int, acks: list[Task], starts: list[Task], r: Step) -> None:
        """Apply a step's reply: acked tasks leave, started ones are started or stolen,
        granted ones (those with corrupt chunks too, until they are failed) are held."""
        with self._lock:
            self._in_flight.discard(call_no)
            if acks:
                self._forget_locked(acks)
            for i, res in enumerate(r.start_res):  # one per start sent (none: a bare code)
                t = starts[i]
                if res == STOLEN:
                    self._forget_locked((t,))
                    t.revoked.set()
                    self.stolen_from_me += 1
                elif res == OK:
                    t.started = True
            if r.info is not None:
                held = self._held
                for t in r.granted:
                    held[t.id] = t
                for t, _ in r.corrupt:
                    held[t.id] = t
                self._replied = max(self._replied, call_no)
            self._note_replied()

    def _note_replied(self) -> None:
        """(Under the lock.) The heartbeat may claim the replies up to the newest one
        applied, but not up to a call still in flight."""
        self.last_reply_no = (
            min(self._replied, min(self._in_flight) - 1) if self._in_flight else self._replied
        )

    # -- the iteration's read-ahead -------------------------------------------------
    def next_step(self, current: Task | None) -> tuple[list[Task], list[Task], int]:
        """The iterator's next call: ``current`` to ack if still held, the oldest reserved
        task to start, and how many stay reserved (read-ahead) after it."""
        with self._lock:
            acks = (
                [current] if current is not None and self._held.get(current.id) is current else []
            )
            reserved = self._reserved
            starts = [reserved.popleft()] if reserved else []
            return acks, starts, len(reserved)

    def place(self, got: Iterable[Task], current: Task | None) -> Task | None:
        """Keep the tasks a step granted: the first started one becomes current (when
        there is none), the others are reserved read-ahead; returns the current one."""
        with self._lock:
            for t in got:
                if t.started and current is None:
                    current = t
                else:
                    self._reserved.append(t)
        return current

    # -- striking -------------------------------------------------------------------
    def forget(self, tasks: Sequence[Task]) -> None:
        """Drop ``tasks`` (only those leases, not newer ones of the same task ids)."""
        with self._lock:
            self._forget_locked(tasks)

    def _forget_locked(self, tasks: Sequence[Task]) -> None:
        held, reserved = self._held, self._reserved
        for task in tasks:
            if held.get(task.id) is task:
                del held[task.id]
            if reserved and task in reserved:
                reserved.remove(task)

    def revoke_all(self) -> None:
        """Everything held is lost: mark it revoked and drop it."""
        with self._lock:
            for task in self._held.values():
                task.revoked.set()
            self._held.clear()
            self._reserved.clear()

    def revoke_listed(self, revoked: Iterable[int], tokens: dict[int, int]) -> list[int]:
        """A heartbeat answer's revocations: only the leases the beat listed (the id may
        be held again under a new token); the rest is in contact again (``at_risk``
        cleared). Returns the ids revoked."""
        out = []
        with self._lock:
            for tid in revoked:
                task = self._held.get(tid)
                if task is not None and task.token == tokens.get(tid):
                    task.revoked.set()
                    self._forget_locked((task,))
                    out.append(tid)
            for task in self._held.values():
                if task._at_risk is not None:  # never set if never made
                    task._at_risk.clear()
        return out
