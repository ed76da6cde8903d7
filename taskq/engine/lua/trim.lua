#!lua
-- trim: move a stream's watermark over its finished tasks, dropping what a done one no
-- longer needs (its descriptor, every per-task field: the counts f: a: s: x:, the lease
-- records <task> b: s: o: and the size n:, its progress, the chunk ids it was appended
-- with; the appends' log below the watermark), so a stream that runs for weeks stays
-- bounded (docs/streams.md, "Trimming behind a watermark"). Run by the reaper each tick;
-- a job that is not a stream, or not in its last pass, is left as it is.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), max (1..TRIM_MAX tasks)
-- returns: {OK, tasks passed, watermark}
-- The watermark passes a dead task, which keeps its records, set aside (the `aside` zset,
-- at most ASIDE_MAX tasks; then the watermark waits at the next dead one): it stays in
-- the dead set (listed, retried, counted by the audit), and its records go once it is
-- done. It never passes a task leased or todo, nor the lowest task neither done nor dead
-- at a kept or open checkpoint's cut (a rewind there makes it todo again: it needs its
-- descriptor; the kept ones are read as one bound, lib/cuts.lua, and a step of its sweep
-- after a drop); a task dead at such a cut keeps its records while the checkpoint is
-- kept (the rewind makes it dead again, and a retry leases it). It does not move while a
-- rewind runs. A reset of the pass is refused once the stream is trimmed (reset.lua); the
-- bits of the done set stay (one bit a task: 125 kB per million appended).
-- A mixed job fed by an open stream source is trimmed the same way over the positions of
-- its pass (its length: the positions charged so far, tasks_n): a position's records go,
-- and its copy's chunks and feed ids, and the feed and weight logs below what a charge
-- reads (lib/mixtrim.lua; docs/mixing.md, "Trim").
local rcall, mmin, mmax, mfloor, lipairs, unpk, cdecode, tonum =
  redis.call, math.min, math.max, math.floor, ipairs, unpack, cjson.decode, tonumber
local fmt, mget, mnum, mput = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.mput
local tasks_n = lib.meta.tasks_n
local arg_id, arg_int, arg_len, args_bad =
  lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.args_bad
local done, open_job = lib.call.done, lib.call.open_job
local ck_record, ck_bound, ck_sweep_step =
  lib.cuts.ck_record, lib.cuts.ck_bound, lib.cuts.ck_sweep_step
local trims, mix_fed, mix_trim_fields, mix_trim_below = lib.mixtrim.trims, lib.mixtrim.mix_fed,
  lib.mixtrim.mix_trim_fields, lib.mixtrim.mix_trim_below
local ASIDE_STEP = 100  -- tasks set aside one call looks at (in turn) to drop the done ones'
arg_id(ARGV[1], 'job_inc', true)
local max = arg_int(ARGV[2], 'max', 1, TRIM_MAX)
arg_len(ARGV, 2)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err, 0, 0}) end
local w, n = mnum(F.TRIM_W), tasks_n()
local passes = mnum(F.PASSES)
local mixed = mix_fed()
if not trims() or CALL.STATE == 'cancelled' or passes < 0
    or mnum(F.PASS) + 1 < passes or (mget(F.RW_OPEN) or '') ~= '' then
  return done({C.OK, 0, w})
end
-- at most about TRIM_MAX chunk ids a call too: fewer tasks when each holds many chunks
local hi = mmin(n, w + mmax(1, mmin(max, mfloor(TRIM_MAX / mmax(1, mnum(F.CPT))))))
-- what the kept checkpoints' cuts need (their bound, lib/cuts.lua: one field, not every
-- record; while a sweep makes the first one, the watermark waits) and the open one's
local needed, blocked = {}, false
local function held_by(p0, p1, lo, dead)
  -- a cut of another pass, or one that did not record its lowest task not done
  if p0 ~= mnum(F.PASS) or p1 ~= mnum(F.PASS) or not lo then
    hi, blocked = w, true
  else
    hi = mmin(hi, lo)
    for _, t in lipairs(dead) do needed[t] = true end
  end
end
local sweeping = ck_sweep_step()
local bound = ck_bound()
if bound and bound.p0 then
  held_by(bound.p0, bound.p1, not bound.old and bound.lo, bound.dead or {})
elseif not bound and sweeping then
  hi, blocked = w, true
end
local open = mget(F.CK_OPEN) or ''
local rec = open ~= '' and ck_record(open)
if rec then
  held_by(rec.pass, rec.pass, rec.low and (rec.low_live or rec.low), rec.dead_below or {})
end
-- every per-task record of `tasks` (ids as strings, ascending) goes, and what their
-- chunks are held under (a mixed job's positions: their copies)
local function drop_records(tasks)
  if #tasks == 0 then return end
  local fields = mixed and mix_trim_fields(tasks) or tasks
  local counts, leases = {}, {}
  for _, s in lipairs(tasks) do
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
  for _, raw in lipairs(#fields > 0 and rcall('HMGET', K_APPIDX, unpk(fields)) or {}) do
    if raw then
      for _, id in lipairs(cdecode(raw)) do ids[#ids + 1] = id end
    end
  end
  for i = 1, #ids, 1000 do rcall('HDEL', K_APPIDS, unpk(ids, i, mmin(#ids, i + 999))) end
  if #fields > 0 then
    rcall('HDEL', K_APPIDX, unpk(fields))
    rcall('HDEL', K_CHUNKS, unpk(fields))
  end
  rcall('HDEL', K_PROGRESS, unpk(tasks))
  rcall('HDEL', K_COUNTS, unpk(counts))
  rcall('HDEL', K_LEASES, unpk(leases))
end
-- the tasks set aside, a few a call in turn: a done one no kept cut had dead goes (first:
-- it makes room for the walk)
if not blocked then
  local at = tonum(mget(F.ASIDE_AT) or '') or -1
  local look = rcall('ZRANGEBYSCORE', K_ASIDE, '(' .. fmt(at), '+inf', 'LIMIT', 0, ASIDE_STEP)
  mput(F.ASIDE_AT, #look < ASIDE_STEP and -1 or tonum(look[#look]))
  local back = {}
  for _, s in lipairs(look) do
    if not needed[tonum(s)] and rcall('GETBIT', K_DONE, s) == 1 then back[#back + 1] = s end
  end
  if #back > 0 then
    drop_records(back)
    rcall('ZREM', K_ASIDE, unpk(back))
  end
end
-- the walk from the watermark: a run of done tasks, then a dead one set aside, and again
local gone, aside = {}, {}
local room = ASIDE_MAX - rcall('ZCARD', K_ASIDE)
local t = w
while t < hi do
  local nd = rcall('BITPOS', K_DONE, 0, t, hi - 1, 'BIT')
  -- (-1: done up to the bitmap's end, every bit past it 0; and 0 whatever the range when
  -- the bitmap does not exist yet, nothing done: below t, so the same formula, which
  -- gives t, else the walk went back to 0 and set task 0 aside again and again)
  if nd < t then nd = mmin(hi, mmax(t, rcall('STRLEN', K_DONE) * 8)) end
  for d = t, nd - 1 do
    if not needed[d] then
      gone[#gone + 1] = fmt(d)
    elseif #aside < room then
      aside[#aside + 1] = d  -- done now, dead at a kept cut
    else
      nd = d
      break
    end
  end
  t = nd
  if t >= hi or #aside >= room or rcall('GETBIT', K_DEADBITS, t) == 0 then break end
  aside[#aside + 1] = t
  t = t + 1
end
drop_records(gone)
if #aside > 0 then
  local za = {}
  for _, d in lipairs(aside) do za[#za + 1] = d; za[#za + 1] = fmt(d) end
  rcall('ZADD', K_ASIDE, unpk(za))
end
if mixed and not blocked then mix_trim_below(mmax(t, w)) end
if t <= w then return done({C.OK, 0, w}) end
-- the appends that end below the watermark: the one holding task t stays (its time is
-- the oldest unfinished task's age when that task is t)
local holder = rcall('ZREVRANGEBYSCORE', K_APPENDS, t, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
if holder[2] then rcall('ZREMRANGEBYSCORE', K_APPENDS, '-inf', '(' .. holder[2]) end
mput(F.TRIM_W, t)
return done({C.OK, t - w, t})
