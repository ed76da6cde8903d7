"""The one table of what a loader iteration holds (taskq/torchdata/held.py), alone: its
states, the reserve taken in lease order, and what an entry takes with it when it leaves
(its readers' end cell, its count in the reserve). The table with a real trainer and
real readers: every other test in tests/torchdata."""

from __future__ import annotations

from taskq.models import Task
from taskq.torchdata.held import LEASED, READ, READING, RESERVED, HeldTasks


def _task(task_id: int, token: int = 7) -> Task:
    return Task(id=task_id, pass_no=0, chunks=[], token=token, attempt=1)


def test_one_entry_per_task_named_by_task_and_token_with_its_state() -> None:
    held = HeldTasks("job", lambda: None)
    e = held.add(_task(1), LEASED)
    assert held.holds(1, 7) and not held.holds(1, 8) and held.entry(1, 7) is e
    assert held.pass_of(1, 7) == 0 and held.pass_of(2, 7) is None
    held.set_state(e, READING)
    held.took((1, 7), 5)
    held.took((1, 7), 3)  # never back
    assert e.taken == 5
    held.took((1, 7), -1)
    held.took((1, 7), 9)  # taken to its end stays so
    assert e.taken == -1
    held.ack([(1, 7), (1, 8)])  # (1, 8) is not held: nothing
    assert e.state == READ
    held.fail(1, 7, "late")  # its ack was asked first
    assert e.state == READ


def test_the_reserve_is_started_in_lease_order_and_its_count_follows_every_exit() -> None:
    held = HeldTasks("job", lambda: None)
    tasks = [_task(k) for k in range(4)]
    for t in tasks:
        held.add(t, RESERVED)
    assert held.n_reserved == 4
    assert held.take_reserved(2) == tasks[:2]
    assert held.n_reserved == 2
    tasks[3].revoked.set()  # stolen by an idle trainer
    assert held.drop_revoked()
    assert held.n_reserved == 1 and held.count() == 3
    assert held.take_reserved(5) == [tasks[2]]
    assert held.n_reserved == 0


def test_an_entry_leaving_frees_its_end_cell_and_a_new_token_replaces_the_old() -> None:
    held = HeldTasks("job", lambda: None)
    e = held.add(_task(1), LEASED)
    e.slot = 5
    again = held.add(_task(1, token=8), LEASED)  # the task leased anew
    assert held.entry(1, 7) is None and held.entry(1, 8) is again
    assert held.freed_slots == [5] and e.slot == -1
    again.slot = 6
    held.keep_only([])  # released (no trainer in this test: nothing is called)
    assert held.count() == 0 and held.freed_slots == [5, 6]
