"""Tail splitting against the verbs: each test is one case where a split (one 100-record
JSONL task split at 55 by an idle trainer, tests/engine/test_split.py's ``split_between``) meets
a checkpoint, a retry, the task timeout, a steal or a Redis rollback, driven through the
public API on the suite's redis-server: every sample of the task is trained once per
pass attempt, and what was read but not acked is read again, never skipped
(docs/design.md, "Tail splitting")."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support import wait_until
from test_split import job_of, read_rest, read_some, split_between, trainer, write_jsonl

import taskq
from taskq.data import read_task


def samples(task: taskq.Task) -> list[int]:
    """The records a holder of ``task`` reads: from its start to the end it honours."""
    return [s["i"] for s in read_task(task.chunks, task.start, end=task.current_end)]


def read_all(t: taskq.Trainer, task: taskq.Task) -> list[Any]:
    got: list[Any] = []
    read_rest(t, task, read_task(task.chunks, task.start, end=task.current_end), got, task.start)
    return got


def test_a_rewind_keeps_a_tail_acked_at_the_cut(client, job_name, tmp_path):
    """The tail [55, 100) is acked while the head is at 11; checkpoint; the head finishes;
    a rewind to the checkpoint gives back the head's rest [11, 55) only."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, it = split_between(client, job_name, a, b, 10)
    read_all(b, piece)
    b.ack(piece)
    a.flush_progress()
    rec = client.checkpoint(job_name)
    read_rest(a, task, it, [], 11)
    a.ack(task)
    assert client.rewind(job_name, rec)
    again = trainer(client, job_name, "c").lease(timeout=0)
    assert again is not None and samples(again) == list(range(11, 55))


def test_a_retry_keeps_a_tail_acked_in_the_same_attempt(client, job_name, tmp_path):
    """The tail is acked, then the head fails at max_failures=1 (the task dies); the
    retried lease covers what the head had not read, not the acked tail again."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100), max_failures=1)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, _ = split_between(client, job_name, a, b, 10)
    read_all(b, piece)
    b.ack(piece)
    a.fail(task, "bad sample")
    assert client.status(job_name, summaries=0).dead == 1
    client.retry(job_name)
    again = trainer(client, job_name, "c").lease(timeout=0)
    assert again is not None and samples(again) == list(range(11, 55))


def test_a_tail_piece_has_the_task_timeout(client, job_name, tmp_path):
    """task_timeout=10: the head is acked, the tail's holder heartbeats and never
    finishes; the tail is taken back after the timeout, as any lease."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100), task_timeout=10.0)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, it = split_between(client, job_name, a, b, 10)
    read_rest(a, task, it, [], 11)
    a.ack(task)
    audit = client.audit(job_name)  # the tail stands for its task: leased 1, started 1
    assert audit["ok"], audit["checks"]
    for _ in range(4):
        client.advance_clock(job_name, 4000)
        b.heartbeat()
        a.heartbeat()
    client.reap(job_name)
    b.heartbeat()  # the holder hears of it at its next heartbeat
    assert piece.revoked.is_set()
    again = trainer(client, job_name, "c").lease(timeout=0)
    assert again is not None and samples(again) == list(range(55, 100))


def test_a_checkpoint_keeps_a_tails_progress(client, job_name, tmp_path):
    """The tail's holder records 20 samples (55-74); checkpoint; rewind: the tail goes
    on from 75, and nothing is read again unseen."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, _ = split_between(client, job_name, a, b, 10)
    for n in range(56, 76):
        b.progress(piece, n)
    b.flush_progress()
    a.flush_progress()
    rec = client.checkpoint(job_name)
    assert client.rewind(job_name, rec)
    c, d = trainer(client, job_name, "c"), trainer(client, job_name, "d")
    got = [c.lease(timeout=0), d.lease(timeout=0)]  # (one piece of a task per trainer)
    read = sorted(i for t in got if t is not None for i in samples(t))
    assert read == list(range(11, 55)) + list(range(75, 100))
    for t, x in zip(got, (c, d), strict=True):
        assert t is not None
        read_all(x, t)
        x.ack(t)
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert [p["reread_samples"] for p in audit["passes"] if not p["rewound"]] == [0]


def test_a_rollback_past_a_split_rereads_and_never_skips(client, job_name, tmp_path):
    """Redis goes back to a state from before the split (a lost last second of AOF, a
    lagging replica promoted): the head's holder still honours end 55; the server, which
    does not know that end, keeps what it read up to there, ends its lease (its ack is
    stale) and leases the rest [55, 100) again."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    r = client.redis
    task = a.lease(timeout=0)
    assert task is not None
    it = read_some(a, task, 10, [])
    a.flush_progress()
    keys = list(r.scan_iter(match=f"*{{{job_name}}}*"))
    saved = {k: r.dump(k) for k in keys}  # the state before the split
    got: list[taskq.Task | None] = []
    leaser = threading.Thread(target=lambda: got.append(b.lease(timeout=20)))
    leaser.start()
    wait_until(lambda: client.status(job_name, summaries=0).counters["splits"] == 1, 10)
    next(it)
    a.progress(task, 11)
    a.flush_progress()
    a.progress(task, 11)
    a.flush_progress()
    leaser.join(20)
    assert task.end == 55 and got[0] is not None
    for k in r.scan_iter(match=f"*{{{job_name}}}*"):
        if k not in saved:
            r.delete(k)
    for k, v in saved.items():
        r.restore(k, 0, v, replace=True)
    read_rest(a, task, read_task(task.chunks, 11, end=task.current_end), [], 11)
    with pytest.raises(taskq.LeaseLost):
        a.ack(task)  # its lease ended at the end it named: nothing more counted
    assert client.status(job_name, summaries=0).state == "running"
    c = trainer(client, job_name, "c")
    again = c.lease(timeout=0)
    assert again is not None and samples(again) == list(range(55, 100))
    read_all(c, again)
    c.ack(again)
    st = client.status(job_name, summaries=0)
    assert st.state == "completed" and st.counters["revoked"] == 1


def test_one_worker_never_holds_both_pieces_through_a_steal(client, job_name, tmp_path):
    """The head's holder releases it, a prefetching trainer reserves it; the tail's holder
    asking for work does not steal the head (its tail and the head would share one owned
    entry, and a departure after the tail's ack would orphan the head)."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b, c = (trainer(client, job_name, w) for w in "abc")
    task, piece, _, _ = split_between(client, job_name, a, b, 10)
    a.release(task)
    [head] = c.lease_many(1, timeout=0, reserve=True)
    assert head.id == task.id and head.start == 11
    assert b.lease(timeout=0) is None
    read_all(b, piece)
    b.ack(piece)
    b.close()
    assert c.lease_many(0, timeout=0, starts=[head]) == [] and head.started
    assert samples(head) == list(range(11, 55))
    read_all(c, head)
    c.ack(head)
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


def test_a_tail_handed_back_beside_its_leased_head_is_todo(client, job_name, tmp_path):
    """The tail's holder hands its piece back while the head's holder reads on: the task
    is leased (its head) and todo (its tail) in status and ``tasks todo`` alike, so a
    loader ending its pass when nothing is todo (``pass_end="local"``) waits for it; once
    the head is acked the tail alone is todo, and a trainer takes it."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, it = split_between(client, job_name, a, b, 10)
    b.release(piece)
    st = client.status(job_name, summaries=0)
    assert (st.todo, st.leased) == (1, 1)
    assert [t["id"] for t in client.tasks(job_name, "todo")] == [task.id]
    assert a.lease(timeout=0) is None  # never both pieces to one trainer
    read_rest(a, task, it, [], 11)
    a.ack(task)
    st = client.status(job_name, summaries=0)
    assert (st.todo, st.leased, st.state) == (1, 0, "running")
    assert [t["id"] for t in client.tasks(job_name, "todo")] == [task.id]
    again = a.lease(timeout=0)
    assert again is not None and samples(again) == list(range(55, 100))
    read_all(a, again)
    a.ack(again)
    assert client.status(job_name, summaries=0).state == "completed"


def test_a_default_jsonl_byte_range_is_counted_and_split(client, job_name, tmp_path):
    """A JSONL task of a default ``--chunk-bytes`` range (no count in its chunk): a loop
    reading it through ``read_task(..., end=task.current_end)`` counts its range when it
    begins (written into the chunk), its progress says the size, and an idle trainer
    splits it at the tail."""
    path = tmp_path / "a.jsonl"
    path.write_text("".join(f'{{"i": {k}}}\n' + ("\n" if k % 7 == 0 else "") for k in range(100)))
    chunks = taskq.data.build_chunks(str(path), "jsonl")
    assert len(chunks) == 1 and "samples" not in chunks[0]
    job_of(client, job_name, chunks)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, got, it = split_between(client, job_name, a, b, 10)
    assert task.chunks[0]["samples"] == 100  # blank lines are no samples
    assert (piece.start, piece.end) == (55, 100) and task.end == 55
    rest = read_all(b, piece)
    read_rest(a, task, it, got, 11)
    assert [s["i"] for s in got] == list(range(55))
    assert [s["i"] for s in rest] == list(range(55, 100))
    b.ack(piece)
    a.ack(task)
    assert client.status(job_name, summaries=0).state == "completed"


def test_the_audit_checks_that_a_split_tasks_pieces_partition_it(client, job_name, tmp_path):
    """While the tail is out with the head acked, and after the pass completed, the
    audit counts the split and finds it sound; a split record whose pieces stop short
    of the task (a gap), or a task done with its tail not acked, fails the audit."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100), passes=1)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, it = split_between(client, job_name, a, b, 10)
    read_rest(a, task, it, [], 11)
    a.ack(task)
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert audit["splits"] == {"tasks": 1, "acked": 0, "bad": []}
    r, keys = client.redis, client.connection.keys(job_name)
    r.setbit(keys.done, task.id, 1)  # as if the head's ack had counted the task
    bad = client.audit(job_name)
    assert not bad["checks"]["split_tasks_partitioned"]
    assert "done with a piece not acked" in bad["splits"]["bad"][0]["why"]
    r.setbit(keys.done, task.id, 0)

    read_all(b, piece)
    b.ack(piece)
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert audit["splits"] == {"tasks": 1, "acked": 1, "bad": []}
    rec = r.hget(keys.leases, f"s:{task.id}")
    parts = (rec.decode() if isinstance(rec, bytes) else rec).split("|")
    r.hset(keys.leases, f"s:{task.id}", "|".join([*parts[:2], "90", *parts[3:]]))
    bad = client.audit(job_name)
    assert not bad["ok"] and not bad["checks"]["split_tasks_partitioned"]
    assert "pieces end at 90, the task has 100 samples" in bad["splits"]["bad"][0]["why"]


def _slow_split(client: taskq.Client, job_name: str, tmp_path: Any, tasks: int) -> tuple:
    """``tasks`` tasks of 100 samples; ``a`` acks two in 1 s each (the job's median task
    time), ``s`` takes 5 samples of the third in 5 s (a tenth of that pace); ``a``, idle,
    splits it by pace at 6 (``s`` keeps little) and hands the pending piece back at once
    (``lease(timeout=0)``); ``s`` confirms the split and acks its head [0, 6)."""
    chunks = [write_jsonl(tmp_path / f"{k}.jsonl", 100)[0] for k in range(tasks)]
    job_of(client, job_name, chunks, worker_ttl=60.0)
    a, s = trainer(client, job_name, "a"), trainer(client, job_name, "s")
    for _ in range(2):
        t = a.lease(timeout=0)
        assert t is not None
        client.advance_clock(job_name, 1000)
        a.ack(t)
    task = s.lease(timeout=0)
    assert task is not None
    if tasks > 3:
        other = a.lease(timeout=0)  # a holds the fourth task, not begun
        assert other is not None
        a.progress(other, 0, None)  # it stops at the ends it is told: its size goes too
    it = read_some(s, task, 5, [])
    client.advance_clock(job_name, 5000)
    s.flush_progress()
    assert a.lease(timeout=0) is None  # the piece was pending: handed back at once
    split = [f for _, f in client.events(job_name, count=1000) if f["type"] == "split"]
    assert [f["at"] for f in split] == ["6"], split
    next(it)
    s.progress(task, 6)
    s.flush_progress()  # its reply says the end
    assert task.end == 6
    s.progress(task, 6)
    s.flush_progress()  # recorded under the end it honours: the split is confirmed
    s.ack(task)
    return a, s, task


def test_a_slow_trainer_leaves_a_waiting_tail_to_the_others(client, job_name, tmp_path):
    """The tail [6, 100) of a task split from a slow trainer waits among the orphans: the
    slow trainer, asking first, is not given it (it would read it at its pace); the
    other trainer is."""
    a, s, task = _slow_split(client, job_name, tmp_path, 3)
    assert s.lease(timeout=0) is None
    piece = a.lease(timeout=0)
    assert piece is not None and piece.id == task.id and (piece.start, piece.end) == (6, 100)


def test_a_slow_trainer_takes_a_waiting_tail_nobody_took(client, job_name, tmp_path):
    """Left to the others for two heartbeat intervals (at least a second) only: then the
    slow trainer takes the tail itself, so no pass waits on a trainer that does not come."""
    a, s, task = _slow_split(client, job_name, tmp_path, 3)
    assert s.lease(timeout=0) is None
    client.advance_clock(job_name, 2 * 1000 * client.status(job_name).config["heartbeat_interval"])
    client.advance_clock(job_name, 1000)
    a.heartbeat()
    piece = s.lease(timeout=0)
    assert piece is not None and piece.id == task.id and (piece.start, piece.end) == (6, 100)


def test_a_slow_trainer_splits_no_task_of_another_alive(client, job_name, tmp_path):
    """A trainer measured slow (a tenth of the typical pace) splits no task of another
    trainer while that one is alive, not even one it has not begun (progress 0): it would
    read the piece at its pace, where the holder reads it at the typical one."""
    a, s, _ = _slow_split(client, job_name, tmp_path, 4)
    a.flush_progress()
    assert s.lease(timeout=0) is None
    split = [f for _, f in client.events(job_name, count=1000) if f["type"] == "split"]
    assert [f["task"] for f in split] == ["2"]


def _unbegun_task_split_at_0(client: taskq.Client, job_name: str, tmp_path: Any) -> tuple:
    """``s``, measured at a tenth of the typical pace, reads 6 samples of its first task
    and holds a second it has not begun (progress 0); an idle trainer ``a`` splits the
    first by pace at 6 and reads its tail, then splits the second at 0; ``s`` confirms that
    point and ``a`` leases the piece [0, 100). Returns (a, s, second, piece, samples ``a``
    read of the first task's tail)."""
    chunks = [write_jsonl(tmp_path / f"{k}.jsonl", 100)[0] for k in range(4)]
    job_of(client, job_name, chunks, worker_ttl=60.0)
    a, s = trainer(client, job_name, "a"), trainer(client, job_name, "s")
    for _ in range(2):
        t = a.lease(timeout=0)
        assert t is not None
        client.advance_clock(job_name, 1000)
        a.ack(t)
    first, second = s.lease(timeout=0), s.lease(timeout=0)
    assert first is not None and second is not None
    s.progress(second, 0, None)  # not begun; its size goes with the report
    it = read_some(s, first, 5, [])
    client.advance_clock(job_name, 5000)
    s.flush_progress()
    assert a.lease(timeout=0) is None  # first split by pace at 6, pending
    next(it)
    for _ in range(2):
        s.progress(first, 6)
        s.flush_progress()
    s.ack(first)
    tail = a.lease(timeout=0)
    assert tail is not None and (tail.id, tail.start, tail.end) == (first.id, 6, 100)
    got = read_all(a, tail)
    a.ack(tail)
    assert a.lease(timeout=0) is None  # the second split at 0, pending
    s.progress(second, 0, None)
    s.flush_progress()  # its reply says the end: 0
    assert second.end == 0
    s.progress(second, 0)
    s.flush_progress()  # recorded under the end it honours: confirmed
    piece = a.lease(timeout=0)
    assert piece is not None and (piece.id, piece.start, piece.end) == (second.id, 0, 100)
    split = [f for _, f in client.events(job_name, count=1000) if f["type"] == "split"]
    assert [(f["task"], f["at"]) for f in split] == [(str(first.id), "6"), (str(second.id), "0")]
    return a, s, second, piece, got


def test_a_slow_trainer_hands_a_task_it_has_not_begun_over_whole(client, job_name, tmp_path):
    """``s``, measured at a tenth of the typical pace (its first task split by pace at 6),
    holds a second task it has not begun (progress 0): an idle trainer splits it at 0, the
    whole task its piece, rather than leaving ``s`` the samples its pace would get through
    (``s`` would begin them only after what it reads now; before, the point was 1 at
    least). ``s`` confirms the point, acks its empty head; every sample once."""
    a, s, second, piece, got = _unbegun_task_split_at_0(client, job_name, tmp_path)
    assert list(read_task(second.chunks, second.start, end=second.current_end)) == []
    s.ack(second)
    got += read_all(a, piece)
    a.ack(piece)
    assert [x["i"] for x in got] == list(range(6, 100)) + list(range(100))
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert audit["passes"][-1]["reread_samples"] == 0


@pytest.mark.parametrize("ends", ["lost", "released"])
def test_an_empty_head_piece_whose_holder_ends_is_acked_by_construction(
    client, job_name, tmp_path, ends
):
    """``s``, measured slow (its first task split by pace), holds a task it has not begun;
    an idle trainer splits it at 0
    (the whole task its piece), ``s`` confirms the point, the idle trainer reads its piece
    [0, 100) and acks it. Then ``s`` is lost (or releases its empty head [0, 0)) without
    acking it: the head has nothing to read, so it is acked by construction and the task
    is done, the pass complete. Before, it went back to the front as a piece for a range
    reader to lease and ack (a pass with none left waited for ever)."""
    a, s, second, piece, _ = _unbegun_task_split_at_0(client, job_name, tmp_path)
    got = read_all(a, piece)
    a.ack(piece)
    assert [x["i"] for x in got] == list(range(100))
    if ends == "lost":
        client.advance_clock(job_name, 61_000)
        a.heartbeat()
        client.reap(job_name)
    else:
        s.release(second)
    st = client.status(job_name, summaries=0)
    assert (st.state, st.todo) == ("completed", 0)
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert audit["passes"][-1]["reread_samples"] == 0


def _lease_pieces(client: taskq.Client, job_name: str, *wids: str) -> list[tuple[Any, Any]]:
    """Each named trainer leases once (one piece of a task per trainer)."""
    out = []
    for w in wids:
        t = trainer(client, job_name, w)
        out.append((t, t.lease(timeout=0)))
    return out


@pytest.mark.parametrize("dies", ["head", "tail"])
def test_a_split_task_that_dies_keeps_its_pieces_for_a_retry(client, job_name, tmp_path, dies):
    """Neither piece acked: the head is at 11, the tail's holder recorded 75; one piece
    fails at max_failures=1 (the task dies, the other piece's lease is revoked). A retry
    brings back each piece from its own progress: [11, 55) and [75, 100), nothing re-read;
    the pass then completes and the audit finds the pieces sound."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100), max_failures=1)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, _ = split_between(client, job_name, a, b, 10)
    b.progress(piece, 75)
    b.flush_progress()
    if dies == "head":
        a.fail(task, "bad sample")
    else:
        b.fail(piece, "bad sample")
    assert client.status(job_name, summaries=0).dead == 1
    assert client.retry(job_name) == 1
    got = _lease_pieces(client, job_name, "c", "d")
    assert sorted((p.start, p.end) for _, p in got if p) == [(11, 55), (75, 100)]
    for t, p in got:
        assert p is not None
        read_all(t, p)
        t.ack(p)
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


@pytest.mark.parametrize("tail_read", [0, 20])
def test_a_retried_split_task_goes_whole_to_a_whole_task_reader_only_if_its_tail_is_unread(
    client, job_name, tmp_path, tail_read
):
    """A split task dies with neither piece acked (head at 11, the tail's holder at
    55 + ``tail_read``) and is retried: its pieces come back as they were. A whole-task
    reader (the plain Trainer's default) takes the head whole only when the tail read
    nothing (the split undone: [11, 100)); else it gets nothing and range readers take
    [11, 55) and [75, 100). Every sample once, the job completed, the audit sound."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100), max_failures=1)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, took_a, _ = split_between(client, job_name, a, b, 10)
    took = [s["i"] for s in took_a]
    if tail_read:
        took += [s["i"] for s in read_task(piece.chunks, piece.start, end=55 + tail_read)]
        b.progress(piece, 55 + tail_read)
        b.flush_progress()
    a.fail(task, "bad sample")
    assert client.status(job_name, summaries=0).dead == 1
    assert client.retry(job_name) == 1
    w = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    whole = w.lease(timeout=0)
    if tail_read:
        assert whole is None  # the head [11, 55) is a piece: not for a whole-task reader
        got = _lease_pieces(client, job_name, "c", "d")
        assert sorted((p.start, p.end) for _, p in got if p) == [(11, 55), (75, 100)]
        for t, p in got:
            assert p is not None
            took += [s["i"] for s in read_all(t, p)]
            t.ack(p)
    else:
        assert whole is not None and whole.start == 11 and whole.end in (None, 100)
        took += [s["i"] for s in read_task(whole.chunks, whole.start)]  # to the chunks' end
        w.ack(whole)
    w.close()
    assert sorted(took) == list(range(100))
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


def test_a_head_piece_left_by_every_range_reader_goes_whole_to_a_whole_task_reader(
    client, job_name, tmp_path
):
    """``a`` reads 11 samples of a task, ``b`` splits it at 55, reads its tail [55, 100)
    and acks it; ``a`` leaves (its head [11, 55) goes back) and so does ``b``: no range
    reader is left, only a whole-task reader, which takes the task whole (the split
    undone; the tail's 45 samples read again, counted re-read) and completes the pass.
    Before, the head piece waited in the front for a range reader that never came. While
    a range reader is registered it is left to one."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100), passes=1)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, took_a, _ = split_between(client, job_name, a, b, 10)
    assert (piece.start, piece.end) == (55, 100)
    took = [s["i"] for s in took_a] + [s["i"] for s in read_all(b, piece)]
    b.ack(piece)
    a.close()
    w = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    assert w.lease(timeout=0) is None  # b, a range reader, is still registered
    b.close()
    whole = w.lease(timeout=0)
    assert whole is not None and whole.id == task.id and whole.start == 11
    took += [s["i"] for s in read_task(whole.chunks, whole.start)]  # to the chunks' end
    w.ack(whole)
    w.close()
    assert sorted(set(took)) == list(range(100))
    assert len(took) == 100 + 45
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]
    assert audit["passes"][-1]["reread_samples"] == 45


def _head_acked_tail_dead(client: taskq.Client, job_name: str, tmp_path: Any) -> tuple:
    """Two tasks; ``c`` holds task 0 (its size unsaid: never split); ``a``'s task 1 is
    split at 55 by ``b``; ``a`` acks the head, ``b`` reads the tail to 60 and fails it at
    max_failures=1: task 1 is dead with its head acked. Returns (c, c's task, task 1)."""
    chunks = [write_jsonl(tmp_path / f"{k}.jsonl", 100)[0] for k in range(2)]
    job_of(client, job_name, chunks, max_failures=1, passes=1)
    a, b, c = (trainer(client, job_name, w) for w in "abc")
    other = c.lease(timeout=0)
    assert other is not None and other.id == 0
    task, piece, _, it = split_between(client, job_name, a, b, 10)
    read_rest(a, task, it, [], 11)
    a.ack(task)
    b.progress(piece, 60)
    b.flush_progress()
    b.fail(piece, "bad sample")
    assert client.status(job_name, summaries=0).dead == 1
    return c, other, task


def test_a_retry_after_completion_never_leases_an_acked_piece(client, job_name, tmp_path):
    """The job completes with the split task dead (head acked, tail failed at 60); a
    retry reopens the pass and brings back the tail alone, from its progress [60, 100):
    the acked head is not read again."""
    c, other, task = _head_acked_tail_dead(client, job_name, tmp_path)
    c.ack(other)
    assert client.status(job_name, summaries=0).state == "completed"
    assert client.retry(job_name) == 1
    d = trainer(client, job_name, "d")
    again = d.lease(timeout=0)
    assert again is not None and again.id == task.id
    assert samples(again) == list(range(60, 100))
    assert d.lease(timeout=0) is None
    read_all(d, again)
    d.ack(again)
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


def test_a_rewind_keeps_a_dead_tail_dead_until_a_retry(client, job_name, tmp_path):
    """A checkpoint holds the split task dead (head acked, tail failed at 60) while task 1
    is out; a rewind there gives task 1 back and never the dead tail (its pieces are as
    they were at the cut); the pass completes without it, and a retry then brings back
    the tail from 60, whose ack completes the job again."""
    c, other, task = _head_acked_tail_dead(client, job_name, tmp_path)
    rec = client.checkpoint(job_name)
    assert client.rewind(job_name, rec)
    d = trainer(client, job_name, "d")
    again = d.lease(timeout=0)
    assert again is not None and again.id == other.id
    e = trainer(client, job_name, "e")
    assert e.lease(timeout=0) is None  # the dead tail is leased by nobody
    st = client.status(job_name, summaries=0)
    assert (st.todo, st.dead) == (0, 1)
    read_all(d, again)
    d.ack(again)
    assert client.status(job_name, summaries=0).state == "completed"
    assert client.retry(job_name) == 1
    tail = e.lease(timeout=0)
    assert tail is not None and tail.id == task.id and samples(tail) == list(range(60, 100))
    read_all(e, tail)
    e.ack(tail)
    assert client.status(job_name, summaries=0).state == "completed"
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


def _extend_to_end(t: taskq.Trainer, task: taskq.Task, got: list[Any]) -> None:
    """The holder reads on to the task's end before it hears of a split (its reports go
    at once at the end: the first moves the point up to the end, ``split_moved``)."""
    for n, sample in enumerate(read_task(task.chunks, len(got)), len(got) + 1):
        got.append(sample)
        t.progress(task, n)
    t.flush_progress()


def test_heads_extended_to_the_end_past_pending_splits_complete_the_pass(
    client, job_name, tmp_path
):
    """Two trainers each split the other's task at their pass's tail (a DDP pair at its
    epoch's end): the pending tails are granted to nobody (no piece handed back), each
    head's holder reads on to its task's end (``split_moved ... at=60``) and acks: the
    tails are empty, the job completes, every sample taken once, and the audit finds the
    pieces sound."""
    chunks = [write_jsonl(tmp_path / f"{k}.jsonl", 60)[0] for k in range(2)]
    job_of(client, job_name, chunks, passes=1)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    ta, tb = a.lease(timeout=0), b.lease(timeout=0)
    assert ta is not None and tb is not None
    got: dict[int, list[Any]] = {ta.id: [], tb.id: []}
    read_some(a, ta, 10, got[ta.id])
    read_some(b, tb, 10, got[tb.id])
    a.flush_progress()
    b.flush_progress()
    assert a.lease(timeout=0) is None  # splits b's task: pending, granted to nobody
    assert b.lease(timeout=0) is None  # splits a's task
    events = [f for _, f in client.events(job_name, count=1000)]
    assert sorted(f["task"] for f in events if f["type"] == "split") == ["0", "1"]
    assert not [f for f in events if f["type"] in ("piece_leased", "piece_back")]
    _extend_to_end(a, ta, got[ta.id])
    _extend_to_end(b, tb, got[tb.id])
    moved = [f["at"] for _, f in client.events(job_name, count=1000) if f["type"] == "split_moved"]
    assert moved == ["60", "60"]
    a.ack(ta)
    b.ack(tb)
    assert [s["i"] for s in got[ta.id]] == list(range(60)) == [s["i"] for s in got[tb.id]]
    st = client.status(job_name, summaries=0)
    assert (st.state, st.todo, st.leased) == ("completed", 0, 0)
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


def test_a_head_extended_to_the_end_then_departing_completes_the_pass(client, job_name, tmp_path):
    """The head's holder reads to the end past a split handed back, then departs without
    its ack (``close``): its head, read to its point (the task's end), is acked by
    construction and the job completes; neither the head nor the empty tail is leased
    again (the head went to the front, for the next holder to ack an empty lease)."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 60), passes=1)
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task = a.lease(timeout=0)
    assert task is not None
    got: list[Any] = []
    read_some(a, task, 10, got)
    a.flush_progress()
    assert b.lease(timeout=0) is None
    _extend_to_end(a, task, got)
    a.close()
    st = client.status(job_name, summaries=0)
    assert (st.state, st.todo) == ("completed", 0)
    audit = client.audit(job_name)
    assert audit["ok"], audit["checks"]


def test_the_audit_finds_pieces_lost_overlapping_or_unreachable(client, job_name, tmp_path):
    """A tail handed back waits among the orphans beside its leased head: the audit finds
    the pieces sound. Each broken state the pieces can be left in fails it, named: the
    tail taken out of the orphans (unreachable), the head's progress past its end (samples
    counted by both pieces), the record gone (its pieces lost), the task dead with its
    head leased, an empty tail never acked."""
    job_of(client, job_name, write_jsonl(tmp_path / "a.jsonl", 100))
    a, b = trainer(client, job_name, "a"), trainer(client, job_name, "b")
    task, piece, _, _ = split_between(client, job_name, a, b, 10)
    b.release(piece)
    audit = client.audit(job_name)
    assert audit["ok"], audit["splits"]
    r, keys = client.redis, client.connection.keys(job_name)
    rec = r.hget(keys.leases, f"s:{task.id}")
    orph = r.hget(keys.leases, "s:orph")
    rnd = orph.split("|")[0]
    m = int(rec.split("|")[1])

    def broken(why: str) -> None:
        bad = client.audit(job_name)
        assert not bad["ok"] and not bad["checks"]["split_tasks_partitioned"]
        assert why in bad["splits"]["bad"][0]["why"], bad["splits"]

    r.hset(keys.leases, "s:orph", f"{rnd}|")
    broken("neither leased nor waiting: unreachable")
    r.hset(keys.leases, "s:orph", orph)
    r.hset(keys.progress, task.id, m + 5)
    broken(f"the head's progress {m + 5} is past its end {m}: read twice")
    r.hset(keys.progress, task.id, 11)
    r.hdel(keys.leases, f"s:{task.id}")
    broken("its pieces' record is gone")
    r.hset(keys.leases, f"s:{task.id}", rec)
    r.sadd(keys.dead, task.id)
    r.setbit(keys.deadbits, task.id, 1)
    broken("dead, and a piece of it leased")
    r.srem(keys.dead, task.id)
    r.setbit(keys.deadbits, task.id, 0)
    parts = rec.split("|")
    r.hset(keys.leases, f"s:{task.id}", "|".join([parts[0], "100", "100", "1", "0", "100", "1"]))
    broken("an empty tail not acked")
    r.hset(keys.leases, f"s:{task.id}", rec)
    audit = client.audit(job_name)
    assert audit["ok"], audit["splits"]
