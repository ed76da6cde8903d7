#!lua
-- heartbeat: the worker's whole truth in one call.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, last_reply_call_no, n, (task, token) x n[, conn id]
-- returns: {code (OK | DRAINING | REREGISTER), {revoked task ids}, {pass, gen, state, reason}}
-- Renews liveness; revokes leases granted to this worker by calls up to the last reply
-- it received that it did not list (their reply was lost); answers the listed leases
-- that are no longer current.
local err = open_job(ARGV[1])
if err then return done({err}) end
local worker, winc = ARGV[2], ARGV[3]
local last_reply = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
reclaim(20)
local ws = touch_worker(worker, winc)
if ws == 'lost' then return done({C.REREGISTER, {}, job_info()}) end
set_conn(worker, winc, ARGV[6 + 2 * n])  -- this call's connection (CLIENT ID), if sent
local held = {}
for k = 1, n do held[ARGV[4 + 2 * k]] = ARGV[5 + 2 * k] end
local m = worker .. '|' .. winc
local items = redis.call('ZRANGEBYLEX', K_OWNED, '[' .. m .. '|', '(' .. m .. '|\255',
  'LIMIT', 0, 1000)
for _, item in ipairs(items) do
  local task = string.match(item, '|([^|]*)$')
  local l = lease_for(task, worker, winc)
  if not lease_is_current(l) or member(l.worker, l.winc, task) ~= item then
    redis.call('ZREM', K_OWNED, item)
  elseif held[task] == nil and l.call <= last_reply then
    end_lease(task, l, 'V')
    mincr(F.C_REVOKED)
    event('revoked', 'task', task, 'worker', worker, 'reason', 'reply_lost')
    if not survives(task, l) then to_front(task) end
  end
end
local revoked = {}
for k = 1, n do
  local task, tok = ARGV[4 + 2 * k], ARGV[5 + 2 * k]
  local l = lease_for(task, worker, winc)
  if not holds(l, worker, winc, tok) then
    revoked[#revoked + 1] = tonumber(task)
  end
end
local code = C.OK
if ws == 'drain' then code = C.DRAINING end
return done({code, revoked, job_info()})
