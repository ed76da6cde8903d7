#!lua
-- lease: grant up to `want` tasks to a worker (reclaiming expired leases it meets).
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, want, call_no, mode (S started | R reserved | F first
--       started, rest reserved), expect_pass (-1 any)
-- returns: {code, {{task, token, attempt, chunks_json, started}...}, wait_ms,
--           {pass, gen, state, reason}}
local err = open_job(ARGV[1])
if err then return done({err}) end
local worker, winc = ARGV[2], ARGV[3]
local want, call_no = tonumber(ARGV[4]), tonumber(ARGV[5])

reclaim(100)
local ws = touch_worker(worker, winc)
if ws == 'lost' then return done({C.REREGISTER, {}, 0, job_info()}) end
if ws == 'drain' then return done({C.DRAINING, {}, 0, job_info()}) end
local r = lease_part(worker, winc, want, call_no, ARGV[6], tonumber(ARGV[7]))
return done({r[1], r[2], r[3], job_info()})
