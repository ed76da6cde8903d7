#!lua
-- clock: advance a job's manual clock (tests only).
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), advance_ms, silent (1: not traffic, so the silence rule may apply)
-- returns: {code, now_ms}
local rcall = redis.call
local arg_enum, arg_id, arg_int, arg_len, args_bad =
  lib.args.arg_enum, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.args_bad
arg_id(ARGV[1], 'job_inc', true)
local advance = arg_int(ARGV[2], 'advance_ms', 0, 31536000000)
arg_enum(ARGV[3], 'silent', '0 1')
arg_len(ARGV, 3)
local bad = args_bad()
if bad then return bad end
local cur = rcall('HGET', K_META, N.INC)
if not cur or (ARGV[1] ~= '' and ARGV[1] ~= cur) then return {C.JOB_NOT_FOUND, 0} end
if rcall('HGET', K_META, N.MCLOCK) ~= '1' then return {C.INVALID, 0} end
local now = rcall('INCRBY', K_CLOCK, advance)
if ARGV[3] ~= '1' then rcall('HSET', K_META, N.SEEN, now) end
return {C.OK, now}
