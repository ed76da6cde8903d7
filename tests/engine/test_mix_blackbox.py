"""A mixed job run as users run it (docs/mixing.md), from outside: trainer processes with
a SIGKILL against one trainer, a weight change at a stated slot set while they run, a
checkpoint and a rewind replayed by another number of trainers, ``taskq work`` and a
taskq.torch loop with DataLoader workers. What is compared is what a user sees: the
exported sequence (``taskq mix export``), the tasks each consumer took, and the reference
schedule (``taskq.mix.pass_schedule``). The engine's verbs one by one, the bound and the
CLI's errors are test_mix.py's."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from support import ENTRY_POINT, ROOT, wait_until
from test_mix import _cli, _fed_reference, _lease_ack, _reference, _sources

import taskq
from taskq.admin.mix import feed_log, spec_of
from taskq.mix import pass_schedule, plan_pass

_ids = itertools.count()

#: 310 slots: web outlasts the change at slot 200, books runs out after it (a drop)
SIZES = {"web": 150, "code": 100, "books": 60}
FIRST = {"web": 0.5, "code": 0.3, "books": 0.2}
AT_200 = {"web": 0.2, "code": 0.2, "books": 0.6}


def _mixed_job(client: taskq.Client, tag: str) -> tuple[str, dict[str, str]]:
    names = _sources(client, SIZES, tag)
    mix = f"{tag}-mix"
    client.create_job(
        mix,
        mix={names[k]: w for k, w in FIRST.items()},
        worker_ttl=1.0,
        heartbeat_interval=0.2,
    )
    return mix, names


def _set_at_200(client: taskq.Client, mix: str, names: dict[str, str]) -> int:
    return client.job(mix).set_weights({names[k]: w for k, w in AT_200.items()}, at=200)


def _exported(url: str, mix: str) -> list[tuple[str, int]]:
    """``taskq mix export``, the sources named by their kind (web, code, books)."""
    r = _cli(url, "mix", "export", mix)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["slot"] for row in rows] == list(range(len(rows)))
    return [(row["source"].rsplit("-", 1)[1], row["source_task"]) for row in rows]


def _kinds(seq: list[tuple[str, int]]) -> Counter[str]:
    return Counter(src.rsplit("-", 1)[-1] for src, _ in seq)


def test_three_processes_a_kill_and_a_weight_change_give_one_trainers_sequence(
    url, client, tmp_path
):
    """Three trainer processes, one SIGKILLed while it holds a task, weights changed at
    slot 200 while they run; then the same job shape with one trainer, a checkpoint at
    slot 100, on to 180 and a rewind there, slots 100..179 replayed by two trainers: both
    runs export the same sequence, the reference's, and the change holds from slot 200."""
    many, names = _mixed_job(client, f"mxb{next(_ids)}")
    script = str(ROOT / "tests" / "trainer_proc.py")
    log = tmp_path / "acks.log"

    def start(*extra: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, script, url, many, "--sleep", "0.02", "--log", str(log), *extra]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)

    # the first holds the task it leases until it is killed; the others start once it
    # holds one (else, on a loaded machine, they may take every task before it leases)
    victim = start("--hold")
    procs = [victim]
    try:
        assert victim.stdout is not None
        while not (line := victim.stdout.readline()).startswith("LEASED"):
            assert line, "the holding trainer ended before it leased"
        procs += [start(), start()]
        job = client.job(many)
        assert wait_until(lambda: job.mix_status()["charged"] >= 20, timeout=60)
        # while they run (at 0.02 s a task, slot 200 is seconds away): it holds from 200
        assert _set_at_200(client, many, names) == 200
        victim.kill()  # SIGKILL while it holds a task: it goes back under its slot
        victim.wait()
        assert wait_until(lambda: client.status(many).state == "completed", timeout=120)
        for p in procs[1:]:
            p.wait(timeout=30)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert client.status(many).counters["expired_worker_lost"] >= 1
    assert client.audit(many)["ok"], client.audit(many)
    acked = [line.split()[1] for line in log.read_text().splitlines()]
    assert sorted(map(int, acked)) == list(range(310))  # every task acked once
    seq_many = _exported(url, many)
    assert [(s.rsplit("-", 1)[1], j) for s, j in _reference(client, many)] == seq_many

    # the change holds from slot 200 exactly: before it the schedule of the first weights
    # alone, from it the new weights' (within the bound of 3/4 slot, so exact at these m)
    spec = spec_of(client.connection, many)
    unchanged = [(spec.sources[s].rsplit("-", 1)[1], j) for s, j in pass_schedule(spec, [], 0)]
    assert seq_many[:200] == unchanged[:200] and seq_many[200:] != unchanged[200:]
    assert _kinds(seq_many[180:200]) == {"web": 10, "code": 6, "books": 4}
    assert _kinds(seq_many[200:205]) == {"web": 1, "code": 1, "books": 3}
    assert _kinds(seq_many[200:220]) == {"web": 4, "code": 4, "books": 12}

    # the same shape, one trainer, no fault, with a checkpoint at 100 and a rewind at 180
    one, names = _mixed_job(client, f"mxb{next(_ids)}")
    job = client.job(one)
    assert _set_at_200(client, one, names) == 200
    with taskq.Trainer(one, client=client) as t:
        _lease_ack(t, 100)
        ckpt = job.checkpoint()
        first = _lease_ack(t, 80)  # slots 100..179
    assert job.rewind(ckpt)
    # two trainers now, taking turns: the same slots come again, in the same order
    with (
        taskq.Trainer(one, client=client, worker_id="r0") as r0,
        taskq.Trainer(one, client=client, worker_id="r1") as r1,
    ):
        again = [_lease_ack((r0, r1)[k % 2], 1)[0] for k in range(80)]
        assert again == first
        rest = _lease_ack(r0, 130)
    assert client.status(one).state == "completed"
    assert client.audit(one)["ok"], client.audit(one)
    seq_one = _exported(url, one)
    assert seq_one == seq_many
    assert seq_one[100:] == [(str(s).rsplit("-", 1)[1], j) for s, j in first + rest]


def _work_command(url: str, job: str, out: Path, row: str) -> list[str]:
    """``taskq work JOB`` (one CMD run per task) whose CMD appends ``row`` (a Python
    expression of ``task``, the task JSON, and ``os``) to ``out`` as a JSON line."""
    script = (
        "import json, os, sys\n"
        "task = json.load(sys.stdin)\n"
        f"with open({str(out)!r}, 'a') as f:\n"
        f"    f.write(json.dumps({row}) + '\\n')\n"
    )
    return [ENTRY_POINT, "--url", url, "work", job, "--", sys.executable, "-c", script]


def _runs(out: Path) -> list[Any]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def _work(url: str, job: str, tmp_path: Path, row: str) -> tuple[Any, list[Any]]:
    """``taskq work JOB`` (a real CLI process, one CMD run per task) whose CMD writes
    ``row`` as a JSON line (``_work_command``); the finished process and the rows in the
    order the runs wrote them."""
    out = tmp_path / "runs.jsonl"
    r = subprocess.run(
        _work_command(url, job, out, row), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return r, _runs(out)


def test_taskq_work_over_a_mixed_job_takes_every_task_once_and_names_its_source(
    url, client, tmp_path
):
    """``taskq work`` (a real CLI process, one CMD run per task): every task once, in the
    slots' order, each run told its source (the task JSON's ``source``, TASKQ_SOURCE) and
    the worker's log naming it."""
    tag = f"mxw{next(_ids)}"
    names = _sources(client, {"web": 6, "code": 4, "books": 2}, tag)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["web"]: 0.5, names["code"]: 0.3, names["books"]: 0.2})
    r, runs = _work(url, mix, tmp_path, "[task, os.environ['TASKQ_SOURCE']]")
    assert sorted(task["id"] for task, _ in runs) == list(range(12))
    assert [(task["source"], task["chunks"][0]["i"]) for task, _ in runs] == _reference(client, mix)
    for task, env_source in runs:
        assert env_source == task["source"] == names[task["chunks"][0]["src"]]
        assert f"task {task['id']} (pass 0, source {task['source']}): done" in r.stderr
    assert client.status(mix).state == "completed"


def test_torch_loop_over_a_mixed_job_takes_every_row_once(url, client, tmp_path: Path):
    """A taskq.torch DataLoader with 2 worker processes: every row of every source once,
    and ``loader.batch_sources`` the source of each row of the batch stepped on."""
    from torch_helpers import jsonl_reader, rows_of, write_jsonl

    import taskq.torch

    tag = f"mxt{next(_ids)}"
    files = {"web": 6, "code": 3, "books": 2}
    names = {}
    for k, (src, n) in enumerate(files.items()):
        # rows {"f": file, "i": line}: a source's files numbered apart from the others'
        chunks = write_jsonl(tmp_path / src, n + 10 * k, 7)[10 * k :]
        names[src] = f"{tag}-{src}"
        client.create_job(names[src], chunks)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["web"]: 0.5, names["code"]: 0.3, names["books"]: 0.2})
    ds = taskq.torch.TaskDataset(mix, url=url, reader=jsonl_reader)
    rows: list[tuple[int, int]] = []
    kind_of_file = {f: src for k, src in enumerate(files) for f in range(10 * k, 10 * k + 10)}
    with taskq.torch.DataLoader(ds, batch_size=4, num_workers=2) as loader:
        assert loader.batch_sources == [] and loader.mix_counts() == {}
        for batch in loader:
            got = rows_of(batch)
            rows += got
            # each row's source, in the batch's order
            assert loader.batch_sources == [names[kind_of_file[f]] for f, _ in got]
        assert loader.mix_counts() == {names[src]: 7 * n for src, n in files.items()}
    want = sorted(
        (f, i)
        for k, n in enumerate(files.values())
        for f in range(10 * k, 10 * k + n)
        for i in range(7)
    )
    assert sorted(rows) == want
    audit = client.audit(mix)
    assert audit["ok"], audit["checks"]
    assert [(r["source"], r["source_task"]) for r in client.job(mix).mix_sequence()] == (
        _reference(client, mix)
    )


def _three_sources_mixed(client, prefix: str, rule: str) -> str:
    """A mixed job of 2 passes under ``rule`` over web, code and books (6, 4 and 2 tasks)
    weighted 0.2, 0.3 and 0.5; its name."""
    tag = f"{prefix}{next(_ids)}"
    names = _sources(client, {"web": 6, "code": 4, "books": 2}, tag)
    mix = f"{tag}-mix"
    client.create_job(
        mix,
        mix={names["web"]: 0.2, names["code"]: 0.3, names["books"]: 0.5},
        on_exhausted=rule,
        passes=2,
    )
    return mix


def test_taskq_work_over_a_cycle_job_takes_each_source_pass_once(url, client, tmp_path):
    """``on_exhausted="cycle"`` through ``taskq work`` (a real CLI process, one CMD run per
    task) over 2 mixed passes: the small sources come round again inside a mixed pass,
    every slot runs once, the runs are the reference's slots (``plan_pass``, the life
    carried from pass 0 to 1), and each source pass of each source takes each of its
    tasks once, in order."""
    sizes = {"web": 6, "code": 4, "books": 2}
    mix = _three_sources_mixed(client, "mxc", "cycle")
    _, runs = _work(url, mix, tmp_path, "task")
    assert [(t["pass"], t["id"]) for t in runs] == [(p, k) for p in range(2) for k in range(12)]
    spec = spec_of(client.connection, mix)
    first = plan_pass(spec, [], 0)
    want = first.slots + plan_pass(spec, [], 1, life=first.life).slots
    assert [(t["source"], t["chunks"][0]["i"]) for t in runs] == [
        (spec.sources[s.source], s.task) for s in want
    ]
    for kind, n in sizes.items():
        got = [t["chunks"][0]["i"] for t in runs if t["chunks"][0]["src"] == kind]
        assert got == [j % n for j in range(len(got))]
    assert sum(t["chunks"][0]["src"] == "books" for t in runs) == 12  # 6 source passes of 2
    assert client.status(mix).state == "completed"


def test_taskq_work_over_a_stop_job_ends_each_pass_at_the_stop(url, client, tmp_path):
    """``on_exhausted="stop"`` through ``taskq work`` (a real CLI process, one CMD run per
    task) over 2 mixed passes: each pass runs the reference's slots up to the slot where
    the first source of positive weight (books, 2 tasks) takes its last task, no slot
    past it runs, each pass starts every source at its first task, and the job completes."""
    mix = _three_sources_mixed(client, "mxs", "stop")
    _, runs = _work(url, mix, tmp_path, "task")
    spec = spec_of(client.connection, mix)
    plan = plan_pass(spec, [], 0)
    assert plan.end == "stop" and len(plan.slots) < 12
    want = [
        (p, k, spec.sources[s.source], s.task) for p in range(2) for k, s in enumerate(plan.slots)
    ]
    assert [(t["pass"], t["id"], t["source"], t["chunks"][0]["i"]) for t in runs] == want
    assert [t["chunks"][0]["src"] for t in runs].count("books") == 4  # its 2 tasks a pass
    assert client.status(mix).state == "completed"


def test_taskq_work_over_a_mixed_job_fed_by_a_producer_takes_every_row_once(url, client, tmp_path):
    """An open stream source fed by producer processes (``taskq job append --feed``,
    ``taskq job seal --feed``) while ``taskq work`` (a real CLI process) runs the mixed job:
    the worker waits on the starving stream, takes each batch as it is fed, and ends with
    the pass once the feed is sealed and drained; every row once, in the reference's
    order from the engine's feed log (``plan_pass(..., feed=...)``)."""
    tag = f"mxf{next(_ids)}"
    names = _sources(client, {"web": 8}, tag)
    news = f"{tag}-news"
    client.create_job(news, [{"src": "news", "i": 0}], stream=True)
    mix = f"{tag}-mix"
    client.create_job(mix, mix={names["web"]: 0.5, news: 0.5}, max_debt=1)
    out = tmp_path / "runs.jsonl"
    worker = subprocess.Popen(
        _work_command(url, mix, out, "task"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def caught_up() -> bool:
        # the charge saw every row fed, every slot it charged ran, and the next one waits
        # on the stream
        feed = feed_log(client.connection, mix)
        seen = max(feed, key=lambda f: f.slot).tasks if feed else 1
        plan = plan_pass(spec_of(client.connection, mix), [], 0, feed=feed, first_slot=0)
        return seen == fed and len(_runs(out)) == len(plan.slots) and plan.end == "wait"

    def produce(verb: str, *args: str, feed: str | None = None) -> None:
        r = subprocess.run(
            [ENTRY_POINT, "--url", url, "job", verb, mix, "--feed", news, *args],
            input=feed,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr

    fed = 1
    try:
        for batch in (2, 3):
            assert wait_until(caught_up, timeout=60)
            assert worker.poll() is None  # (waiting on the stream, not ended)
            rows = [{"src": "news", "i": fed + j} for j in range(batch)]
            produce("append", "-", feed="".join(json.dumps(r) + "\n" for r in rows))
            fed += batch
        assert wait_until(caught_up, timeout=60)
        produce("seal")
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    runs = _runs(out)
    got = [(t["source"], t["chunks"][0]["i"]) for t in runs]
    assert got == _fed_reference(client, mix)
    assert sorted(got) == sorted(
        [(names["web"], i) for i in range(8)] + [(news, i) for i in range(fed)]
    )
    assert [t["id"] for t in runs] == list(range(len(runs)))
    assert client.status(mix).state == "completed"
