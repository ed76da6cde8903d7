#!lua
-- drain: ask one worker to finish its current task, then leave.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), worker
-- returns: {code (OK | WORKER_NOT_FOUND)}
local rcall, tconcat = redis.call, table.concat
local split = lib.meta.split
local arg_id, arg_len, args_bad = lib.args.arg_id, lib.args.arg_len, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
arg_id(ARGV[1], 'job_inc', true)
arg_id(ARGV[2], 'worker')
arg_len(ARGV, 2)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
local info = rcall('HGET', K_WINFO, ARGV[2])
if not info then return done({C.WORKER_NOT_FOUND}) end
local f = split(info)
f[6] = '1'
rcall('HSET', K_WINFO, ARGV[2], tconcat(f, '|'))
event('drain_requested', 'worker', ARGV[2])
return done({C.OK})
