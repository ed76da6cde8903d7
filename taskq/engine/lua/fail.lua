#!lua
-- fail: the trainer reports that its tasks failed.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc, worker, winc, error_text, n, (task, token) x n, secret
-- returns: {code, {result per task}}
-- One failing task is charged a failure (dead at max_failures or max_attempts); a batch
-- of several goes back uncharged, each marked solo, to be leased alone until it is acked
-- or fails alone, so one bad task does not charge its neighbours.
local ssub = string.sub
local arg_fail, arg_id, arg_len, arg_pairs, arg_text, args_bad = lib.args.arg_fail,
  lib.args.arg_id, lib.args.arg_len, lib.args.arg_pairs, lib.args.arg_text, lib.args.args_bad
local done, open_job = lib.call.done, lib.call.open_job
local arg_secret = lib.secrets.arg_secret
local end_held, failed_one = lib.endings.end_held, lib.endings.failed_one
local check_pass_end = lib.passes.check_pass_end
local reclaim = lib.reclaim.reclaim
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
local why = ssub(arg_text(ARGV[4], 'error_text', 65536), 1, 500)
local n = arg_pairs(ARGV, 5, 'tasks', MAX_BATCH)
if n > 1 then
  -- a task named twice would make a batch of one task: it would go back uncharged
  local named = {}
  for k = 1, n do
    local task = ARGV[4 + 2 * k]
    if named[task] then arg_fail('tasks', 'a task named twice', task); break end
    named[task] = true
  end
end
arg_secret(ARGV[6 + 2 * n])
arg_len(ARGV, 6 + 2 * n)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(LAZY_RECLAIM)  -- a worker past its deadline has lost its leases before it writes
local out = end_held(ARGV, 5, n, worker, winc, 'F', 'fail', failed_one, why)
check_pass_end()
return done({C.OK, out})
