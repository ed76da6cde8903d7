#!lua
-- resume: end a pause; every waiting trainer is woken (a new generation) to lease again.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any)
-- returns: {code}
local mget, mset = lib.meta.mget, lib.meta.mset
local arg_id, arg_len, args_bad = lib.args.arg_id, lib.args.arg_len, lib.args.args_bad
local broadcast, event = lib.events.broadcast, lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
arg_id(ARGV[1], 'job_inc', true)
arg_len(ARGV, 1)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
if mget(F.PAUSED) ~= '1' then return done({C.OK}) end
mset(F.PAUSED, '0')
event('job_resumed')
broadcast()
return done({C.OK})
