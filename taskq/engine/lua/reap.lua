#!lua
-- reap: reclaim expired leases and lost workers' leases, in a bounded batch.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), budget, lock_ms, reaper_id
-- returns: {code (OK | LOCKED), reclaimed, more (1|0)}
-- A short per-job lock keeps several reapers from stampeding; atomicity alone already
-- keeps any lease from being re-dispatched twice.
local rcall, mmin = redis.call, math.min
local arg_id, arg_int, arg_len, args_bad =
  lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.args_bad
local done, open_job = lib.call.done, lib.call.open_job
local reclaim = lib.reclaim.reclaim
arg_id(ARGV[1], 'job_inc', true)
local budget = mmin(arg_int(ARGV[2], 'budget', 1, 4294967295), MAX_RECLAIM)
local lock_ms = arg_int(ARGV[3], 'lock_ms', 1, 86400000)
local reaper_id = arg_id(ARGV[4], 'reaper_id')
arg_len(ARGV, 4)
local bad = args_bad()
if bad then return bad end
local holder = rcall('GET', K_LOCK)
if holder and holder ~= reaper_id then return done({C.LOCKED, 0, 0}) end
local err = open_job(ARGV[1])
if err then return done({err, 0, 0}) end
rcall('SET', K_LOCK, reaper_id, 'PX', lock_ms)
local did, more = reclaim(budget, true)
return done({C.OK, did, more and 1 or 0})
