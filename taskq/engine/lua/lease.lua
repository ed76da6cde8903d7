#!lua
-- lease: grant up to `want` tasks to a worker (reclaiming expired leases it meets).
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc, worker, winc, want, call_no, mode (S started | R reserved | F first
--       started, rest reserved), expect_pass (-1 any), secret
-- returns: {code, {{task, token, attempt, chunks_json, started}...}, wait_ms,
--           {pass, gen, state, reason}}
-- A call whose secret is not the worker's (the worker record's digest) is answered like
-- a lost worker's, counted forged, and grants nothing. (A worker is renewed by its
-- heartbeats, not here: docs/design.md, "Two clocks".)
local arg_enum, arg_id, arg_int, arg_len, args_bad =
  lib.args.arg_enum, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.args_bad
local done, job_info, open_job = lib.call.done, lib.call.job_info, lib.call.open_job
local arg_secret, forged = lib.secrets.arg_secret, lib.secrets.forged
local touch_worker = lib.workers.touch_worker
local reclaim = lib.reclaim.reclaim
local lease_part = lib.dispatch.lease_part
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
local want = arg_int(ARGV[4], 'want', 0, MAX_BATCH)
local call_no = arg_int(ARGV[5], 'call_no', 0, 9007199254740991)
local mode = arg_enum(ARGV[6], 'mode', 'S R F')
local expect_pass = arg_int(ARGV[7], 'expect_pass', -1, 9007199254740991)
arg_secret(ARGV[8])
arg_len(ARGV, 8)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end

local _, left = reclaim(LAZY_RECLAIM)
local ws = touch_worker(worker, winc, true, nil, false, left)
if ws == 'forged' then forged(nil, worker, nil, 'lease') end
if ws ~= 'ok' and ws ~= 'drain' then return done({C.REREGISTER, {}, 0, job_info()}) end
if ws == 'drain' then return done({C.DRAINING, {}, 0, job_info()}) end
local r = lease_part(worker, winc, want, call_no, mode, expect_pass)
return done({r[1], r[2], r[3], job_info()})
