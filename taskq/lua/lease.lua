#!lua
-- lease: grant up to `want` tasks to a worker (reclaiming expired leases it meets).
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, want, call_no, mode (S started | R reserved | F first
--       started, rest reserved), expect_pass (-1 any), secret
-- returns: {code, {{task, token, attempt, chunks_json, started}...}, wait_ms,
--           {pass, gen, state, reason}}
-- A call whose secret is not the worker's (the worker record's digest) is answered like
-- a lost worker's, counted forged, and neither renews the worker nor grants anything.
local err = open_job(ARGV[1])
if err then return done({err}) end
local worker, winc = ARGV[2], ARGV[3]
local want, call_no = tonumber(ARGV[4]), tonumber(ARGV[5])
use_secret(ARGV[8])

reclaim(100)
local ws = touch_worker(worker, winc, true)
if ws == 'forged' then forged(nil, worker, nil, 'lease') end
if ws ~= 'ok' and ws ~= 'drain' then return done({C.REREGISTER, {}, 0, job_info()}) end
if ws == 'drain' then return done({C.DRAINING, {}, 0, job_info()}) end
local r = lease_part(worker, winc, want, call_no, ARGV[6], tonumber(ARGV[7]))
return done({r[1], r[2], r[3], job_info()})
