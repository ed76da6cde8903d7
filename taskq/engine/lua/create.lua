#!lua
-- create: flip a staged job live in one O(1) step (readers see all of it or none).
-- KEYS: the job's keys (keys.SCRIPT_KEYS) + staging, sizes (the hash of chunks written
--   before, a mixed job's under its copy ids, lib/mix.lua; its copies' sizes staged, a hash
--   of "<source>:<block>" -> '>I4' each of 256 tasks, when its weights count samples)
-- ARGV: replace (1|0), n_tasks (0: a stream's), then field, value pairs of the job's meta hash
-- returns: {code}
-- The chunks were written beforehand, pipelined, into the staging hash (with an EXPIRE).
local rcall, tonum, smatch, unpk = redis.call, tonumber, string.match, unpack
local fmt, mget, mset, pad_meta = lib.meta.fmt, lib.meta.mget, lib.meta.mset, lib.meta.pad_meta
local arg_enum, arg_fail, arg_int, arg_text, args_bad =
  lib.args.arg_enum, lib.args.arg_fail, lib.args.arg_int, lib.args.arg_text, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local drop_all = lib.mix.drop_all
arg_enum(ARGV[1], 'replace', '0 1')
local n_tasks = arg_int(ARGV[2], 'n_tasks', 0, 4294967295)
if #ARGV % 2 ~= 0 then arg_fail('ARGV', 'meta fields without a value', #ARGV) end
local stream, by_samples, blocks = false, false, 0
for k = 3, #ARGV, 2 do
  if not smatch(ARGV[k], '^[a-z_]+$') then arg_fail('meta field', 'not a field name', ARGV[k]) end
  arg_text(ARGV[k + 1], ARGV[k], ARGV[k] == N.MIX and 65536 or 1024)  -- (a mixed job's sources)
  if ARGV[k] == N.STREAM and ARGV[k + 1] == 'open' then stream = true end
  if ARGV[k] == N.MIX then
    local ok, mix = pcall(cjson.decode, ARGV[k + 1])
    if not ok or type(mix) ~= 'table' then arg_fail(ARGV[k], 'not a JSON object', '') end
    by_samples = ok and type(mix) == 'table' and mix.by == 'samples'
    if ok and type(mix) == 'table' and type(mix.streams) == 'table' then  -- (fed later)
      for _, open in ipairs(mix.streams) do if open == true then stream = true end end
    end
    if by_samples then
      for _, n in ipairs(type(mix.n) == 'table' and mix.n or {}) do
        blocks = blocks + math.ceil((tonum(n) or 0) / 256)
      end
    end
  end
end
-- (only a stream, or a mix of an open stream, starts empty: its tasks are appended)
if n_tasks == 0 and not stream then arg_fail('n_tasks', 'a job needs a task', ARGV[2]) end
local bad = args_bad()
if bad then return bad end
local staging, sizes = KEYS[#KEYS - 1], KEYS[#KEYS]
local staged = {staging, sizes}
if not by_samples then sizes = nil end
local exists = rcall('EXISTS', K_META) == 1
if exists and ARGV[1] ~= '1' then
  rcall('UNLINK', unpk(staged))
  return done({C.JOB_EXISTS})
end
if rcall('HLEN', staging) ~= tonum(ARGV[2])
    or (sizes and rcall('HLEN', sizes) ~= blocks) then
  rcall('UNLINK', unpk(staged))
  return done({C.INVALID})
end
local last_token = rcall('HGET', K_META, N.LAST_TOKEN) or '0'
if mget(F.SHUFFLE) == 'm' then drop_all() end  -- (a mixed job's sequence: job_keys() names none)
rcall('UNLINK', unpk(job_keys()))
if n_tasks > 0 then
  rcall('RENAME', staging, K_CHUNKS)
  rcall('PERSIST', K_CHUNKS)
end
if sizes then
  rcall('RENAME', sizes, kc('mixsz'))
  rcall('PERSIST', kc('mixsz'))
end
local fields = {}
for k = 3, #ARGV do fields[#fields + 1] = ARGV[k] end
rcall('HSET', K_META, unpk(fields))
rcall('HSET', K_META, N.LAST_TOKEN, last_token)
if rcall('HGET', K_META, N.MCLOCK) == '1' then rcall('SET', K_CLOCK, 0) end
open_job('')
mset(F.PSTART, fmt(CALL.NOW), F.CREATED, fmt(CALL.NOW), F.SEEN, fmt(CALL.NOW), F.NWAITING, 0)
pad_meta()
event('job_created', 'tasks', ARGV[2], 'incarnation', mget(F.INC))
event('pass_started', 'round', CALL.ROUND)
return done({C.OK})
