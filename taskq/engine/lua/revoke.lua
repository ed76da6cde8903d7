#!lua
-- revoke: an operator sends one task's lease back to the front (nothing counted).
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc ('' = any), task
-- returns: {code (OK | NOT_LEASED)}
arg_id(ARGV[1], 'job_inc', true)
local task = arg_task(ARGV[2], 'task')
arg_len(ARGV, 2)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
local l = parse_lease(rcall('HGET', K_LEASES, task))
if not lease_is_current(l) then return done({C.NOT_LEASED}) end
end_lease(task, l, 'V')
local b = other_lease(task, l)
if b then end_lease(task, b, 'V') end  -- its backup goes too: the task goes to the front
mincr(F.C_REVOKED)
event('revoked', 'task', task, 'worker', l.worker, 'reason', 'operator')
to_front(task)
return done({C.OK})
