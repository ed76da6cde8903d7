#!lua
-- release: the trainer gives tasks back unfinished (graceful leave, SIGTERM, break).
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, n, (task, token) x n, secret
-- returns: {code, {result per task}}
-- A started task counts an attempt (dead at max_attempts); a reserved one counts nothing.
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(100)  -- a worker past its deadline has lost its leases before it writes
local worker, winc = ARGV[2], ARGV[3]
local n = tonumber(ARGV[4])
use_secret(ARGV[5 + 2 * n])
local out = end_held(ARGV, 4, n, worker, winc, 'R', 'release', released_one)
check_pass_end()
return done({C.OK, out})
