#!lua
-- ack: ack finished leases, start reserved ones, and lease the next, in one call.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, call_no, n_acks, (task, token) x n_acks,
--       n_starts, (task, token) x n_starts, want, mode (S | R | F), expect_pass (-1 any),
--       secret
-- returns: {code, {{task, token, attempt, chunks_json, started}...}, wait_ms,
--           {pass, gen, state, reason}, {ack result per ack}, {start result per start}}
-- An ack whose (worker, token) is not the task's current lease changes nothing and is
-- counted stale; repeating the ack that just ended the lease is a quiet success. Both
-- need the holder's secret: the holder's name and token with another secret are
-- answered stale and counted forged (so is the lease half, answered like a lost
-- worker's, as in lease.lua).
local err = open_job(ARGV[1])
if err then return done({err}) end
local worker, winc = ARGV[2], ARGV[3]
local call_no = tonumber(ARGV[4])
local i = 5
local n_acks = tonumber(ARGV[i])
local ack_args = i
i = i + 1 + 2 * n_acks
local n_starts = tonumber(ARGV[i])
local start_args = i
i = i + 1 + 2 * n_starts
local want, mode, expect_pass = tonumber(ARGV[i]), ARGV[i + 1], tonumber(ARGV[i + 2])
use_secret(ARGV[i + 3])
reclaim(100)
local ws = touch_worker(worker, winc, true)

local acks = end_held(ARGV, ack_args, n_acks, worker, winc, 'A', 'ack', acked_one)
if n_acks > 0 then check_pass_end() end

local starts = {}
for k = 1, n_starts do
  local task, tok = ARGV[start_args + 2 * k - 1], ARGV[start_args + 2 * k]
  local l = parse_lease(redis.call('HGET', K_LEASES, task))
  if holds_secret(l, worker, winc, tok) then
    if l.st == 'R' then
      redis.call('HSET', K_LEASES, task, 'L|' .. worker .. '|' .. winc .. '|' .. tok .. '|'
        .. l.rs .. '|S|' .. now_s() .. '|' .. l.calls .. '|' .. l.attempts .. '|' .. l.dig)
      redis.call('ZREM', K_RESERVED, task)
      mincr(F.NRESERVED, -1)
      redis.call('ZADD', K_STARTED, jnow_s(), task)
      local dl = start_deadline()
      if dl then redis.call('ZADD', K_DEADLINES, dl, task) end
      event('started', 'task', task, 'worker', worker)
    end
    starts[k] = C.OK
  else
    starts[k] = C.STOLEN
  end
end

if ws == 'forged' and want > 0 then forged(nil, worker, nil, 'lease') end
if ws == 'lost' or ws == 'forged' then
  return done({C.REREGISTER, {}, 0, job_info(), acks, starts})
end
if ws == 'drain' then return done({C.DRAINING, {}, 0, job_info(), acks, starts}) end
local r = lease_part(worker, winc, want, call_no, mode, expect_pass)
return done({r[1], r[2], r[3], job_info(), acks, starts})
