#!lua
-- checkpoint: record the job's position under an id: the cut in one call, then bounded
-- calls that page what it copied.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), id (1-64 of A-Z a-z 0-9 . _ -), step (begin | prog | seal),
--       arg (prog: and a cursor; begin: and an optional policy blob); in this order
--   begin, arg = keep (1..1000)[, policy (up to POLICY_MAX bytes, opaque: a mixing
--     policy's state, docs/mixing.md; kept beside the record, field "<id>:policy")]: the cut, one consistent position taken at once whatever
--     the job does (its pass's start or end, trainers leasing and acking): pass, round,
--     cursor, state, the done set and the dead set (their bitmaps, written into the
--     checkpoint's pages in this call: N / 8 bytes each, 125 kB at 1M tasks), and the
--     progress hash (COPY into the scratch hash ckprog). returns {code, pages, unfinished}
--   prog, arg = k, cursor: page k of the cut's progress ("task:samples", one HSCAN step
--     of the scratch hash from cursor). returns {code, next cursor ('0' after the last)}
--   seal, arg = keep (1..1000): list the checkpoint, drop the oldest beyond `keep`.
--     returns {code, seq}
-- Nothing is derived here: a rewind derives the rest from the cut (rewind.lua). The
-- scratch hash is written by the begin only, so the pages are of the cut whatever
-- happens between the calls. An id already sealed answers DUP to begin; a step of a
-- checkpoint that is not the open one (a newer begin, a rewind began) answers STALE; no
-- checkpoint begins while a rewind runs (LOCKED).
-- Work per call: the cut copies two bitmaps (~0.3 ms at 1M tasks) and the progress hash
-- (one field per unfinished task with progress); a page is one scan step.
local rcall, tonum, smatch, mmin, mmax, tconcat, unpk, lpairs, lipairs =
  redis.call, tonumber, string.match, math.min, math.max, table.concat, unpack, pairs, ipairs
local fmt, mget, mincr, mnum, mset =
  lib.meta.fmt, lib.meta.mget, lib.meta.mincr, lib.meta.mnum, lib.meta.mset
local tasks_n, trims = lib.meta.tasks_n, lib.mixtrim.trims
local arg_enum, arg_fail, arg_id, arg_int, arg_len, arg_text, args_bad =
  lib.args.arg_enum, lib.args.arg_fail, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len,
  lib.args.arg_text, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local dead_empty = lib.leases.dead_empty
local cut_splits = lib.pieces.cut_splits
local arg_ckpt, ck_drop, ck_record, ck_bound_add =
  lib.cuts.arg_ckpt, lib.cuts.ck_drop, lib.cuts.ck_record, lib.cuts.ck_bound_add
arg_id(ARGV[1], 'job_inc', true)
local id = arg_ckpt(ARGV[2], 'checkpoint')
local step = arg_enum(ARGV[3], 'step', 'begin prog seal')
local arg, cursor = 0, '0'
if step == 'begin' or step == 'seal' then
  arg = arg_int(ARGV[4], 'keep', 1, 1000)
else
  arg = arg_int(ARGV[4], 'page', 0, 4294967295)
end
local policy = ''
if step == 'prog' then
  cursor = arg_text(ARGV[5], 'cursor', 20)
  if not smatch(cursor, '^%d+$') then arg_fail('cursor', 'not a scan cursor', cursor) end
  arg_len(ARGV, 5)
elseif step == 'begin' and ARGV[5] then
  policy = arg_text(ARGV[5], 'policy', POLICY_MAX)
  arg_len(ARGV, 5)
else
  arg_len(ARGV, 4)
end
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED}) end
local rec = ck_record(id)
if step == 'begin' then
  if rec and rec.state == 'sealed' then return done({C.DUP, rec.pages, rec.unfinished}) end
  if mget(F.RW_OPEN) and mget(F.RW_OPEN) ~= '' then return done({C.LOCKED}) end
  local open = mget(F.CK_OPEN) or ''
  if open ~= '' then ck_drop(open) end
  -- a job made before the dead set had its bitmap: built once, here
  if not dead_empty() and rcall('EXISTS', K_DEADBITS) == 0 then
    for _, task in lipairs(rcall('SMEMBERS', K_DEAD)) do
      rcall('SETBIT', K_DEADBITS, task, 1)
    end
  end
  local pages = {}
  for kind, key in lpairs({d = K_DONE, x = K_DEADBITS}) do
    local np = math.ceil(rcall('STRLEN', key) / CK_PAGE_BYTES)
    pages[kind] = np
    for k = 0, np - 1 do
      rcall('HSET', K_CKPT, id .. ':' .. kind .. ':' .. k,
        rcall('GETRANGE', key, k * CK_PAGE_BYTES, (k + 1) * CK_PAGE_BYTES - 1))
    end
  end
  rcall('UNLINK', K_CKPROG)
  rcall('COPY', K_PROGRESS, K_CKPROG)
  -- this attempt's splits with the progress (lib/split.lua: cut_splits; rewind.lua)
  local splits = cut_splits()
  if #splits > 0 then rcall('HSET', K_CKPROG, unpk(splits)) end
  local counters = {}
  for _, f in lipairs({F.C_LEASED, F.C_ACKED, F.C_FAILED, F.C_RELEASED, F.C_EXP_WL,
                      F.C_EXP_TT, F.C_STALE, F.C_DEAD, F.C_STOLEN, F.C_REVOKED}) do
    counters[META_NAMES[f]] = mnum(f)
  end
  -- done: the set's size (what the count caches); unfinished: the tasks given out and
  -- not done (leased or in the front)
  rec = {
    id = id, state = 'open', pass = mnum(F.PASS), round = CALL.ROUND, cursor = mnum(F.CURSOR),
    done = rcall('BITCOUNT', K_DONE), dead = rcall('SCARD', K_DEAD), job_state = CALL.STATE,
    reason = mget(F.REASON) or '', created_ms = CALL.NOW, pages = pages.d, xpages = pages.x,
    xbytes = rcall('STRLEN', K_DEADBITS),
    ppages = 0, todo_done = false, n = tasks_n(), sum_seq = mnum(F.SUM_SEQ),
    pn = tonum(mget(F.PN) or '') or mnum(F.N),  -- the order's size; n: the append position
    unfinished = mnum(F.NLEASED) + rcall('ZCARD', K_FRONT), counters = counters,
    -- the lowest task not done at the cut
    low = mmin(rcall('BITPOS', K_DONE, 0), tasks_n()),
    incarnation = mget(F.INC), pstart = mnum(F.PSTART), policy = #policy,
  }
  if #policy > 0 then rcall('HSET', K_CKPT, id .. ':policy', policy) end
  if trims() then
    -- a stream is never trimmed past the lowest task neither done nor dead at the cut,
    -- and the dead ones below it keep their records (trim.lua): at most ASIDE_MAX of them
    local p, n, below = rec.low, tasks_n(), {}
    while p < n and #below < ASIDE_MAX and rcall('GETBIT', K_DEADBITS, p) == 1 do
      below[#below + 1] = p
      local nx = rcall('BITPOS', K_DONE, 0, p + 1, -1, 'BIT')
      if nx < 0 then nx = mmax(p + 1, rcall('STRLEN', K_DONE) * 8) end
      p = mmin(nx, n)
    end
    rec.low_live, rec.dead_below = p, below
  end
  rcall('HSET', K_CKPT, id, cjson.encode(rec))
  mset(F.CK_OPEN, id)
  return done({C.OK, rec.pages, rec.unfinished})
end
if not rec or rec.state ~= 'open' or mget(F.CK_OPEN) ~= id then return done({C.STALE}) end
if step == 'prog' then
  -- page k holds one HSCAN step of the scratch hash from `cursor` ('0' for k = 0); the
  -- reply's cursor is the next page's, '0' after the last one
  if arg > rec.ppages then return done({C.INVALID}) end
  local r = rcall('HSCAN', K_CKPROG, cursor, 'COUNT', CK_PAGE_PAIRS)
  local items = {}
  for i = 1, #r[2], 2 do items[#items + 1] = r[2][i] .. ':' .. r[2][i + 1] end
  rcall('HSET', K_CKPT, id .. ':p:' .. arg, tconcat(items, ','))
  rec.ppages = mmax(rec.ppages, arg + 1)
  rec.todo_done = r[1] == '0'
  rcall('HSET', K_CKPT, id, cjson.encode(rec))
  return done({C.OK, r[1]})
end
-- seal
if not rec.todo_done then return done({C.INVALID}) end
local seq = mincr(F.CK_SEQ)
rec.state, rec.seq, rec.sealed_ms = 'sealed', seq, CALL.NOW
rcall('HSET', K_CKPT, id, cjson.encode(rec))
local first = rcall('ZCARD', K_CKPTS) == 0
rcall('ZADD', K_CKPTS, seq, id)
if trims() then ck_bound_add(rec, first) end  -- what trim.lua reads
mset(F.CK_OPEN, '')
rcall('UNLINK', K_CKPROG)
-- the oldest beyond `keep` go, a few per call (each is a handful of fields)
local over = rcall('ZCARD', K_CKPTS) - arg
if over > 0 then
  for _, old in lipairs(rcall('ZRANGE', K_CKPTS, 0, mmin(over, 10) - 1)) do
    ck_drop(old)
  end
end
-- 'checkpoint', as the rewind events name it: an `id` field would read as the entry's id
event('checkpoint', 'checkpoint', id, 'done', fmt(rec.done))
return done({C.OK, seq})
