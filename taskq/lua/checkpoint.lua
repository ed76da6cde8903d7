#!lua
-- checkpoint: record the job's position under an id, in bounded calls.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc ('' = any), id (1-64 of A-Z a-z 0-9 . _ -), step (begin | freeze | copy |
--       since | todo | page | seal), arg (todo: and a cursor); the steps go in this order
--   begin, arg = keep (1..1000): note the cursor and the front's sequence, write the record
--     and start the freeze. returns {code, pages, unfinished (0 until the todo pages)}
--   freeze, arg = k (0, 1, ... in order; a repeat is a no-op): one page of the walks of
--     the leased set, then the front (its entries of before the begin), then the progress
--     hash (ZSCAN / HSCAN steps): the tasks into the scratch set, the progress into the
--     scratch hash (HSETNX: a before-image is kept). returns {code, more (1 | 0)}
--   copy, arg = k (0, 1, ... in order; a repeat is a no-op): done-bitmap page k into the
--     scratch bitmap, as it is now. returns {code, since_pages}
--   since, arg = k: clear in the scratch bitmap the bits of the tasks the cursor gave out
--     after the begin (positions begin + 2,000 k ..., up to the cursor at the last copy),
--     and take them out of the scratch set (they were not unfinished at the begin)
--   todo, arg = k, cursor: page k of the unfinished tasks ("task:samples", one SSCAN step
--     of the scratch set from cursor), clearing their bits in the scratch bitmap (done
--     after the begin). returns {code, next cursor ('0' after the last page)}
--   page, arg = k: copy scratch-bitmap page k into the checkpoint. returns {code}
--   seal, arg = keep (1..1000): list the checkpoint, drop the oldest beyond `keep`.
--     returns {code, seq}
-- A fuzzy copy, made exact: while the freeze walks (the meta field ck_freeze set), every
-- task leaving the leased set or the front is added to the scratch set and every progress
-- about to change or go has its old value kept first (lib/meta.lua: ck_left, ck_before).
-- So the scratch set ends up holding every task leased or in the front at the begin (one
-- still there is found by the walk, one gone was noted as it went), plus tasks the cursor
-- gave out since (taken out by `since`); the scratch hash the progress of the begin.
-- The bitmap is copied a page per call while acks go on, so the copy is of a later
-- position; within a pass attempt done bits are only ever set, and a task done since the
-- begin was then unfinished (leased or in the front: the scratch set) or not given out yet
-- (past the cursor): clearing those gives the bitmap of the begin. A new pass attempt (a
-- new round) meanwhile answers PASS_MISMATCH and drops the checkpoint (taken again).
-- An id already sealed answers DUP to begin; a step of a checkpoint that is not the open
-- one (superseded by a newer begin, or dropped by a retry of dead tasks) answers STALE.
-- Work per call: one page (64 kB of bitmap, 2,000 tasks or positions, one scan step).
arg_id(ARGV[1], 'job_inc', true)
local id = arg_ckpt(ARGV[2], 'checkpoint')
local step = arg_enum(ARGV[3], 'step', 'begin freeze copy since todo page seal')
local arg, cursor = 0, '0'
if step == 'begin' or step == 'seal' then
  arg = arg_int(ARGV[4], 'keep', 1, 1000)
else
  arg = arg_int(ARGV[4], 'page', 0, 4294967295)
end
if step == 'todo' then
  cursor = arg_text(ARGV[5], 'cursor', 20)
  if not smatch(cursor, '^%d+$') then arg_fail('cursor', 'not a scan cursor', cursor) end
  arg_len(ARGV, 5)
else
  arg_len(ARGV, 4)
end
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
if STATE == 'cancelled' then return done({C.JOB_CANCELLED}) end
local rec = ck_record(id)
if step == 'begin' then
  if rec and rec.state == 'sealed' then return done({C.DUP, rec.pages, rec.unfinished}) end
  local open = mget(F.CK_OPEN) or ''
  if open ~= '' and open ~= id then ck_drop(open) end
  if mget(F.RW_OPEN) and mget(F.RW_OPEN) ~= '' then return done({C.LOCKED}) end
  rcall('DEL', K_CKDONE, K_CKPROG, K_CKSET)
  local bytes = rcall('STRLEN', K_DONE)
  local counters = {}
  for _, f in lipairs({F.C_LEASED, F.C_ACKED, F.C_FAILED, F.C_RELEASED, F.C_EXP_WL,
                      F.C_EXP_TT, F.C_STALE, F.C_DEAD, F.C_STOLEN, F.C_REVOKED}) do
    counters[f] = mnum(f)
  end
  rec = {
    id = id, state = 'open', pass = mnum(F.PASS), round = ROUND, cursor = mnum(F.CURSOR),
    done = mnum(F.NDONE), dead = rcall('SCARD', K_DEAD), job_state = STATE,
    reason = mget(F.REASON) or '', created_ms = NOW, bytes = bytes,
    pages = math.ceil(bytes / CK_PAGE_BYTES), ppages = 0, todo_done = false,
    unfinished = 0, pstart = mnum(F.PSTART), counters = counters,
    fseq = mnum(F.FSEQ), fzk = 0, fzp = 0, fzc = '0', frozen = false,
    incarnation = mget(F.INC), copied = 0, cursor_end = mnum(F.CURSOR),
  }
  rcall('HSET', K_CKPT, id, cjson.encode(rec))
  mset(F.CK_OPEN, id, F.CK_FREEZE, id)
  return done({C.OK, rec.pages, 0})
end
if not rec or rec.state ~= 'open' or mget(F.CK_OPEN) ~= id then return done({C.STALE}) end
if mnum(F.PASS) ~= rec.pass or ROUND ~= rec.round then
  ck_drop(id)  -- its pass attempt is over: the done bitmap of the begin is gone
  mset(F.CK_OPEN, '', F.CK_FREEZE, '')  -- its freeze hooks stop (lib/meta.lua)
  rcall('DEL', K_CKDONE, K_CKPROG, K_CKSET)
  return done({C.PASS_MISMATCH})
end
local copied = rec.copied == rec.pages
local function since_pages()
  return math.ceil((rec.cursor_end - rec.cursor) / CK_PAGE_PAIRS)
end
if step == 'freeze' then
  if arg > rec.fzk then return done({C.INVALID}) end
  if arg == rec.fzk and not rec.frozen then
    local r
    if rec.fzp == 0 then
      r = rcall('ZSCAN', K_OWNED, rec.fzc, 'COUNT', CK_PAGE_PAIRS)
      for i = 1, #r[2], 2 do
        rcall('SADD', K_CKSET, smatch(r[2][i], '|([^|]*)$'))
      end
    elseif rec.fzp == 1 then
      -- entries put in the front after the begin (a later sequence) are not of it
      r = rcall('ZSCAN', K_FRONT, rec.fzc, 'COUNT', CK_PAGE_PAIRS)
      for i = 1, #r[2], 2 do
        if tonum(r[2][i + 1]) <= rec.fseq then rcall('SADD', K_CKSET, r[2][i]) end
      end
    else
      r = rcall('HSCAN', K_PROGRESS, rec.fzc, 'COUNT', CK_PAGE_PAIRS)
      for i = 1, #r[2], 2 do rcall('HSETNX', K_CKPROG, r[2][i], r[2][i + 1]) end
    end
    rec.fzc = r[1]
    if r[1] == '0' then rec.fzp = rec.fzp + 1 end
    if rec.fzp == 3 then
      -- the tasks the cursor gave out during the freeze may be in the set: `since` covers
      -- them (copy moves cursor_end on; with no page to copy, this is the last move)
      rec.frozen, rec.cursor_end = true, mnum(F.CURSOR)
      mset(F.CK_FREEZE, '')
    end
    rec.fzk = arg + 1
    rcall('HSET', K_CKPT, id, cjson.encode(rec))
  end
  return done({C.OK, rec.frozen and 0 or 1})
end
if not rec.frozen then return done({C.INVALID}) end
if step == 'copy' then
  if arg > rec.copied or arg >= rec.pages then return done({C.INVALID}) end
  if arg == rec.copied then
    rcall('SETRANGE', K_CKDONE, arg * CK_PAGE_BYTES, rcall('GETRANGE', K_DONE,
      arg * CK_PAGE_BYTES, (arg + 1) * CK_PAGE_BYTES - 1))
    rec.copied, rec.cursor_end = arg + 1, mnum(F.CURSOR)
    rcall('HSET', K_CKPT, id, cjson.encode(rec))
  end
  return done({C.OK, since_pages()})
end
if not copied then return done({C.INVALID}) end
if step == 'since' then
  if arg >= since_pages() then return done({C.INVALID}) end
  local perm = perm_fn(mnum(F.N))
  local from = rec.cursor + arg * CK_PAGE_PAIRS
  for pos = from, mmin(rec.cursor_end, from + CK_PAGE_PAIRS) - 1 do
    local task = perm(pos)
    rcall('SETBIT', K_CKDONE, task, 0)
    rcall('SREM', K_CKSET, task)
  end
  rec.since = mmax(rec.since or 0, arg + 1)
  rcall('HSET', K_CKPT, id, cjson.encode(rec))
  return done({C.OK})
end
if step == 'page' then
  if arg >= rec.pages or not rec.todo_done or (rec.since or 0) < since_pages() then
    return done({C.INVALID})
  end
  rcall('HSET', K_CKPT, id .. ':d:' .. arg, rcall('GETRANGE', K_CKDONE,
    arg * CK_PAGE_BYTES, (arg + 1) * CK_PAGE_BYTES - 1))
  return done({C.OK})
end
if step == 'todo' then
  -- page k holds one SSCAN step of the scratch set from `cursor` (ARGV[5], '0' for k = 0);
  -- the reply's cursor is the next page's, '0' after the last one. After `since`: the set
  -- is then the tasks unfinished at the begin.
  if arg > rec.ppages or (rec.since or 0) < since_pages() then return done({C.INVALID}) end
  if arg == 0 then rec.unfinished = rcall('SCARD', K_CKSET) end
  local r = rcall('SSCAN', K_CKSET, cursor, 'COUNT', CK_PAGE_PAIRS)
  local items = {}
  for _, task in lipairs(r[2]) do
    items[#items + 1] = task .. ':' .. (rcall('HGET', K_CKPROG, task) or '0')
    rcall('SETBIT', K_CKDONE, tonum(task), 0)  -- unfinished at the begin
  end
  rcall('HSET', K_CKPT, id .. ':p:' .. arg, tconcat(items, ','))
  rec.ppages = mmax(rec.ppages, arg + 1)
  rec.todo_done = r[1] == '0'
  rcall('HSET', K_CKPT, id, cjson.encode(rec))
  return done({C.OK, r[1]})
end
-- seal
if not rec.todo_done or (rec.since or 0) < since_pages() then return done({C.INVALID}) end
for k = 0, rec.pages - 1 do
  if rcall('HEXISTS', K_CKPT, id .. ':d:' .. k) == 0 then return done({C.INVALID}) end
end
if rec.unfinished > 0 and not rec.todo_done then return done({C.INVALID}) end
local seq = mincr(F.CK_SEQ)
rec.state, rec.seq, rec.sealed_ms = 'sealed', seq, NOW
rcall('HSET', K_CKPT, id, cjson.encode(rec))
rcall('ZADD', K_CKPTS, seq, id)
mset(F.CK_OPEN, '', F.CK_FREEZE, '')  -- its freeze hooks stop (lib/meta.lua)
rcall('DEL', K_CKDONE, K_CKPROG, K_CKSET)
-- the oldest beyond `keep` go, a few per call (each is a handful of fields)
local over = rcall('ZCARD', K_CKPTS) - arg
if over > 0 then
  for _, old in lipairs(rcall('ZRANGE', K_CKPTS, 0, mmin(over, 10) - 1)) do
    ck_drop(old)
  end
end
event('checkpoint', 'id', id, 'done', fmt(rec.done))
return done({C.OK, seq})
