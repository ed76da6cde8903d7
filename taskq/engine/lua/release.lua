#!lua
-- release: the trainer gives tasks back unfinished (graceful leave, SIGTERM, break).
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc, worker, winc, n, (task, token) x n, secret
-- returns: {code, {result per task}}
-- A started task counts an attempt (dead at max_attempts); a reserved one counts nothing.
local arg_id, arg_len, arg_pairs, args_bad =
  lib.args.arg_id, lib.args.arg_len, lib.args.arg_pairs, lib.args.args_bad
local done, open_job = lib.call.done, lib.call.open_job
local arg_secret = lib.secrets.arg_secret
local end_held, released_one = lib.endings.end_held, lib.endings.released_one
local check_pass_end = lib.passes.check_pass_end
local reclaim = lib.reclaim.reclaim
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
local n = arg_pairs(ARGV, 4, 'tasks', MAX_BATCH)
arg_secret(ARGV[5 + 2 * n])
arg_len(ARGV, 5 + 2 * n)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(LAZY_RECLAIM)  -- a worker past its deadline has lost its leases before it writes
local out = end_held(ARGV, 4, n, worker, winc, 'R', 'release', released_one)
check_pass_end()
return done({C.OK, out})
