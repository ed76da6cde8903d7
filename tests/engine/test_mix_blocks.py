"""A mixed job's stored sequence in blocks (taskq/engine/lua/lib/mixseq.lua, docs/mixing.md):
its calls run on a real server through a verb added to the library as built (the way
tests/engine/test_library.py adds a helper), and a stream-fed mixed job whose pass runs
past the first block leases the reference's slots across the boundary, before and after
its first block is forgotten."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from support import job_keys

import taskq
from taskq.admin.mix import copy_field, feed_log, spec_of, task_fields, weight_log
from taskq.engine import library
from taskq.keys import MIXSEQ_BLOCK, JobKeys
from taskq.mix import plan_pass
from taskq.testing import RedisServer

B = MIXSEQ_BLOCK
_ids = itertools.count()

# lib/mixseq.lua's functions as a verb: what a maintainer's script (the trim) calls
SEQ_VERB = """#!lua
-- mixseq: lib/mixseq.lua's calls on a job's sequence (tests only)
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: op (get | set | drop | forget), pass, lo (get, set) / upto / below, hi / str
-- returns: get: the string; forget: the blocks unlinked; else 0
local get, set, drop, forget = lib.mixseq.get, lib.mixseq.set, lib.mixseq.drop, lib.mixseq.forget
local tonum = tonumber
local op, p, a = ARGV[1], tonum(ARGV[2]), tonum(ARGV[3])
if op == 'get' then return get(p, a, tonum(ARGV[4])) end
if op == 'set' then set(p, a, ARGV[4]); return 0 end
if op == 'drop' then drop(p, a); return 0 end
return forget(p, a)
"""


@pytest.fixture(scope="module")
def seq_function(redis_server: RedisServer) -> Iterator[str]:
    """The library with the verb above, loaded beside taskq's: its function's name."""
    built = library.build({"mixseq.lua": SEQ_VERB})
    r = taskq.connect(redis_server.url).redis
    r.execute_command("FUNCTION", "LOAD", "REPLACE", built.source)
    yield built.functions["mixseq"][0]
    r.execute_command("FUNCTION", "DELETE", built.name)


def _seq(client: taskq.Client, function: str, job: str, *args: object) -> object:
    keys = JobKeys(job, client.connection.prefix).script
    return client.redis.execute_command("FCALL", function, len(keys), *keys, *args)


def _copies(first: int, n: int) -> str:
    return "".join(f"{i:010x}" for i in range(first, first + n))


def _blocks(client: taskq.Client, job: str, p: int, upto: int) -> list[int]:
    keys = JobKeys(job, client.connection.prefix)
    return [b for b in range(upto) if client.redis.exists(keys.mixseq_block(p, b))]


def test_a_run_stored_across_a_block_end_reads_back_whole_and_forget_frees_below(
    client, job_name, seq_function
):
    """set splits at a block's end (block b: positions b * BLOCK ..), get joins the blocks
    again and ends at the first position not stored; forget frees the blocks wholly below
    its position (0 when called again), the rest still read; drop leaves none."""
    seq = lambda *a: _seq(client, seq_function, job_name, *a)  # noqa: E731
    keys = JobKeys(job_name, client.connection.prefix)
    lo = 2 * B - 7
    seq("set", 4, 0, _copies(0, 5))  # (pass 4: keys mixseq1.*)
    seq("set", 4, lo, _copies(lo, 20))
    assert client.redis.getrange(keys.mixseq_block(4, 1), (B - 7) * 10, -1) == _copies(lo, 7)
    assert client.redis.get(keys.mixseq_block(4, 2)) == _copies(2 * B, 13)
    assert seq("get", 4, lo, lo + 20) == _copies(lo, 20)
    assert seq("get", 4, lo + 6, lo + 8) == _copies(lo + 6, 2)  # (one each side of the end)
    assert seq("get", 4, lo + 15, lo + 30) == _copies(lo + 15, 5)  # (stored up to lo + 20)
    assert seq("get", 4, 3, 3) == ""
    assert _blocks(client, job_name, 1, 4) == [0, 1, 2]
    assert _blocks(client, job_name, 7, 4) == [0, 1, 2]  # (7 % 3 == 4 % 3: the same keys)
    assert seq("forget", 4, 2 * B - 1) == 1  # block 1 holds 2 * B - 1: kept
    assert _blocks(client, job_name, 4, 4) == [1, 2]
    assert seq("forget", 4, 2 * B - 1) == 0
    assert seq("get", 4, lo, lo + 20) == _copies(lo, 20)
    assert seq("forget", 4, 2 * B) == 1
    assert seq("get", 4, 2 * B, lo + 20) == _copies(2 * B, 13)
    seq("drop", 4, lo + 20)
    assert _blocks(client, job_name, 4, 4) == []


def test_drop_unlinks_every_block_in_slices_above_and_below_a_forgotten_run(
    client, job_name, seq_function
):
    """drop(p, upto) goes down from upto's block one UNLINK of 1000 blocks at a time and
    stops below the run that exists: a run of 2,500 blocks (one position each) over a
    forgotten prefix all goes."""
    seq = lambda *a: _seq(client, seq_function, job_name, *a)  # noqa: E731
    keys = JobKeys(job_name, client.connection.prefix)
    pipe = client.redis.pipeline(transaction=False)
    for b in range(3000):
        pipe.set(keys.mixseq_block(2, b), _copies(b, 1))
    pipe.execute()
    assert seq("forget", 2, 500 * B) == 500
    assert client.redis.exists(*(keys.mixseq_block(2, b) for b in range(3000))) == 2500
    seq("drop", 2, 3000 * B + 256)
    assert client.redis.exists(*(keys.mixseq_block(2, b) for b in range(3000))) == 0


def _reference(
    client: taskq.Client, mix: str, kept: tuple[list, list] = ([], [])
) -> list[tuple[str, int]]:
    """plan_pass's slots from the job's weight and feed logs, with the entries `kept`
    (weights, feed) read before a trim shortened them."""
    spec = spec_of(client.connection, mix)
    plan = plan_pass(
        spec,
        sorted((dict(kept[0]) | dict(weight_log(client.connection, mix))).items()),
        0,
        feed=sorted(set(kept[1]) | set(feed_log(client.connection, mix))),
        first_slot=0,
    )
    return [(spec.sources[s.source], s.task) for s in plan.slots]


def test_a_stream_fed_pass_leases_across_its_first_block_and_after_it_is_forgotten(
    client, seq_function
):
    """A mixed job fed by an open stream past position 65,536 (BLOCK): its feed starves the
    charge a few slots before the block's end, so the next page is stored across it; every
    slot handed out is the reference's (plan_pass from the weight and feed logs), one lease
    of 32 resolving slots on both sides of the end, and the admin's sequence and task
    fields read across it too; two blocks exist. The trim, its watermark past the end,
    frees the first block; the leases go on unchanged; the delete leaves no key."""
    tag = f"mb{next(_ids)}"
    web, news, mix = f"{tag}-web", f"{tag}-news", f"{tag}-mix"
    client.create_job(web, [{"s": "web", "i": i} for i in range(3)])
    client.create_job(news, [{"s": "news", "i": 0}], stream=True)
    client.create_job(mix, mix={news: 0.999, web: 0.001})
    job = client.job(mix)
    fed, got, straddled = 1, [], 0
    with taskq.Trainer(mix, client=client) as t:
        held = t.lease_many(1, timeout=0)  # (the leases of 32 then straddle the block end)

        def lease_all() -> None:
            nonlocal held, straddled
            while True:
                got.extend((task.source, task.chunks[0]["i"]) for task in held)
                straddled += any(x.id < B for x in held) and any(x.id >= B for x in held)
                held = t.lease_many(32, timeout=0, acks=held)
                if not held:
                    return

        # (B - 5 news tasks and the 3 of web: the charge waits at position B - 2)
        for upto in (30_000, 60_000, B - 5, 70_000):
            job.append([{"s": "news", "i": i} for i in range(fed, upto)], feed=news)
            fed = upto
            lease_all()
            assert got == _reference(client, mix)[: len(got)]
            if upto == B - 5:
                assert len(got) == B - 2 and _blocks(client, mix, 0, 3) == [0]
        assert straddled == 1
        assert _blocks(client, mix, 0, 3) == [0, 1]
        # the admin's readers (taskq/admin/mix.py) read across the end as the lease does
        assert [(r["source"], r["source_task"]) for r in job.mix_sequence(0)] == got
        spec = spec_of(client.connection, mix)
        assert task_fields(client.connection, mix, [B - 1, B, B + 1]) == [
            copy_field(spec.sources.index(s), i) for s, i in got[B - 1 : B + 2]
        ]
        # the trim frees the first block once its watermark passed it (lib/mixtrim.lua)
        kept = (weight_log(client.connection, mix), feed_log(client.connection, mix))
        while job.trim() > 0:
            pass
        assert client.status(mix).trimmed > B
        assert _blocks(client, mix, 0, 3) == [1]
        assert _seq(client, seq_function, mix, "forget", 0, B) == 0  # (done already)
        job.append([{"s": "news", "i": i} for i in range(fed, fed + 500)], feed=news)
        lease_all()
    assert got == _reference(client, mix, kept) and len(got) == 70_500 + 3
    job.delete()
    assert job_keys(client, mix) == []


def test_a_create_over_a_mixed_job_and_its_delete_leave_no_block(client):
    """job_keys() names no block: a create over a mixed job (replace) and the delete drop
    every kept pass's blocks from the schedule's state (lib/mix.lua drop_all)."""
    tag = f"mb{next(_ids)}"
    web, code, mix = f"{tag}-web", f"{tag}-code", f"{tag}-mix"
    client.create_job(web, [{"s": "web", "i": i} for i in range(5)])
    client.create_job(code, [{"s": "code", "i": i} for i in range(5)])
    for again in (False, True):
        client.create_job(mix, mix={web: 0.5, code: 0.5}, passes=2, replace=again)
        with taskq.Trainer(mix, client=client) as t:
            for task in t:  # (both passes: two kept passes' blocks)
                t.ack(task)
        assert _blocks(client, mix, 0, 1) + _blocks(client, mix, 1, 1) == [0, 0]
    client.create_job(mix, [{"i": 0}], replace=True)
    assert [k for k in job_keys(client, mix) if ":mixseq" in k] == []
    client.create_job(mix, mix={web: 0.5, code: 0.5}, replace=True)
    with taskq.Trainer(mix, client=client) as t:
        t.ack(t.lease())
    assert _blocks(client, mix, 0, 1) == [0]
    client.job(mix).delete()
    assert job_keys(client, mix) == []
