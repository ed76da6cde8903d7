#!lua
-- leave: a worker deregisters, releasing everything it holds in one call.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, secret
-- returns: {code, released_count}
-- Started leases count an attempt (as a release does); reserved ones count nothing.
-- Only with the worker's lease secret: another is answered REREGISTER, counted forged,
-- and neither releases nor removes anything.
local err = open_job(ARGV[1])
if err then return done({err}) end
local worker, winc = ARGV[2], ARGV[3]
local m = worker .. '|' .. winc
use_secret(ARGV[4])
local inc, _, _, wdig = winfo(worker)
if inc == winc and not (CALLER_DIG and wdig == CALLER_DIG) then
  forged(nil, worker, nil, 'leave')
  return done({C.REREGISTER, 0})
end
local released = 0
local items = redis.call('ZRANGEBYLEX', K_OWNED, '[' .. m .. '|', '(' .. m .. '|\255',
  'LIMIT', 0, 1000)
for _, item in ipairs(items) do
  local task = string.match(item, '|([^|]*)$')
  local l = parse_lease(redis.call('HGET', K_LEASES, task))
  if lease_is_current(l) and member(l.worker, l.winc, task) == item then
    if l.dig ~= CALLER_DIG then
      forged(nil, worker, nil, 'leave')
      return done({C.REREGISTER, released})
    end
    end_lease(task, l, 'R')
    mincr(F.C_RELEASED)
    event('released', 'task', task, 'worker', worker)
    if l.st == 'S' then requeue(task, 'attempt') else requeue(task, 'none') end
    released = released + 1
  else
    redis.call('ZREM', K_OWNED, item)
  end
end
if redis.call('ZSCORE', K_WORKERS, m) then remove_worker(m, 'worker_left') end
check_pass_end()
return done({C.OK, released})
