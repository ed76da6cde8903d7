"""What measuring the training loop's data wait costs (issue 31): the meter's two calls
per ``next()`` in the loop's thread, the heartbeat thread's share, and the heartbeat
script with and without the input wait argument.

Usage: .venv/bin/python bench/input_meter.py [--calls 1000000] [--beats 3000] [--rounds 5]

Where it sits: a diagnostic beside ``secret_cost.py`` (not a section of run.py). The
heartbeat part runs against a private redis-server (started and stopped here): one
registered worker, ``--beats`` raw heartbeats without, then with, the input wait; per
beat it prints the server's time inside FCALL (INFO commandstats), the median over the
rounds. A heartbeat carries the wait at most every ``inputwait.SEND_EVERY_S``, so the
script's extra per beat is the difference divided by the beats in that time.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit

import common

import taskq
from taskq.engine import library
from taskq.inputwait import SEND_EVERY_S, InputBeat, InputMeter
from taskq.testing import trainer_worker


def meter_ns(calls: int, rounds: int) -> tuple[float, float]:
    """(ns per enter()+leave() pair, ns per bare perf_counter call), best of ``rounds``."""
    meter = InputMeter()

    def pair() -> None:
        meter.enter()
        meter.leave()

    best = min(timeit.timeit(pair, number=calls) for _ in range(rounds)) / calls * 1e9
    bare = min(timeit.timeit(time.perf_counter, number=calls) for _ in range(rounds))
    return best, bare / calls * 1e9


def beat_us(rounds: int) -> float:
    """µs the heartbeat thread spends building one argument and taking its answer."""
    meter = InputMeter()
    meter.enter()
    meter.leave()
    beat = InputBeat(meter, every_s=0)
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        got = beat.arg()
        assert got is not None
        beat.sent(got[1])
    return (time.perf_counter() - t0) / n * 1e6


def script_us(url: str, beats: int, rounds: int) -> tuple[float, float]:
    """(median µs per heartbeat FCALL without, with the input wait) on the server."""
    client = taskq.connect(url)
    job = f"bench-input-{time.time_ns()}"
    client.create_job(job, [{"i": i} for i in range(4)])
    trainer = taskq.Trainer(job, client=client, heartbeat=False, handle_signals=False)
    name, nkeys, _ = library.FUNCTIONS["heartbeat"]
    arg = "i3,100,200,100,200,1,1,1,0,0,0,0,0,0,0,0,0,0"
    out: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for with_wait in (False, True):
            extra = [arg] if with_wait else []
            client.redis.config_resetstat()
            for _ in range(beats):
                args = [*trainer_worker(trainer).heartbeat.args(), *extra]
                client.redis.execute_command("FCALL", name, nkeys, *trainer.keys.script, *args)
            stats = client.redis.info("commandstats")["cmdstat_fcall"]
            out[with_wait].append(float(stats["usec_per_call"]))
    trainer.close()
    return statistics.median(out[False]), statistics.median(out[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--beats", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    pair, bare = meter_ns(opts.calls, opts.rounds)
    print(f"meter, per next(): {pair:.0f} ns (one perf_counter alone: {bare:.0f} ns)")
    print(f"heartbeat thread, per beat that carries it: {beat_us(opts.rounds):.1f} us")
    server = common.start_redis()
    try:
        without, with_wait = script_us(server.url, opts.beats, opts.rounds)
    finally:
        server.cleanup()
    extra = with_wait - without
    print(
        f"heartbeat script: {without:.1f} us without, {with_wait:.1f} us with the input "
        f"wait (+{extra:.1f} us; carried every {SEND_EVERY_S:g} s: +{extra / SEND_EVERY_S:.1f} "
        "us per beat at a 1 s heartbeat interval)"
    )


if __name__ == "__main__":
    main()
