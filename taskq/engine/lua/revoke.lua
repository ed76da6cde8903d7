#!lua
-- revoke: an operator sends one task's lease back to the front (nothing counted); a split
-- task's pieces go back each on its own (its tail piece alone once its head is acked).
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), task
-- returns: {code (OK | NOT_LEASED)}
local rcall = redis.call
local mincr = lib.meta.mincr
local arg_id, arg_len, arg_task, args_bad =
  lib.args.arg_id, lib.args.arg_len, lib.args.arg_task, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local end_lease, lease_is_current, other_lease, parse_lease =
  lib.leases.end_lease, lib.leases.lease_is_current, lib.leases.other_lease, lib.leases.parse_lease
local split_ended, split_rec = lib.split.split_ended, lib.pieces.split_rec
local to_front = lib.endings.to_front
arg_id(ARGV[1], 'job_inc', true)
local task = arg_task(ARGV[2], 'task')
arg_len(ARGV, 2)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
local l = parse_lease(rcall('HGET', K_LEASES, task))
local s = split_rec(task)
-- a split task whose head is acked or between holders: its tail piece alone
if s and not lease_is_current(l) then l = other_lease(task, {}) end
if not lease_is_current(l) then return done({C.NOT_LEASED}) end
local o = other_lease(task, l)
end_lease(task, l, 'V')
if o then end_lease(task, o, 'V') end  -- its backup or other piece goes too
mincr(F.C_REVOKED)
event('revoked', 'task', task, 'worker', l.worker, 'reason', 'operator')
if s then
  -- each piece of a split task goes back on its own (split.lua: split_ended), keeping
  -- what each read: the head to the front up to the split point, the tail to the orphans
  split_ended(task, l, false)
  if o then split_ended(task, o, false) end
else
  to_front(task)  -- a backup's task too: the task goes to the front
end
return done({C.OK})
