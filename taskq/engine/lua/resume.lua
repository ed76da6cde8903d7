#!lua
-- resume: end a pause; every waiting trainer is woken (a new generation) to lease again.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any)
-- returns: {code}
local mget, mset = lib.meta.mget, lib.meta.mset
local broadcast, event = lib.events.broadcast, lib.events.event
local done, open_by_inc = lib.call.done, lib.call.open_by_inc
local opened = open_by_inc(ARGV)
if opened then return opened end
if mget(F.PAUSED) ~= '1' then return done({C.OK}) end
mset(F.PAUSED, '0')
event('job_resumed')
broadcast()
return done({C.OK})
