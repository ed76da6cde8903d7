#!lua flags=allow-oom
-- cancel: the job will never give work again; every lease becomes stale at once.
-- It frees the lease indexes and writes a flag, a summary and an event, so it runs out of
-- memory too (allow-oom): the operator's way out.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any)
-- returns: {code}
local rcall = redis.call
local mincr, mset = lib.meta.mincr, lib.meta.mset
local broadcast, event = lib.events.broadcast, lib.events.event
local done, open_by_inc = lib.call.done, lib.call.open_by_inc
local save_summary = lib.passes.save_summary
local opened = open_by_inc(ARGV)
if opened then return opened end
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
