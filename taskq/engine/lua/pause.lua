#!lua flags=allow-oom
-- pause: trainers get no new leases (they wait, as in a waiting state) and keep what they
-- hold; acks, heartbeats and reclaim go on. Only a flag, so it runs out of memory too.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any)
-- returns: {code}
local mget, mset = lib.meta.mget, lib.meta.mset
local event = lib.events.event
local done, open_by_inc = lib.call.done, lib.call.open_by_inc
local opened = open_by_inc(ARGV)
if opened then return opened end
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED}) end
if CALL.STATE == 'completed' then return done({C.JOB_COMPLETED}) end
if mget(F.PAUSED) == '1' then return done({C.OK}) end
mset(F.PAUSED, '1')
event('job_paused')
return done({C.OK})
