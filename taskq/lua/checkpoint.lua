#!lua
-- checkpoint: record the job's position under an id, in bounded calls.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc ('' = any), id, step (begin | page | todo | seal), arg
--   begin, arg = keep: freeze the done bitmap and the unfinished tasks (progress, front,
--     leased) into scratch keys; write the record. returns {code, pages, unfinished}
--   page, arg = k: copy done-bitmap page k into the checkpoint. returns {code}
--   todo, arg = k, cursor: copy page k of the unfinished tasks ("task:samples", one HSCAN
--     step from cursor). returns {code, next cursor ('0' after the last page)}
--   seal, arg = keep: list the checkpoint, drop the oldest beyond `keep`. returns {code, seq}
-- An id already sealed answers DUP to begin; a step of a checkpoint that is not the open
-- one (superseded by a newer begin) answers STALE. Work per call: one page (64 kB of
-- bitmap, 2,000 tasks), except begin's copies (COPY of the bitmap, N/8 bytes, and of the
-- progress hash; a walk of the front and the leased tasks).
local id, step, arg = ARGV[2], ARGV[3], uint(ARGV[4])
if not valid_id(id) or not arg then return {C.INVALID} end
if step ~= 'begin' and step ~= 'page' and step ~= 'todo' and step ~= 'seal' then
  return {C.INVALID}
end
if (step == 'begin' or step == 'seal') and (arg < 1 or arg > 1000) then return {C.INVALID} end
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
  if redis.call('EXISTS', K_DONE) == 1 then redis.call('COPY', K_DONE, K_CKDONE) end
  if redis.call('EXISTS', K_PROGRESS) == 1 then redis.call('COPY', K_PROGRESS, K_CKPROG) end
  -- Every unfinished task before the cursor is leased or in the front (or dead): with the
  -- cursor, they are the rest of the pass. Leased ones without progress start at 0.
  for _, t in ipairs(redis.call('ZRANGE', K_FRONT, 0, -1)) do
    redis.call('HSETNX', K_CKPROG, t, '0')
  end
  for _, item in ipairs(redis.call('ZRANGE', K_OWNED, 0, -1)) do
    redis.call('HSETNX', K_CKPROG, string.match(item, '|([^|]*)$'), '0')
  end
  local bytes = redis.call('STRLEN', K_CKDONE)
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
    incarnation = mget(F.INC),
  }
  redis.call('HSET', K_CKPT, id, cjson.encode(rec))
  mset(F.CK_OPEN, id)
  return done({C.OK, rec.pages, ntodo})
end
if not rec or rec.state ~= 'open' or mget(F.CK_OPEN) ~= id then return done({C.STALE}) end
if step == 'page' then
  if arg >= rec.pages then return done({C.INVALID}) end
  redis.call('HSET', K_CKPT, id .. ':d:' .. arg, redis.call('GETRANGE', K_CKDONE,
    arg * CK_PAGE_BYTES, (arg + 1) * CK_PAGE_BYTES - 1))
  return done({C.OK})
end
if step == 'todo' then
  -- page k holds one HSCAN step of the frozen hash from `cursor` (ARGV[5], '0' for k = 0);
  -- the reply's cursor is the next page's, '0' after the last one
  local cursor = ARGV[5] or '0'
  if not uint(cursor) or arg > rec.ppages then return done({C.INVALID}) end
  local r = redis.call('HSCAN', K_CKPROG, cursor, 'COUNT', CK_PAGE_PAIRS)
  local items = {}
  for i = 1, #r[2], 2 do items[#items + 1] = r[2][i] .. ':' .. r[2][i + 1] end
  redis.call('HSET', K_CKPT, id .. ':p:' .. arg, table.concat(items, ','))
  rec.ppages = math.max(rec.ppages, arg + 1)
  rec.todo_done = r[1] == '0'
  redis.call('HSET', K_CKPT, id, cjson.encode(rec))
  return done({C.OK, r[1]})
end
-- seal
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
