"""Minimal fenced-lease probe: the most tasks/s any Redis-Lua fenced queue can reach here.

Where it sits: between the ceiling rows and the taskq rows. One bare Lua script does only
the unavoidable work of a fenced lease queue, and 1, 4 and 16 redis-py processes call it
in a closed loop, each call acking what the caller held and leasing the next task(s):

  ack   for each (task, token) held: HGET the lease, compare the token (the fence),
        SETBIT done, HDEL the lease
  lease LPOP from the re-dispatch front list (empty here), else advance a cursor over
        task ids 0..N-1 with INCRBY; one token per call = INCR; HSET lease task -> token

It has no worker liveness, no deadlines, no passes, no events: taskq's rows are read as
"cost of the rest" against these. Tasks/s counts acked tasks; the bitmap is checked
afterwards (done bits must equal acks, no stale acks).
"""

from __future__ import annotations

import multiprocessing as mp
import time

import common
import psutil
import redis

SECTION = "probe"

# KEYS: 1 front list, 2 cursor, 3 token counter, 4 leases hash, 5 done bitmap
# ARGV: 1 tasks to lease, then (task, token) pairs to ack
# returns {acked, stale, token, task...}
ACK_AND_LEASE_LUA = """
local acked, stale = 0, 0
for i = 2, #ARGV, 2 do
  local task, token = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[4], task) == token then
    redis.call('SETBIT', KEYS[5], task, 1)
    redis.call('HDEL', KEYS[4], task)
    acked = acked + 1
  else
    stale = stale + 1
  end
end
local want = tonumber(ARGV[1])
local tasks = redis.call('LPOP', KEYS[1], want) or {}
if #tasks < want then
  local need = want - #tasks
  local last = redis.call('INCRBY', KEYS[2], need)
  for task = last - need, last - 1 do
    tasks[#tasks + 1] = task
  end
end
local token = string.format('%.0f', redis.call('INCR', KEYS[3]))
local fields = {}
for _, task in ipairs(tasks) do
  fields[#fields + 1] = task
  fields[#fields + 1] = token
end
redis.call('HSET', KEYS[4], unpack(fields))
local reply = {acked, stale, token}
for _, task in ipairs(tasks) do
  reply[#reply + 1] = task
end
return reply
"""
KEYS = (
    "probe:{p}:front",
    "probe:{p}:cursor",
    "probe:{p}:token",
    "probe:{p}:leases",
    "probe:{p}:done",
)


def run(recorder: common.Recorder, quick: bool) -> None:
    """Adds six rows: {1, 16} tasks per call x {1, 4, 16} client processes, tasks/s."""
    duration_s = 5.0 if quick else 15.0
    for batch in (1, 16):
        for processes in (1, 4, 16):
            with common.start_redis() as server:
                redis_cpu = psutil.Process(server.process.pid)
                cpu_before = sum(redis_cpu.cpu_times()[:2])
                result = measure(server.port, processes, batch, duration_s)
                cpu_share = (sum(redis_cpu.cpu_times()[:2]) - cpu_before) / result["window_s"]
            note = (
                f"{duration_s:.0f} s, call p50 {result['p50_ms']:.2f} ms "
                f"p99 {result['p99_ms']:.2f} ms, redis-server CPU {cpu_share:.0%}"
            )
            if result["problem"]:
                note += f"; {result['problem']}"
            recorder.add(
                SECTION,
                f"ack+lease {batch}/call, {processes} proc",
                result["tasks_per_s"],
                "tasks/s",
                note,
            )


def measure(port: int, processes: int, batch: int, duration_s: float) -> dict:
    """Runs `processes` closed-loop clients for `duration_s` against 127.0.0.1:port.

    Returns:
        {tasks_per_s, window_s, acked, p50_ms, p99_ms, problem} where problem is "" when the done
        bitmap matches the acks and no ack was stale.
    """
    client = redis.Redis(host=common.LOOPBACK, port=port)
    client.delete(*KEYS)
    sha = client.script_load(ACK_AND_LEASE_LUA)
    ctx = mp.get_context("fork")
    start = ctx.Event()
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_client_loop, args=(port, sha, batch, duration_s, start, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        time.sleep(0.3)  # let every client connect before the clock starts
        start.set()
        reports = [results.get(timeout=duration_s + 60) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
                worker.join()
    acked = sum(report["acked"] for report in reports)
    stale = sum(report["stale"] for report in reports)
    window = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    latencies = [lat for report in reports for lat in report["latencies_ms"]]
    done_bits = client.bitcount(KEYS[4])
    client.close()
    problem = ""
    if stale or done_bits != acked:
        problem = f"CHECK FAILED: {stale} stale acks, {done_bits} done bits for {acked} acks"
    return {
        "tasks_per_s": acked / window,
        "window_s": window,
        "acked": acked,
        "p50_ms": common.percentile(latencies, 50),
        "p99_ms": common.percentile(latencies, 99),
        "problem": problem,
    }


def _client_loop(port, sha, batch, duration_s, start, results) -> None:
    client = redis.Redis(host=common.LOOPBACK, port=port)
    client.ping()
    held: list = []
    acked = stale = 0
    latencies_ms: list[float] = []
    start.wait()
    started = time.time()
    deadline = time.monotonic() + duration_s
    while True:
        now = time.monotonic()
        final = now >= deadline
        # The final call acks what is held; what it leases is left unacked (not counted).
        reply = client.evalsha(sha, len(KEYS), *KEYS, batch, *held)
        latencies_ms.append((time.monotonic() - now) * 1000.0)
        acked += reply[0]
        stale += reply[1]
        token = reply[2]
        held = [item for task in reply[3:] for item in (task, token)]
        if final:
            break
    results.put(
        {
            "acked": acked,
            "stale": stale,
            "started": started,
            "ended": time.time(),
            "latencies_ms": latencies_ms,
        }
    )
