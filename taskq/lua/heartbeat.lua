#!lua
-- heartbeat: the worker's whole truth in one call.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, last_reply_call_no, n, (task, token) x n, secret[, conn id]
-- returns: {code (OK | DRAINING | REREGISTER), {revoked task ids}, {pass, gen, state, reason}}
-- Renews liveness; revokes leases granted to this worker by calls up to the last reply
-- it received that it did not list (their reply was lost); answers the listed leases
-- that are no longer current. Only with the worker's lease secret: another is answered
-- REREGISTER, counted forged, and neither renews the worker nor revokes anything.
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
local last_reply = arg_int(ARGV[4], 'last_reply_call_no', 0, 9007199254740991)
local n = arg_pairs(ARGV, 5, 'held', MAX_LISTED)
arg_secret(ARGV[6 + 2 * n])
local conn = arg_opt_conn(ARGV, 7 + 2 * n)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(LAZY_RECLAIM)
local ws = touch_worker(worker, winc, true)
if ws == 'forged' then forged(nil, worker, nil, 'heartbeat') end
if ws == 'lost' or ws == 'forged' then return done({C.REREGISTER, {}, job_info()}) end
set_conn(worker, winc, conn)  -- this call's connection (CLIENT ID), if sent
local held = {}
for k = 1, n do held[ARGV[4 + 2 * k]] = ARGV[5 + 2 * k] end
local m = worker .. '|' .. winc
local items = rcall('ZRANGEBYLEX', K_OWNED, '[' .. m .. '|', '(' .. m .. '|\255',
  'LIMIT', 0, MAX_HELD)
for _, item in lipairs(items) do
  local task = smatch(item, '|([^|]*)$')
  local l = lease_for(task, worker, winc)
  if not lease_is_current(l) or member(l.worker, l.winc, task) ~= item then
    rcall('ZREM', K_OWNED, item)
  elseif held[task] == nil and tonum(l.calls) <= last_reply then
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
  if not holds_secret(l, worker, winc, tok) then
    revoked[#revoked + 1] = tonum(task)
  end
end
local code = C.OK
if ws == 'drain' then code = C.DRAINING end
return done({code, revoked, job_info()})
