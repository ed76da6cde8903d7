#!lua
-- retry: dead tasks back to the front of the current pass (reopening a completed
-- job's last pass, or a job waiting because every task was dead).
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), n, task ids x n (n = 0: up to MAX_RETRY dead tasks)
-- (a mixed job: a dead slot's copy is live again; n = 0 also brings back dead copies no
-- slot of the pass is charged with yet, counted in retried; dead_left counts copies)
-- returns: {code, retried, dead_left}; a checkpoint being written is not affected (its cut
-- was taken in one call); LOCKED (with the checkpoint's id 4th) while a
-- rewind is half done: its position is half copied, nothing is written
local rcall, mmin, mmax, lipairs = redis.call, math.min, math.max, ipairs
local mget, mincr, mnum, mset = lib.meta.mget, lib.meta.mincr, lib.meta.mnum, lib.meta.mset
local arg_id, arg_int, arg_len, arg_task, args_bad =
  lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.arg_task, lib.args.args_bad
local broadcast, event, wake_one = lib.events.broadcast, lib.events.event, lib.events.wake_one
local done, open_job = lib.call.done, lib.call.open_job
local recount_done = lib.passes.recount_done
local copy_at = lib.mixslot.copy_at
local retried_split = lib.pieces.retried
arg_id(ARGV[1], 'job_inc', true)
local n = arg_int(ARGV[2], 'n', 0, MAX_RETRY)
for k = 1, n do arg_task(ARGV[2 + k], 'task') end
arg_len(ARGV, 2 + n)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err, 0, 0}) end
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED, 0, 0}) end
if (mget(F.RW_OPEN) or '') ~= '' then return done({C.LOCKED, 0, 0, mget(F.RW_OPEN)}) end
local ids = {}
if n == 0 then
  ids = rcall('SRANDMEMBER', K_DEAD, MAX_RETRY)
else
  for k = 1, n do ids[k] = ARGV[2 + k] end
end
local mixed = mget(F.SHUFFLE) == 'm'
local retried = 0
local was_done = 0
for _, task in lipairs(ids) do
  if rcall('SREM', K_DEAD, task) == 1 then
    if mixed then  -- (a mixed job's slot: its copy is live again, lib/mix.lua)
      local copy = copy_at(task)
      if copy then rcall('SREM', K_MIXDEAD, copy) end
    end
    rcall('SETBIT', K_DEADBITS, task, 0)
    rcall('HDEL', K_COUNTS, 'f:' .. task, 'a:' .. task, 's:' .. task)
    -- live again, so it must be acked in this attempt: a done bit (never set on a dead
    -- task, by construction) is cleared and the count made the set's size again
    if rcall('SETBIT', K_DONE, task, 0) == 1 then was_done = was_done + 1 end
    -- (a split task: each piece not acked, from its own progress, lib/split.lua)
    if mnum(F.P_BACKUPS) == 0 or retried_split(task) then
      CALL.FRONT_EMPTY = false
      rcall('ZADD', K_FRONT, mincr(F.FSEQ), task)
    end
    event('retried', 'task', task)
    retried = retried + 1
  end
end
if mixed and n == 0 and #ids < MAX_RETRY then
  -- dead copies no slot of this pass is charged with yet: live again, charged as any
  for _, copy in lipairs(rcall('SRANDMEMBER', K_MIXDEAD, MAX_RETRY - #ids)) do
    rcall('SREM', K_MIXDEAD, copy)
    retried = retried + 1
  end
end
if was_done > 0 then recount_done() end
if retried > 0 and CALL.STATE ~= 'running' then  -- (a paused job stays paused: a flag)
  mset(F.STATE, 'running', F.REASON, '')
  CALL.STATE = 'running'
  event('pass_reopened', 'round', CALL.ROUND)
  broadcast()
elseif retried > 0 then
  for _ = 1, mmin(retried, 1000) do wake_one() end
end
local left = rcall('SCARD', K_DEAD)
if mixed then left = mmax(left, rcall('SCARD', K_MIXDEAD)) end
return done({C.OK, retried, left})
