#!lua
-- heartbeat: the worker's whole truth in one call.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc, worker, winc, last_reply_call_no, n, (task, token) x n, secret
--   [, input wait][, conn id]
-- returns: {code (OK | DRAINING | REREGISTER), {revoked task ids}, {pass, gen, state, reason}}
-- Renews liveness; revokes leases granted to this worker by calls up to the last reply
-- it received that it did not list (their reply was lost); answers the listed leases
-- that are no longer current. Only with the worker's lease secret: another is answered
-- REREGISTER, counted forged, and neither renews the worker nor revokes anything.
-- The optional input wait (taskq/inputwait.py) is the training loop's data wait since the
-- worker's last answered beat: 'i' then n, wait_us, step_us, recent_wait_us,
-- recent_rest_us (the worker's own last minute: its steps and idle), the 13 bucket counts of its waits
-- (inputwait.WAIT_BOUNDS_S), which sum to n, and idle_us (the loop's wait while its trainer
-- had nothing to lease: a stream's appends; not in wait_us); its first byte tells it from
-- a connection id.
-- It is added to the job's totals (F.IW), its last two 60 s windows (F.IW_WIN) and its
-- three worst trainers (F.IW_WORST): a few fields, whatever the number of trainers.
local rcall, tonum, smatch, sfind, sbyte, mmin, mfloor, tconcat, ltype, lipairs =
  redis.call, tonumber, string.match, string.find, string.byte, math.min, math.floor, table.concat,
  type, ipairs
local fmt, mincr, mset_s, split = lib.meta.fmt, lib.meta.mincr, lib.meta.mset_s, lib.meta.split
local arg_fail, arg_id, arg_int, arg_opt_conn, arg_pairs, args_bad =
  lib.args.arg_fail, lib.args.arg_id, lib.args.arg_int, lib.args.arg_opt_conn, lib.args.arg_pairs,
  lib.args.args_bad
local event = lib.events.event
local done, job_info, open_job = lib.call.done, lib.call.job_info, lib.call.open_job
local arg_secret, forged = lib.secrets.arg_secret, lib.secrets.forged
local end_lease, holds_secret, lease_for, lease_is_current, member =
  lib.leases.end_lease, lib.leases.holds_secret, lib.leases.lease_for, lib.leases.lease_is_current,
  lib.leases.member
local survives, to_front = lib.endings.survives, lib.endings.to_front
local set_conn, touch_worker = lib.workers.set_conn, lib.workers.touch_worker
local reclaim = lib.reclaim.reclaim
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
local last_reply = arg_int(ARGV[4], 'last_reply_call_no', 0, 9007199254740991)
local n = arg_pairs(ARGV, 5, 'held', MAX_LISTED)
arg_secret(ARGV[6 + 2 * n])
local iw, at = nil, 7 + 2 * n
local iw_arg = ARGV[at]
if ltype(iw_arg) == 'string' and sbyte(iw_arg, 1) == 105 then  -- 'i'
  at, iw = at + 1, {}
  local ok = #iw_arg <= 400 and sfind(iw_arg, '^i%d[%d,]*$') and sbyte(iw_arg, -1) ~= 44
    and not sfind(iw_arg, ',,', 1, true)
  if ok then
    for d in string.gmatch(iw_arg, '%d+') do
      if #iw > 19 or #d > 15 then ok = false; break end
      iw[#iw + 1] = d + 0
    end
  end
  local sum = 0
  if ok and #iw == 19 then for k = 6, 18 do sum = sum + iw[k] end end
  if not ok or #iw ~= 19 or sum ~= iw[1] then
    arg_fail('input wait',
      'not n,wait,step,recent wait,recent step, 13 counts summing to n and idle', iw_arg)
  end
end
local conn = arg_opt_conn(ARGV, at)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(LAZY_RECLAIM)
local ws = touch_worker(worker, winc, true, nil, true)
if ws == 'forged' then forged(nil, worker, nil, 'heartbeat') end
if ws == 'lost' or ws == 'forged' then return done({C.REREGISTER, {}, job_info()}) end
set_conn(worker, winc, conn)  -- this call's connection (CLIENT ID), if sent
if iw then
  -- rec: "[start_ms,]n,wait_us,step_us,<13 counts>,idle_us" (nil or malformed: zeros; one
  -- made before idle_us: idle 0), with this beat's figures added; `start`: a window's
  -- start, kept first. Only the numbers that change are parsed and formatted again (a
  -- formatting costs ~0.5 us: most buckets get 0)
  local stored = rcall('HMGET', K_META, N.IW, N.IW_WIN, N.IW_WORST)
  local function plus(rec, start)
    local nums, k, base = {}, 0, start and 1 or 0
    if rec then
      for d in string.gmatch(rec, '[^,]+') do
        k = k + 1
        if k > 18 then break end
        nums[k] = d
      end
    end
    if k == base + 16 then
      nums[base + 17] = '0'
    elseif k ~= base + 17 then
      for j = 1, base + 17 do nums[j] = '0' end
    end
    if start then nums[1] = fmt(start) end
    for j = 1, 17 do
      local add = iw[j <= 3 and j or j + 2]
      if add ~= 0 then nums[base + j] = fmt((tonum(nums[base + j]) or 0) + add) end
    end
    return tconcat(nums, ',')
  end
  mset_s(F.IW, plus(stored[1] or nil, nil))
  local win_ms = 60000
  local start = CALL.NOW - CALL.NOW % win_ms
  local cur, prev = smatch(stored[2] or '', '^([^|]*)|?(.*)$')
  local cur_start = tonum(smatch(cur, '^(%d+),') or '')
  if cur_start ~= start then
    if cur_start == start - win_ms then prev = cur else prev = '' end
    cur = nil
  end
  mset_s(F.IW_WIN, plus(cur, start) .. '|' .. prev)
  -- the worst three by their own last minute, in ppm of loop time; one record each,
  -- dropped a minute after its trainer's last beat
  local ranked, f = {}, split(stored[3] or '')
  for k = 1, mmin(#f - 2, 7), 3 do
    local seen_ms = tonum(f[k + 2]) or 0
    if f[k] ~= worker and seen_ms > CALL.NOW - win_ms then
      ranked[#ranked + 1] = {tonum(f[k + 1]) or 0, f[k] .. '|' .. f[k + 1] .. '|' .. f[k + 2]}
    end
  end
  if iw[4] + iw[5] > 0 then
    local ppm = mfloor(iw[4] * 1000000 / (iw[4] + iw[5]))
    ranked[#ranked + 1] = {ppm, worker .. '|' .. fmt(ppm) .. '|' .. fmt(CALL.NOW)}
  end
  table.sort(ranked, function(a, b) return a[1] > b[1] end)
  local out = {}
  for k = 1, mmin(3, #ranked) do out[k] = ranked[k][2] end
  mset_s(F.IW_WORST, tconcat(out, '|'))
end
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
