#!lua
-- checkpoint: record the job's position under an id, in bounded calls.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc ('' = any), id (1-64 of A-Z a-z 0-9 . _ -), step (begin | copy | todo |
--       since | page | seal), arg (todo: and a cursor); the steps go in this order
--   begin, arg = keep (1..1000): freeze the unfinished tasks (progress, front, leased) into
--     a scratch hash, note the cursor; write the record. returns {code, pages, unfinished}
--   copy, arg = k (0, 1, ... in order; a repeat is a no-op): done-bitmap page k into the
--     scratch bitmap, as it is now. returns {code, since_pages}
--   todo, arg = k, cursor: copy page k of the unfinished tasks ("task:samples", one HSCAN
--     step from cursor), clearing their bits in the scratch bitmap (done after the begin).
--     returns {code, next cursor ('0' after the last page)}
--   since, arg = k: clear in the scratch bitmap the bits of the tasks the cursor gave out
--     after the begin (positions begin + 2,000 k ..., up to the cursor at the last copy)
--   page, arg = k: copy scratch-bitmap page k into the checkpoint. returns {code}
--   seal, arg = keep (1..1000): list the checkpoint, drop the oldest beyond `keep`.
--     returns {code, seq}
-- The bitmap is copied a page per call while acks go on, so the copy is of a later
-- position; within a pass attempt done bits are only ever set, and a task done since the
-- begin was then unfinished (leased or in the front: the frozen hash) or not given out yet
-- (past the cursor): clearing those gives the bitmap of the begin. A new pass attempt (a
-- new round) meanwhile answers PASS_MISMATCH and drops the checkpoint (taken again).
-- An id already sealed answers DUP to begin; a step of a checkpoint that is not the open
-- one (superseded by a newer begin, or dropped by a retry of dead tasks) answers STALE.
-- Work per call: one page (64 kB of bitmap, 2,000 tasks or positions), except begin's
-- copy of the progress hash and walk of the front and the leased tasks.
arg_id(ARGV[1], 'job_inc', true)
local id = arg_ckpt(ARGV[2], 'checkpoint')
local step = arg_enum(ARGV[3], 'step', 'begin copy todo since page seal')
local arg, cursor = 0, '0'
if step == 'begin' or step == 'seal' then
  arg = arg_int(ARGV[4], 'keep', 1, 1000)
else
  arg = arg_int(ARGV[4], 'page', 0, 4294967295)
end
if step == 'todo' then
  cursor = arg_text(ARGV[5], 'cursor', 20)
  if not string.match(cursor, '^%d+$') then arg_fail('cursor', 'not a scan cursor', cursor) end
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
  redis.call('DEL', K_CKDONE, K_CKPROG)
  if redis.call('EXISTS', K_PROGRESS) == 1 then redis.call('COPY', K_PROGRESS, K_CKPROG) end
  -- Every unfinished task before the cursor is leased or in the front (or dead): with the
  -- cursor, they are the rest of the pass. Leased ones without progress start at 0.
  for _, t in ipairs(redis.call('ZRANGE', K_FRONT, 0, -1)) do
    redis.call('HSETNX', K_CKPROG, t, '0')
  end
  for _, item in ipairs(redis.call('ZRANGE', K_OWNED, 0, -1)) do
    redis.call('HSETNX', K_CKPROG, string.match(item, '|([^|]*)$'), '0')
  end
  local bytes = redis.call('STRLEN', K_DONE)
  local ntodo = redis.call('HLEN', K_CKPROG)
  local counters = {}
  for _, f in ipairs({F.C_LEASED, F.C_ACKED, F.C_FAILED, F.C_RELEASED, F.C_EXP_WL,
                      F.C_EXP_TT, F.C_STALE, F.C_DEAD, F.C_STOLEN, F.C_REVOKED}) do
    counters[f] = mnum(f)
  end
  rec = {
    id = id, state = 'open', pass = mnum(F.PASS), round = ROUND, cursor = mnum(F.CURSOR),
    done = mnum(F.NDONE), dead = redis.call('SCARD', K_DEAD), job_state = STATE,
    reason = mget(F.REASON) or '', created_ms = NOW, bytes = bytes,
    pages = math.ceil(bytes / CK_PAGE_BYTES), ppages = 0, todo_done = ntodo == 0,
    unfinished = ntodo, pstart = mnum(F.PSTART), counters = counters,
    incarnation = mget(F.INC), copied = 0, cursor_end = mnum(F.CURSOR),
  }
  redis.call('HSET', K_CKPT, id, cjson.encode(rec))
  mset(F.CK_OPEN, id)
  return done({C.OK, rec.pages, ntodo})
end
if not rec or rec.state ~= 'open' or mget(F.CK_OPEN) ~= id then return done({C.STALE}) end
if mnum(F.PASS) ~= rec.pass or ROUND ~= rec.round then
  ck_drop(id)  -- its pass attempt is over: the done bitmap of the begin is gone
  mset(F.CK_OPEN, '')
  redis.call('DEL', K_CKDONE, K_CKPROG)
  return done({C.PASS_MISMATCH})
end
local copied = rec.copied == rec.pages
local function since_pages()
  return math.ceil((rec.cursor_end - rec.cursor) / CK_PAGE_PAIRS)
end
if step == 'copy' then
  if arg > rec.copied or arg >= rec.pages then return done({C.INVALID}) end
  if arg == rec.copied then
    redis.call('SETRANGE', K_CKDONE, arg * CK_PAGE_BYTES, redis.call('GETRANGE', K_DONE,
      arg * CK_PAGE_BYTES, (arg + 1) * CK_PAGE_BYTES - 1))
    rec.copied, rec.cursor_end = arg + 1, mnum(F.CURSOR)
    redis.call('HSET', K_CKPT, id, cjson.encode(rec))
  end
  return done({C.OK, since_pages()})
end
if not copied then return done({C.INVALID}) end
if step == 'since' then
  if arg >= since_pages() then return done({C.INVALID}) end
  local perm = perm_fn(mnum(F.N))
  local from = rec.cursor + arg * CK_PAGE_PAIRS
  for pos = from, math.min(rec.cursor_end, from + CK_PAGE_PAIRS) - 1 do
    redis.call('SETBIT', K_CKDONE, perm(pos), 0)
  end
  rec.since = math.max(rec.since or 0, arg + 1)
  redis.call('HSET', K_CKPT, id, cjson.encode(rec))
  return done({C.OK})
end
if step == 'page' then
  if arg >= rec.pages or not rec.todo_done or (rec.since or 0) < since_pages() then
    return done({C.INVALID})
  end
  redis.call('HSET', K_CKPT, id .. ':d:' .. arg, redis.call('GETRANGE', K_CKDONE,
    arg * CK_PAGE_BYTES, (arg + 1) * CK_PAGE_BYTES - 1))
  return done({C.OK})
end
if step == 'todo' then
  -- page k holds one HSCAN step of the frozen hash from `cursor` (ARGV[5], '0' for k = 0);
  -- the reply's cursor is the next page's, '0' after the last one
  if arg > rec.ppages then return done({C.INVALID}) end
  local r = redis.call('HSCAN', K_CKPROG, cursor, 'COUNT', CK_PAGE_PAIRS)
  local items = {}
  for i = 1, #r[2], 2 do
    items[#items + 1] = r[2][i] .. ':' .. r[2][i + 1]
    redis.call('SETBIT', K_CKDONE, tonumber(r[2][i]), 0)  -- unfinished at the begin
  end
  redis.call('HSET', K_CKPT, id .. ':p:' .. arg, table.concat(items, ','))
  rec.ppages = math.max(rec.ppages, arg + 1)
  rec.todo_done = r[1] == '0'
  redis.call('HSET', K_CKPT, id, cjson.encode(rec))
  return done({C.OK, r[1]})
end
-- seal
if not rec.todo_done or (rec.since or 0) < since_pages() then return done({C.INVALID}) end
for k = 0, rec.pages - 1 do
  if redis.call('HEXISTS', K_CKPT, id .. ':d:' .. k) == 0 then return done({C.INVALID}) end
end
if rec.unfinished > 0 and not rec.todo_done then return done({C.INVALID}) end
local seq = mincr(F.CK_SEQ)
rec.state, rec.seq, rec.sealed_ms = 'sealed', seq, NOW
redis.call('HSET', K_CKPT, id, cjson.encode(rec))
redis.call('ZADD', K_CKPTS, seq, id)
redis.call('DEL', K_CKDONE, K_CKPROG)
mset(F.CK_OPEN, '')
-- the oldest beyond `keep` go, a few per call (each is a handful of fields)
local over = redis.call('ZCARD', K_CKPTS) - arg
if over > 0 then
  for _, old in ipairs(redis.call('ZRANGE', K_CKPTS, 0, math.min(over, 10) - 1)) do
    ck_drop(old)
  end
end
event('checkpoint', 'id', id, 'done', fmt(rec.done))
return done({C.OK, seq})
