#!lua
-- reset: restart the current pass (a new attempt of it; its leases become stale).
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), expected_pass (-1 = current)
-- returns: {code, pass}; LOCKED (with the checkpoint's id 3rd) while a rewind is half
-- done: its position is half copied, nothing is written; {INVALID, why} for a trimmed
-- stream (trim.lua: its done tasks' descriptors are gone)
local mget, mincr, mnum = lib.meta.mget, lib.meta.mincr, lib.meta.mnum
local arg_id, arg_int, arg_len, args_bad =
  lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.args_bad
local done, open_job = lib.call.done, lib.call.open_job
local check_pass_end, save_summary, start_pass =
  lib.passes.check_pass_end, lib.passes.save_summary, lib.passes.start_pass
arg_id(ARGV[1], 'job_inc', true)
local expected = arg_int(ARGV[2], 'expected_pass', -1, 9007199254740991)
arg_len(ARGV, 2)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err, 0}) end
local p = mnum(F.PASS)
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED, p}) end
if CALL.STATE == 'completed' then return done({C.JOB_COMPLETED, p}) end
if (mget(F.RW_OPEN) or '') ~= '' then return done({C.LOCKED, p, mget(F.RW_OPEN)}) end
if expected >= 0 and expected ~= p then return done({C.PASS_MISMATCH, p}) end
if mnum(F.TRIM_W) > 0 then
  return done({C.INVALID, 'the job is trimmed below task ' .. mget(F.TRIM_W)
    .. ': its done tasks cannot be read again; rewind to a kept checkpoint instead'})
end
save_summary('reset')
mincr(F.P_RESETS)
start_pass(p, 'pass_reset')
check_pass_end()  -- every task dead: waiting (all_dead) at once, not running with nothing
return done({C.OK, p})
