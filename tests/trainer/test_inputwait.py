"""The training loop's data wait (issue 31): the in-process meter, what a heartbeat carries,
what the heartbeat script keeps per job (bounded, its argument checked before any write),
and how ``taskq job status`` shows it. The exporter and a real Prometheus:
tests/ops/test_prometheus_live.py.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from typing import Any

import pytest
from click.testing import CliRunner
from support import wait_until
from taskq.cli.main import cli

import taskq
from taskq.admin import inputwait_view
from taskq.engine.contract import Code
from taskq.inputwait import N_BUCKETS, SEND_EVERY_S, WAIT_BOUNDS_S, InputBeat, InputMeter
from taskq.keys import JobKeys
from taskq.testing import script_function, trainer_worker


def test_the_meter_times_the_wait_inside_next_and_the_step_between() -> None:
    meter = InputMeter()
    meter.enter()
    time.sleep(0.03)  # the wait the meter measures (perf_counter)
    meter.leave()
    time.sleep(0.02)  # the wait the meter measures (perf_counter)
    meter.enter()
    meter.leave()
    count, wait_s, step_s, counts, idle_s = meter.totals()
    assert count == 2
    assert 0.03 <= wait_s < 0.06
    assert 0.02 <= step_s < 0.05
    assert sum(counts) == 2 and len(counts) == N_BUCKETS
    assert counts[0] == 1  # the immediate one: under 1 ms
    assert counts[WAIT_BOUNDS_S.index(0.05)] == 1  # 30 ms: in (25, 50] ms
    assert idle_s == 0.0


def test_a_wait_or_step_under_way_shows_at_once_and_a_stopped_next_counts_nothing() -> None:
    meter = InputMeter()
    meter.enter()
    time.sleep(0.02)  # the wait the meter measures (perf_counter)
    assert meter.totals()[1] >= 0.02  # stuck in next(): visible before it returns
    meter.stop()  # the iteration ended (StopIteration): the wait is not counted
    assert meter.totals()[:3] == (0, 0.0, 0.0)
    meter.enter()
    meter.leave()
    time.sleep(0.02)  # the wait the meter measures (perf_counter)
    assert meter.totals()[2] >= 0.02  # a long step under way
    meter.restart()  # between two iterations: neither wait nor step
    time.sleep(0.01)  # the wait the meter measures (perf_counter)
    meter.enter()
    assert meter.totals()[2] < 0.02 + 0.005


def test_a_beat_carries_what_changed_since_the_last_answered_one() -> None:
    meter = InputMeter()
    beat = InputBeat(meter, every_s=0)
    assert beat.arg() is None  # the loop never ran: nothing to send
    for _ in range(3):
        meter.enter()
        meter.leave()
    first = beat.arg()
    assert first is not None
    fields = [int(x) for x in first[0][1:].split(",")]
    assert first[0][0] == "i" and len(fields) == 6 + N_BUCKETS
    assert fields[0] == 3 == sum(fields[5:-1])
    again = beat.arg()  # the first was never answered: still all of it
    assert again is not None and int(again[0][1:].split(",")[0]) == 3
    beat.sent(again[1])
    meter.enter()
    meter.leave()
    after = beat.arg()
    assert after is not None and int(after[0][1:].split(",")[0]) == 1


def test_a_beat_carries_it_at_most_every_few_seconds_and_loses_nothing_between() -> None:
    assert InputBeat(InputMeter()).every_s == SEND_EVERY_S >= 1  # the default
    meter = InputMeter()
    beat = InputBeat(meter, every_s=0.2)
    meter.enter()
    meter.leave()
    first = beat.arg()
    assert first is not None  # the first at once
    beat.sent(first[1])
    meter.enter()
    meter.leave()
    assert beat.arg() is None  # the next beats go without it...
    later: list[Any] = []
    # ...and the one after every_s carries what they skipped
    assert wait_until(lambda: later.append(beat.arg()) or later[-1] is not None, 5)
    assert int(later[-1][0][1:].split(",")[0]) == 1


def test_a_meter_given_to_one_trainer_after_another_is_sent_once(
    client: taskq.Client, job_name: str
) -> None:
    """The torch loader's meter goes to a new trainer each pass: what the first sent is
    not sent again by the next."""
    client.create_job(job_name, [{"i": i} for i in range(2)])
    meter = InputMeter()
    meter.beat = InputBeat(meter, every_s=0.2)  # what the trainers share
    for _ in range(3):
        meter.enter()
        meter.leave()
    first = taskq.Trainer(job_name, client=client, heartbeat=False, input_meter=meter)
    first.heartbeat()
    first.close()
    second = taskq.Trainer(job_name, client=client, heartbeat=False, input_meter=meter)
    second.heartbeat()
    meter.enter()
    meter.leave()
    beat = meter.beat
    assert wait_until(lambda: beat.arg() is not None, 5), "every_s since the last beat"
    second.heartbeat()
    second.close()
    assert client.status(job_name, summaries=0).input["total"]["count"] == 4


def _raw_beat(client: taskq.Client, trainer: taskq.Trainer, *extra: str) -> list[Any]:
    args = [*trainer_worker(trainer).heartbeat.args(), *extra]
    name, nkeys, _ = script_function("heartbeat")
    reply: list[Any] = client.redis.execute_command(
        "FCALL", name, nkeys, *trainer.keys.script, *args
    )
    return reply


def _arg(
    n: int, wait_us: int, step_us: int, recent: tuple[int, int] | None = None, idle_us: int = 0
) -> str:
    counts = [0] * N_BUCKETS
    counts[3] = n
    rw, rs = recent if recent else (wait_us, step_us)
    return "i" + ",".join(str(x) for x in (n, wait_us, step_us, rw, rs, *counts, idle_us))


@pytest.mark.parametrize(
    "bad",
    [
        "i1,2,3",  # too few numbers
        _arg(1, 10, 10).rsplit(",", 1)[0],  # without the idle time
        _arg(2, 10, 10).replace("i2,", "i3,", 1),  # counts do not sum to n
        "i" + ",".join(["1"] * 40),  # too many
        _arg(1, 10, 10) + ",",  # a trailing comma
        _arg(1, 10, 10).replace(",", ",,", 1),  # an empty number
        _arg(1, 10**16, 10),  # a number of 17 digits
        _arg(1, 10, 10).replace("10", "1x", 1),  # not digits
        "i" + "9" * 400,  # too long
    ],
)
def test_a_malformed_input_wait_is_refused_before_any_write(
    client: taskq.Client, job_name: str, bad: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(2)])
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    meta = JobKeys(job_name).meta
    before = client.redis.dump(meta), client.redis.zrange(t.keys.workers, 0, -1, withscores=True)
    reply = _raw_beat(client, t, bad)
    assert reply[0] == Code.INVALID and "input wait" in reply[1], reply
    assert (
        client.redis.dump(meta),
        client.redis.zrange(t.keys.workers, 0, -1, withscores=True),
    ) == (before)
    t.close()


def test_an_input_wait_goes_before_the_connection_id_and_both_are_read(
    client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(2)])
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False)
    assert _raw_beat(client, t, _arg(4, 100_000, 300_000), "12345")[0] == Code.OK
    bad_conn = _raw_beat(client, t, _arg(1, 1, 1), "not-a-conn")
    assert bad_conn[0] == Code.INVALID and "conn id" in bad_conn[1]
    assert _raw_beat(client, t, "12345")[0] == Code.OK  # the connection id alone, as before
    total = client.status(job_name, summaries=0).input["total"]
    assert (total["count"], total["wait_s"], total["step_s"]) == (4, 0.1, 0.3)
    t.close()


def test_a_wait_with_nothing_to_lease_is_counted_apart_from_the_wait_for_data() -> None:
    """The part of a next() spent while the trainer blocked with nothing to lease is
    idle time, not a data wait (its bucket is that of the rest)."""
    meter = InputMeter()
    meter.enter()
    meter.idle_begin()
    time.sleep(0.03)  # the wait the meter measures (perf_counter)
    assert meter.totals()[4] >= 0.03 and meter.totals()[1] < 0.03  # under way, split too
    meter.idle_end()
    meter.leave()
    count, wait_s, step_s, counts, idle_s = meter.totals()
    assert count == 1 and idle_s >= 0.03 and wait_s < 0.005
    assert counts[0] + counts[1] == 1  # the data wait: under 5 ms
    meter.idle_begin()  # a block while the loop steps (a read-ahead): not the loop's wait
    meter.idle_end()
    meter.enter()
    meter.leave()
    assert meter.totals()[4] == idle_s


def test_a_trainer_waiting_for_appends_reports_it_apart_and_status_says_so(
    client: taskq.Client, url: str, job_name: str
) -> None:
    """A healthy stream whose trainer waits for the producer: the wait goes to the
    'nothing to lease' figure, not to the data wait, and status says 'waiting for
    appends' (before: '9x % of loop time waiting for data')."""
    client.create_job(job_name, [], stream=True)
    meter = InputMeter()
    t = taskq.Trainer(job_name, client=client, worker_id="w", heartbeat=False, input_meter=meter)
    got: list[Any] = []
    loop = threading.Thread(target=lambda: got.extend(itertools.islice(t, 1)))
    loop.start()
    assert wait_until(lambda: meter.totals()[4] >= 0.2)  # the loop blocked, nothing to lease
    client.job(job_name).append([{"i": 0}])
    loop.join(timeout=10)
    assert len(got) == 1
    t.heartbeat()
    t.close()
    data = client.status(job_name, summaries=0).input
    assert data["total"]["idle_s"] >= 0.2 > data["total"]["wait_s"]
    assert data["recent"]["idle_fraction"] > 0.5
    line = inputwait_view.line(data, "open")
    assert line.startswith(f"{data['recent']['idle_fraction'] * 100:.0f} % of loop time waiting")
    assert "waiting for appends (nothing to lease)" in line
    shown = CliRunner().invoke(cli, ["--url", url, "job", "status", job_name])
    assert "waiting for appends" in shown.output


def test_the_worst_three_trainers_are_kept_and_forgotten_a_minute_after_their_last_beat(
    client: taskq.Client, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(2)], manual_clock=True, worker_ttl=600)
    shares = {"w10": 10, "w50": 50, "w90": 90, "w30": 30, "w70": 70}
    trainers = {
        w: taskq.Trainer(job_name, client=client, worker_id=w, heartbeat=False) for w in shares
    }
    for w, pct in shares.items():
        assert _raw_beat(client, trainers[w], _arg(1, pct * 1000, (100 - pct) * 1000))[0] == 0
    data = client.status(job_name, summaries=0).input
    assert [(x["worker"], x["fraction"]) for x in data["worst"]] == [
        ("w90", 0.9),
        ("w70", 0.7),
        ("w50", 0.5),
    ]
    recent = data["recent"]
    assert recent["count"] == 5 and recent["fraction"] == pytest.approx(250 / 500)
    # the worst improves: its record is replaced, not kept beside the new one
    _raw_beat(client, trainers["w90"], _arg(1, 1000, 99_000))
    worst = client.status(job_name, summaries=0).input["worst"]
    assert [x["worker"] for x in worst] == ["w70", "w50", "w90"]

    client.advance_clock(job_name, 61_000)
    _raw_beat(client, trainers["w10"], _arg(1, 10_000, 90_000))
    data = client.status(job_name, summaries=0).input
    assert [x["worker"] for x in data["worst"]] == ["w10"]  # the others: silent for > 1 min
    assert data["recent"]["count"] == 7  # this window and the one before
    assert data["total"]["count"] == 7

    client.advance_clock(job_name, 121_000)  # no beat for two windows: nothing recent
    data = client.status(job_name, summaries=0).input
    assert (data["recent"]["count"], data["recent"]["fraction"], data["worst"]) == (0, None, [])
    assert data["total"]["count"] == 7  # the totals (the exporter's counters) stay
    assert inputwait_view.line(data) == "no training loop reported in the last minute or two"
    for t in trainers.values():
        t.close()


def test_iterating_a_trainer_reports_its_wait_and_job_status_shows_it(
    client: taskq.Client, url: str, job_name: str
) -> None:
    client.create_job(job_name, [{"i": i} for i in range(6)])
    t = taskq.Trainer(job_name, client=client, worker_id="host-3:88", heartbeat=False)
    for _task in t:
        time.sleep(0.02)  # a step of 20 ms; the wait is a Redis call of well under that
    t.heartbeat()
    t.close()
    data = client.status(job_name, summaries=0).input
    assert data["total"]["count"] == 6
    assert data["total"]["step_s"] >= 0.1
    assert data["recent"]["fraction"] < 0.5
    assert data["worst"][0]["worker"] == "host-3:88"

    shown = CliRunner().invoke(cli, ["--url", url, "job", "status", job_name])
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if x.startswith("input"))
    assert "% of loop time waiting for data (p95 " in line
    assert "; worst trainer host-3:88 " in line
    as_json = CliRunner().invoke(cli, ["--url", url, "job", "status", job_name, "--json"])
    assert as_json.exit_code == 0, as_json.output
    carried = json.loads(as_json.output)["input"]
    assert carried["recent"]["fraction"] == pytest.approx(data["recent"]["fraction"])
    assert carried["recent"]["p95_s"] > 0
    assert carried["worst"][0]["worker"] == "host-3:88"
    assert len(carried["total"]["counts"]) == len(carried["bounds_s"]) + 1
