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

# Picks the tasks to lease (the front list, else the cursor) and the call's token; shared
# by the probe's script and the floor's.
PICK_LUA = """
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
"""

# KEYS: 1 front list, 2 cursor, 3 token counter, 4 leases hash, 5 done bitmap
# ARGV: 1 tasks to lease, then (task, token) pairs to ack
# returns {acked, stale, token, task...}
ACK_AND_LEASE_LUA = (
    """
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
"""
    + PICK_LUA
    + """local fields = {}
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
)
KEYS = (
    "probe:{p}:front",
    "probe:{p}:cursor",
    "probe:{p}:token",
    "probe:{p}:leases",
    "probe:{p}:done",
)

# The floor of the data model in docs/design.md: the probe's work plus only the writes
# every ack+lease call of that model makes, with no decisions (no reclaim, no pass logic, no
# waiting): read the job's meta hash, renew the worker's liveness, keep the ended lease
# record (so a repeated ack is quiet), the ownership and started indexes, one `acked` and
# one `leased` event per call, the duration histogram and the counters. Leases and index
# writes are variadic, one command per call. bench/HISTORY.md compares it with the probe:
# what taskq can reach is below this line.
# KEYS: the probe's 1-5, then 6 meta, 7 owned, 8 started, 9 workers, 10 events, 11 hist
FLOOR_LUA = (
    """
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local meta = redis.call('HGETALL', KEYS[6])
redis.call('ZADD', KEYS[9], now, 'w|1')
local acked, stale, done = 0, 0, {}
for i = 2, #ARGV, 2 do
  local task, token = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[4], task) == 'L|w|1|' .. token then
    redis.call('SETBIT', KEYS[5], task, 1)
    redis.call('HSET', KEYS[4], task, 'E|w|1|' .. token)
    redis.call('ZREM', KEYS[7], 'w|1|' .. task)
    redis.call('ZREM', KEYS[8], task)
    acked = acked + 1
    done[#done + 1] = task
  else
    stale = stale + 1
  end
end
if acked > 0 then
  redis.call('XADD', KEYS[10], 'MAXLEN', '~', 10000, '*', 'type', 'acked', 'worker', 'w',
    'tasks', table.concat(done, ','))
  redis.call('HINCRBY', KEYS[11], 'dur:1', acked)
  redis.call('HINCRBY', KEYS[11], 'dur:count', acked)
  redis.call('HINCRBY', KEYS[11], 'dur:sum', acked)
end
"""
    + PICK_LUA
    + """local fields, owned, started = {}, {}, {}
for _, task in ipairs(tasks) do
  fields[#fields + 1] = task
  fields[#fields + 1] = 'L|w|1|' .. token
  owned[#owned + 1] = '0'
  owned[#owned + 1] = 'w|1|' .. task
  started[#started + 1] = now
  started[#started + 1] = task
end
redis.call('HSET', KEYS[4], unpack(fields))
redis.call('ZADD', KEYS[7], unpack(owned))
redis.call('ZADD', KEYS[8], unpack(started))
redis.call('XADD', KEYS[10], 'MAXLEN', '~', 10000, '*', 'type', 'leased', 'worker', 'w',
  'tasks', table.concat(tasks, ','), 'token', token)
redis.call('HSET', KEYS[6], 'c_acked', tonumber(meta[2] or 0) + acked, 'nleased', #tasks,
  'cursor', redis.call('GET', KEYS[2]), 'seen', now)
local reply = {acked, stale, token}
for _, task in ipairs(tasks) do
  reply[#reply + 1] = task
end
return reply
"""
)
FLOOR_KEYS = KEYS + tuple(
    f"probe:{{p}}:{name}" for name in ("meta", "owned", "started", "workers", "events", "hist")
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


def measure(port: int, processes: int, batch: int, duration_s: float, floor: bool = False) -> dict:
    """Runs `processes` closed-loop clients for `duration_s` against 127.0.0.1:port
    (calling FLOOR_LUA instead of the probe's script when `floor`).

    Returns:
        {tasks_per_s, window_s, acked, p50_ms, p99_ms, problem} where problem is "" when the done
        bitmap matches the acks and no ack was stale.
    """
    client = redis.Redis(host=common.LOOPBACK, port=port)
    keys = FLOOR_KEYS if floor else KEYS
    client.delete(*keys)
    sha = client.script_load(FLOOR_LUA if floor else ACK_AND_LEASE_LUA)
    ctx = mp.get_context("fork")
    start = ctx.Event()
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_client_loop, args=(port, sha, keys, batch, duration_s, start, results))
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


def _client_loop(port, sha, keys, batch, duration_s, start, results) -> None:
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
        reply = client.evalsha(sha, len(keys), *keys, batch, *held)
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
