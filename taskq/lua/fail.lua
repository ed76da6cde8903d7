#!lua
-- fail: the trainer reports that its tasks failed.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, error_text, n, (task, token) x n, secret
-- returns: {code, {result per task}}
-- One failing task is charged a failure (dead at max_failures or max_attempts); a batch
-- of several goes back uncharged, each marked solo, to be leased alone until it is acked
-- or fails alone, so one bad task does not charge its neighbours.
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(100)  -- a worker past its deadline has lost its leases before it writes
local worker, winc, why = ARGV[2], ARGV[3], string.sub(ARGV[4], 1, 500)
local n = tonumber(ARGV[5])
use_secret(ARGV[6 + 2 * n])
local out = end_held(ARGV, 5, n, worker, winc, 'F', 'fail', failed_one, why)
check_pass_end()
return done({C.OK, out})
