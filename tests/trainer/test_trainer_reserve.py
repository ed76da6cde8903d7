"""Trainer.lease_many(reserve=True, starts=...) against a real redis-server: read-ahead
leased reserved stays stealable by an idle trainer until it is started, and a start
reports a task taken meanwhile (the surface taskq.torch's feeder is built on)."""

from __future__ import annotations

from functools import partial

import pytest
import support

import taskq

make_job = partial(support.make_job, worker_ttl=5.0, heartbeat_interval=0.2)


def test_reserved_tasks_are_stolen_by_an_idle_trainer_until_started(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """One trainer reserves all 4 tasks (none started); an idle trainer added then takes
    one of them (stolen); the first one's start of all 4 in the next call (with a lease
    of none) starts the other 3 and reports the stolen one revoked, no longer held."""
    make_job(client, job_name, n=4)
    with (
        taskq.Trainer(job_name, url=url, handle_signals=False) as first,
        taskq.Trainer(job_name, url=url, handle_signals=False) as added,
    ):
        got = first.lease_many(4, timeout=2.0, reserve=True)
        assert len(got) == 4 and not any(t.started for t in got)
        assert client.status(job_name).todo == 0
        stolen = added.lease(timeout=2.0)
        assert stolen is not None and stolen.id in {t.id for t in got}
        assert first.lease_many(0, timeout=0, starts=got) == []
        assert [t.id for t in got if t.started] == [t.id for t in got if t.id != stolen.id]
        (taken,) = [t for t in got if t.id == stolen.id]
        assert taken.revoked.is_set() and taken not in first.held
        assert first.stolen_from_me == 1
        first.ack([t for t in got if t.started])
        added.ack(stolen)
    st = client.status(job_name)
    assert st.state == "completed" and st.counters["stolen"] == 1


def test_lease_many_of_none_needs_acks_or_starts(
    client: taskq.Client, url: str, job_name: str
) -> None:
    make_job(client, job_name, n=1)
    with taskq.Trainer(job_name, url=url, handle_signals=False) as trainer:
        with pytest.raises(taskq.InvalidInput):
            trainer.lease_many(0)
