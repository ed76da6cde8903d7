#!lua flags=allow-oom
-- pause: trainers get no new leases (they wait, as in a waiting state) and keep what they
-- hold; acks, heartbeats and reclaim go on. Only a flag, so it runs out of memory too.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any)
-- returns: {code}
local mget, mset = lib.meta.mget, lib.meta.mset
local arg_id, arg_len, args_bad = lib.args.arg_id, lib.args.arg_len, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
arg_id(ARGV[1], 'job_inc', true)
arg_len(ARGV, 1)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED}) end
if CALL.STATE == 'completed' then return done({C.JOB_COMPLETED}) end
if mget(F.PAUSED) == '1' then return done({C.OK}) end
mset(F.PAUSED, '1')
event('job_paused')
return done({C.OK})
