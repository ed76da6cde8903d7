#!lua
-- rewind: put the job back to a checkpoint's position, in bounded calls.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc ('' = any), id (1-64 of A-Z a-z 0-9 . _ -), step (begin | page | todo |
--       seal), arg, epoch (begin: key, '' for none; always 5 arguments)
--   begin, arg = once (1|0), key: revoke every lease (a new round: late acks are stale), go
--     back to the checkpoint's pass, cursor and done count, and wait ('rewinding') while
--     the pages are copied back. returns {code, epoch, pages, todo_pages}; with once=1,
--     DUP when the last completed rewind went to this checkpoint and, with a key (a
--     restart's id), was made under the same key; without one, when nothing was acked since
--   page, arg = k: done-bitmap page k back. returns {code}
--   todo, arg = k: unfinished-task page k back (to the front, with its progress). {code}
--   seal, arg = 0: summaries of the passes ended after the checkpoint are marked rewound;
--     the job runs again (or ends its pass at once, if the checkpoint's pass was complete). {code}
-- A step under an epoch that is not the last begin's answers STALE (a newer rewind took
-- over); repeating the whole rewind finishes a half-done one.
arg_id(ARGV[1], 'job_inc', true)
local id = arg_ckpt(ARGV[2], 'checkpoint')
local step = arg_enum(ARGV[3], 'step', 'begin page todo seal')
local arg, epoch, key = 0, 0, ''
if step == 'begin' then
  arg = arg_int(ARGV[4], 'once', 0, 1)
  key = arg_text(ARGV[5], 'key', 200)
else
  if step == 'seal' then
    arg_int(ARGV[4], 'arg', 0, 0)
  else
    arg = arg_int(ARGV[4], 'page', 0, 4294967295)
  end
  epoch = arg_int(ARGV[5], 'epoch', 0, 9007199254740991)
end
arg_len(ARGV, 5)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
if STATE == 'cancelled' then return done({C.JOB_CANCELLED}) end
local rec = ck_record(id)
if not rec or rec.state ~= 'sealed' then return done({C.INVALID}) end
if step == 'begin' then
  if arg == 1 and mget(F.RW_LAST) == id and (mget(F.RW_OPEN) or '') == '' then
    if key ~= '' and mget(F.RW_KEY) == key then return done({C.DUP, 0, 0, 0}) end
    if key == '' and mnum(F.ACKED_JOB) == mnum(F.RW_ACKS) then
      return done({C.DUP, 0, 0, 0})
    end
  end
  local open = mget(F.CK_OPEN) or ''
  if open ~= '' then
    ck_drop(open)  -- a checkpoint being written of a position that goes away
    mset(F.CK_OPEN, '', F.CK_FREEZE, '')  -- its freeze hooks stop (lib/meta.lua)
    rcall('DEL', K_CKDONE, K_CKPROG, K_CKSET)
  end
  local revoked = mnum(F.NLEASED)
  if revoked > 0 then mincr(F.C_REVOKED, revoked) end
  ROUND = mincr(F.ROUND)
  rcall('UNLINK', K_DONE, K_FRONT, K_OWNED, K_DEADLINES, K_RESERVED, K_STARTED,
    K_PROGRESS, K_WAKE)
  local ep = mincr(F.RW_EPOCH)
  mset(F.PASS, rec.pass, F.CURSOR, rec.cursor, F.NDONE, rec.done, F.NLEASED, 0,
    F.NRESERVED, 0, F.P_STALE, 0, F.P_SKIPPED, 0, F.P_MAXLATE, 0, F.P_LEASED, 0,
    F.P_EXPIRED, 0, F.P_RESUMED, 0, F.P_RESUMED_S, 0, F.P_REREAD, 0, F.PSTART, fmt(NOW),
    F.STATE, 'waiting', F.REASON, 'rewinding', F.RW_OPEN, id, F.RW_KEY, key)
  STATE = 'waiting'
  event('rewind_started', 'checkpoint', id, 'round', ROUND, 'revoked', fmt(revoked))
  broadcast()
  return done({C.OK, ep, rec.pages, rec.ppages})
end
if mget(F.RW_OPEN) ~= id or mnum(F.RW_EPOCH) ~= epoch then return done({C.STALE}) end
if step == 'page' then
  if arg >= rec.pages then return done({C.INVALID}) end
  rcall('SETRANGE', K_DONE, arg * CK_PAGE_BYTES,
    rcall('HGET', K_CKPT, id .. ':d:' .. arg) or '')
  return done({C.OK})
end
if step == 'todo' then
  if arg >= rec.ppages then return done({C.INVALID}) end
  local page = rcall('HGET', K_CKPT, id .. ':p:' .. arg) or ''
  for task, samples in string.gmatch(page, '(%d+):(%d+)') do
    if dead_empty() or rcall('SISMEMBER', K_DEAD, task) == 0 then
      FRONT_EMPTY = false
      rcall('ZADD', K_FRONT, mincr(F.FSEQ), task)
      if samples ~= '0' then rcall('HSET', K_PROGRESS, task, samples) end
    end
  end
  return done({C.OK})
end
-- seal
local kv = rcall('HGETALL', K_PASSES)  -- at most ~1,000 summaries (passes.lua)
for i = 1, #kv, 2 do
  local s = cjson.decode(kv[i + 1])
  if not s.rewound and (s.pass > rec.pass or (s.pass == rec.pass and s.round >= rec.round)) then
    s.rewound, s.rewound_to = true, id
    rcall('HSET', K_PASSES, kv[i], cjson.encode(s))
  end
end
mset(F.STATE, 'running', F.REASON, '', F.RW_OPEN, '', F.RW_LAST, id,
  F.RW_ACKS, mnum(F.ACKED_JOB))
STATE = 'running'
event('rewound', 'checkpoint', id, 'pass', fmt(rec.pass), 'done', fmt(rec.done))
broadcast()
check_pass_end()
return done({C.OK})
