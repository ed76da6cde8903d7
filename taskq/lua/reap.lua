#!lua
-- reap: reclaim expired leases and lost workers' leases, in a bounded batch.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc ('' = any), budget, lock_ms, reaper_id
-- returns: {code (OK | LOCKED), reclaimed, more (1|0)}
-- A short per-job lock keeps several reapers from stampeding; atomicity alone already
-- keeps any lease from being re-dispatched twice.
local holder = redis.call('GET', K_LOCK)
if holder and holder ~= ARGV[4] then return done({C.LOCKED, 0, 0}) end
local err = open_job(ARGV[1])
if err then return done({err, 0, 0}) end
redis.call('SET', K_LOCK, ARGV[4], 'PX', tonumber(ARGV[3]))
local did, more = reclaim(tonumber(ARGV[2]), true)
return done({C.OK, did, more and 1 or 0})
