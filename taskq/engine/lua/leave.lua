#!lua
-- leave: a worker deregisters, releasing everything it holds in one call.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc, worker, winc, secret
-- returns: {code, released_count, more (1: the rest is left to reclaim)}
-- Started leases count an attempt (as a release does); reserved ones count nothing.
-- One call ends at most MAX_RECLAIM leases: when the worker holds more, it is declared
-- lost at once instead of removed, so the rest is reclaimed as a lost worker's, in bounded
-- steps, by the next calls (any trainer's lazy reclaim, the reaper), which then remove it.
-- Only with the worker's lease secret: another is answered REREGISTER, counted forged,
-- and neither releases nor removes anything.
local rcall, smatch, lipairs = redis.call, string.match, ipairs
local fmt, mincr = lib.meta.fmt, lib.meta.mincr
local arg_id, arg_len, args_bad = lib.args.arg_id, lib.args.arg_len, lib.args.args_bad
local event, wait_rem = lib.events.event, lib.events.wait_rem
local done, open_job = lib.call.done, lib.call.open_job
local arg_secret, forged = lib.secrets.arg_secret, lib.secrets.forged
local due_by, end_lease, lease_for, lease_is_current, member =
  lib.leases.due_by, lib.leases.end_lease, lib.leases.lease_for, lib.leases.lease_is_current,
  lib.leases.member
local requeue, survives = lib.endings.requeue, lib.endings.survives
local check_pass_end = lib.passes.check_pass_end
local remove_worker, winfo = lib.workers.remove_worker, lib.workers.winfo
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
arg_secret(ARGV[4])
arg_len(ARGV, 4)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
local m = worker .. '|' .. winc
local inc, _, _, wdig = winfo(worker)
if inc == winc and not (CALL.CALLER_DIG and wdig == CALL.CALLER_DIG) then
  forged(nil, worker, nil, 'leave')
  return done({C.REREGISTER, 0, 0})
end
local released = 0
local items = rcall('ZRANGEBYLEX', K_OWNED, '[' .. m .. '|', '(' .. m .. '|\255',
  'LIMIT', 0, MAX_RECLAIM + 1)
local more = #items > MAX_RECLAIM
for idx, item in lipairs(items) do
  if idx > MAX_RECLAIM then break end
  local task = smatch(item, '|([^|]*)$')
  local l = lease_for(task, worker, winc)
  if lease_is_current(l) and member(l.worker, l.winc, task) == item then
    if l.dig ~= CALL.CALLER_DIG then
      forged(nil, worker, nil, 'leave')
      return done({C.REREGISTER, released, 0})
    end
    end_lease(task, l, 'R')
    mincr(F.C_RELEASED)
    event('released', 'task', task, 'worker', worker)
    if survives(task, l, l.st == 'S' and 'attempt' or 'none') then  -- the other lease carries on
    elseif l.st == 'S' then requeue(task, 'attempt') else requeue(task, 'none') end
    released = released + 1
  else
    rcall('ZREM', K_OWNED, item)
  end
end
if more then
  rcall('ZADD', K_WORKERS, fmt(CALL.JNOW - 1), m)
  due_by(CALL.JNOW - 1)  -- its leases are due now: lazy reclaims must not skip them
  wait_rem(m)
  if winfo(worker) == winc then rcall('HDEL', K_WINFO, worker) end
  event('worker_left', 'worker', worker, 'incarnation', winc, 'to_reclaim', 'yes')
elseif rcall('ZSCORE', K_WORKERS, m) then
  remove_worker(m, 'worker_left')
end
check_pass_end()
return done({C.OK, released, more and 1 or 0})
