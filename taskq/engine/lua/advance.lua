#!lua
-- advance: start the next pass (compare-and-set on the pass number).
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), expected_pass, force (1|0)
-- returns: {code, pass_after, skipped}; LOCKED (with the checkpoint's id 4th) while a
-- rewind is half done: its position is half copied, nothing is written
-- Without force it refuses while the pass has work left (PASS_INCOMPLETE); with force
-- the rest of the pass is recorded as skipped and its leases become stale (by round).
local mmax = math.max
local fmt, mget, mnum, mset = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.mset
local arg_enum, arg_id, arg_int, arg_len, args_bad =
  lib.args.arg_enum, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local check_pass_end, dead_and_done, finish_pass, live_tasks, recount_done, start_pass =
  lib.passes.check_pass_end, lib.passes.dead_and_done, lib.passes.finish_pass,
  lib.passes.live_tasks, lib.passes.recount_done, lib.passes.start_pass
arg_id(ARGV[1], 'job_inc', true)
local expected = arg_int(ARGV[2], 'expected_pass', 0, 9007199254740991)
local force = arg_enum(ARGV[3], 'force', '0 1')
arg_len(ARGV, 3)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err, 0, 0}) end
local p = mnum(F.PASS)
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED, p, 0}) end
if CALL.STATE == 'completed' then return done({C.JOB_COMPLETED, p, 0}) end
if (mget(F.RW_OPEN) or '') ~= '' then return done({C.LOCKED, p, 0, mget(F.RW_OPEN)}) end
if expected ~= p then return done({C.PASS_MISMATCH, p, 0}) end
if CALL.STATE == 'waiting' and mget(F.REASON) == 'manual_advance' then
  start_pass(p + 1, 'pass_started')
  check_pass_end()  -- every task dead: waiting (all_dead) at once
  return done({C.OK, p + 1, 0})
end
if force ~= '1' then return done({C.PASS_INCOMPLETE, p, 0}) end
-- what is skipped is what the sets say is left: live tasks not in the done set
local live = live_tasks()
local wrong = dead_and_done(true)
if wrong and wrong > 0 then event('recount', 'dead_done', fmt(wrong)) end
local skipped = mmax(0, live - recount_done())
mset(F.P_SKIPPED, skipped)
CALL.STATE = 'running'
finish_pass('skipped')
if CALL.STATE == 'waiting' then start_pass(p + 1, 'pass_started') end
check_pass_end()  -- every task dead: waiting (all_dead) at once
return done({C.OK, mnum(F.PASS), skipped})
