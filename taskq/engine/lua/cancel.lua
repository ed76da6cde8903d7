#!lua flags=allow-oom
-- cancel: the job will never give work again; every lease becomes stale at once.
-- It frees the lease indexes and writes a flag, a summary and an event, so it runs out of
-- memory too (allow-oom): the operator's way out.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any)
-- returns: {code}
local rcall = redis.call
local mincr, mset = lib.meta.mincr, lib.meta.mset
local arg_id, arg_len, args_bad = lib.args.arg_id, lib.args.arg_len, lib.args.args_bad
local broadcast, event = lib.events.broadcast, lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local save_summary = lib.passes.save_summary
arg_id(ARGV[1], 'job_inc', true)
arg_len(ARGV, 1)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
if CALL.STATE == 'cancelled' then return done({C.OK}) end
if CALL.STATE == 'completed' then return done({C.JOB_COMPLETED}) end
save_summary('cancelled')
CALL.ROUND = mincr(F.ROUND)
rcall('UNLINK', K_FRONT, K_OWNED, K_DEADLINES, K_RESERVED, K_STARTED)
mset(F.STATE, 'cancelled', F.REASON, '', F.NLEASED, 0, F.NRESERVED, 0)
CALL.STATE = 'cancelled'
event('job_cancelled')
broadcast()
return done({C.OK})
