#!lua
-- seal: close a stream job: nothing more is appended, and its pass ends (the job
-- completes, after its last pass) once every task appended is done; a stream of no task
-- completes at the seal. Idempotent: a sealed stream is left as it is, and says so.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any)
-- returns: {OK, tasks, already} (the tasks appended in all; already 1: it was sealed
--   before, nothing changed); {INVALID, why} for a job that is not a stream; JOB_CANCELLED
local fmt, mget, mset = lib.meta.fmt, lib.meta.mget, lib.meta.mset
local tasks_n = lib.meta.tasks_n
local arg_id, arg_len, args_bad = lib.args.arg_id, lib.args.arg_len, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local check_pass_end = lib.passes.check_pass_end
arg_id(ARGV[1], 'job_inc', true)
arg_len(ARGV, 1)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err, 0, 0}) end
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED, 0, 0}) end
local stream = mget(F.STREAM) or ''
if stream == '' then
  return done({C.INVALID, 'not a stream job (create it with stream=True / --stream)'})
end
if stream ~= 'open' then return done({C.OK, tasks_n(), 1}) end
if mget(F.FEEDS) then  -- (its tasks go to the mixed job it feeds: sealed there, append.lua)
  local tag = '{(.*)}'  -- (the job's name, in its keys' hash tag)
  local name, mix = string.match(K_META, tag) or 'this job', mget(F.FEEDS)
  return done({C.INVALID, name .. ' feeds mixed job \'' .. mix .. '\': seal with --feed ' .. name
    .. ' to \'' .. mix .. '\''})
end
mset(F.STREAM, 'sealed')
event('stream_sealed', 'tasks', fmt(tasks_n()))
-- every task appended may be done already (or none was appended): the pass ends here,
-- not at a later ack
check_pass_end()
return done({C.OK, tasks_n(), 0})
