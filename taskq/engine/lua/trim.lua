#!lua
-- trim: move a stream's watermark over its done tasks, dropping what they no longer need
-- (their descriptors, every per-task field: the counts f: a: s: x:, the lease records
-- <task> b: s: o: and the size n:, the progress, the chunk ids they were appended with,
-- the appends' log below them), so a stream that runs for weeks
-- stays bounded (docs/streams.md, "Trimming behind a watermark"). Run by the reaper each
-- tick; a job that is not a stream, or not in its last pass, is left as it is.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), max (1..TRIM_MAX tasks)
-- returns: {OK, tasks trimmed, watermark}
-- The watermark never passes a task not done (a dead one holds it until retried), nor the
-- lowest task not done at any kept or open checkpoint's cut (a rewind there makes it todo
-- again: it needs its descriptor), nor moves while a rewind runs. A reset of the pass is
-- refused once the stream is trimmed (reset.lua); the bits of the done set stay (one bit a
-- task: 125 kB per million appended).
local rcall, mmin, mmax, mfloor, lipairs, unpk, cdecode =
  redis.call, math.min, math.max, math.floor, ipairs, unpack, cjson.decode
local fmt, mget, mnum, mput = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.mput
local arg_id, arg_int, arg_len, args_bad =
  lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.args_bad
local done, open_job = lib.call.done, lib.call.open_job
local ck_record = lib.cuts.ck_record
arg_id(ARGV[1], 'job_inc', true)
local max = arg_int(ARGV[2], 'max', 1, TRIM_MAX)
arg_len(ARGV, 2)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err, 0, 0}) end
local w, n = mnum(F.TRIM_W), mnum(F.N)
local passes = mnum(F.PASSES)
if (mget(F.STREAM) or '') == '' or CALL.STATE == 'cancelled' or passes < 0
    or mnum(F.PASS) + 1 < passes or (mget(F.RW_OPEN) or '') ~= '' or w >= n then
  return done({C.OK, 0, w})
end
-- the first task not done from w on (-1: none before the bitmap's end, given an end)
local hi = rcall('BITPOS', K_DONE, 0, w, -1, 'BIT')
if hi < 0 then hi = rcall('STRLEN', K_DONE) * 8 end
-- at most about TRIM_MAX chunk ids a call too: fewer tasks when each holds many chunks
hi = mmin(hi, n, w + mmax(1, mmin(max, mfloor(TRIM_MAX / mmax(1, mnum(F.CPT))))))
local cuts = rcall('ZRANGE', K_CKPTS, 0, -1)
cuts[#cuts + 1] = mget(F.CK_OPEN)
for _, id in lipairs(cuts) do
  local rec = id ~= '' and ck_record(id)
  if rec then
    -- a cut of another pass, or one that did not record its lowest task not done
    if rec.pass ~= mnum(F.PASS) or not rec.low then hi = w else hi = mmin(hi, rec.low) end
  end
end
if hi <= w then return done({C.OK, 0, w}) end
local tasks, counts, leases = {}, {}, {}
for t = w, hi - 1 do
  local s = fmt(t)
  tasks[#tasks + 1] = s
  counts[#counts + 1] = 'f:' .. s
  counts[#counts + 1] = 'a:' .. s
  counts[#counts + 1] = 's:' .. s
  counts[#counts + 1] = 'x:' .. s
  leases[#leases + 1] = s
  leases[#leases + 1] = 'b:' .. s
  leases[#leases + 1] = 's:' .. s
  leases[#leases + 1] = 'o:' .. s
  leases[#leases + 1] = 'n:' .. s
end
local ids = {}
for _, raw in lipairs(rcall('HMGET', K_APPIDX, unpk(tasks))) do
  if raw then
    for _, id in lipairs(cdecode(raw)) do ids[#ids + 1] = id end
  end
end
for i = 1, #ids, 1000 do rcall('HDEL', K_APPIDS, unpk(ids, i, mmin(#ids, i + 999))) end
rcall('HDEL', K_APPIDX, unpk(tasks))
rcall('HDEL', K_CHUNKS, unpk(tasks))
rcall('HDEL', K_PROGRESS, unpk(tasks))
rcall('HDEL', K_COUNTS, unpk(counts))
rcall('HDEL', K_LEASES, unpk(leases))
-- the appends that end below the watermark: the one holding task hi stays (its time is
-- the oldest unfinished task's age when that task is hi)
local holder = rcall('ZREVRANGEBYSCORE', K_APPENDS, hi, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if holder[2] then rcall('ZREMRANGEBYSCORE', K_APPENDS, '-inf', '(' .. holder[2]) end
mput(F.TRIM_W, hi)
return done({C.OK, hi - w, hi})
