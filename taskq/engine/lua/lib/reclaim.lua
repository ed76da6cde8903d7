-- reclaim.lua: the leases of lost workers and of tasks past their timeout, taken back
-- (lazily by the hot verbs within a budget, wholly by the reaper and register).
local rcall, tonum, smatch, mmin, lipairs = redis.call, tonumber, string.match, math.min, ipairs
local fmt, mnum, mput = lib.meta.fmt, lib.meta.mnum, lib.meta.mput
local jnow_s = lib.call.jnow_s
local lease_for, lease_is_current, member, parse_lease, task_tt =
  lib.leases.lease_for, lib.leases.lease_is_current, lib.leases.member, lib.leases.parse_lease,
  lib.leases.task_tt
local expire = lib.endings.expire
local check_pass_end = lib.passes.check_pass_end
local remove_worker = lib.workers.remove_worker

-- Reclaims what lost workers held and leases past their task timeout; at most `budget`
-- leases. Returns (reclaimed, more_left).
-- The hint F.DUE is at most the earliest worker and task deadline (and at most a second
-- ahead), so while JNOW has not passed it nothing can be due and the calls of the hot
-- path skip both scans; `force` (the reaper, register) scans regardless. A deadline is
-- only ever set below it by a new worker, a task started with a timeout shorter than a
-- second (`due_by`) or a shorter auto timeout (recompute_auto_timeout); touching a worker
-- only moves its deadline later. A task's deadline is its start (the started zset's
-- score) + the current task timeout. bench/HISTORY.md has the measurement.
local function reclaim(budget, force)
  if not force and CALL.JNOW <= mnum(F.DUE) then return 0, false end
  local did, more = 0, false
  local lost = rcall('ZRANGEBYSCORE', K_WORKERS, '-inf', '(' .. jnow_s(),
    'WITHSCORES', 'LIMIT', 0, budget)
  for i = 1, #lost, 2 do
    local m, deadline = lost[i], tonum(lost[i + 1])
    local mw, mi = smatch(m, '^(.*)|([^|]*)$')
    local room = budget - did
    if room <= 0 then more = true; break end
    local items = rcall('ZRANGEBYLEX', K_OWNED, '[' .. m .. '|', '(' .. m .. '|\255',
      'LIMIT', 0, room)
    for _, item in lipairs(items) do
      local task = smatch(item, '|([^|]*)$')
      local l = lease_for(task, mw, mi)
      if lease_is_current(l) and member(l.worker, l.winc, task) == item then
        expire(task, l, 'worker_lost', deadline)
        did = did + 1
      else
        rcall('ZREM', K_OWNED, item)
      end
    end
    if #items < room then remove_worker(m, 'worker_lost') else more = true end
  end
  if #lost / 2 >= budget then more = true end  -- lost workers beyond the LIMIT may wait
  local tt = task_tt()
  if did < budget and tt > 0 then
    -- started before JNOW - tt: past the task timeout (the current one, from the start)
    local limit = budget - did
    local exp = rcall('ZRANGEBYSCORE', K_STARTED, '-inf', '(' .. fmt(CALL.JNOW - tt),
      'WITHSCORES', 'LIMIT', 0, limit)
    for i = 1, #exp, 2 do
      local task = exp[i]
      local l = parse_lease(rcall('HGET', K_LEASES, task))
      if not lease_is_current(l) and mnum(F.P_BACKUPS) > 0 then
        -- a split task's tail piece standing for it once its head was acked (split.lua)
        l = parse_lease(rcall('HGET', K_LEASES, 'b:' .. task))
        if l then l.backup = true end
      end
      if lease_is_current(l) and l.st == 'S' then
        expire(task, l, 'task_timeout', tonum(exp[i + 1]) + tt)
        did = did + 1
      else
        rcall('ZREM', K_STARTED, task)
      end
    end
    if #exp / 2 >= limit then more = true end  -- (WITHSCORES: two entries per task)
  end
  if did > 0 then check_pass_end() end
  if not more then
    local due = CALL.JNOW + 1000  -- a second ahead at most
    local w = rcall('ZRANGE', K_WORKERS, 0, 0, 'WITHSCORES')
    if #w > 0 then due = mmin(due, tonum(w[2])) end
    if tt > 0 then
      local d = rcall('ZRANGE', K_STARTED, 0, 0, 'WITHSCORES')
      if #d > 0 then due = mmin(due, tonum(d[2]) + tt) end
    end
    mput(F.DUE, due)
  end
  return did, more
end

return {reclaim = reclaim}
