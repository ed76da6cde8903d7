#!lua
-- rewind: put the job back to a checkpoint's cut, and derive the rest from it, in bounded
-- calls.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), id (1-64 of A-Z a-z 0-9 . _ -), step (begin | page | dead |
--       todo | walk | mark | seal), arg, epoch (begin: key, '' for none; always 5)
--   begin, arg = once (1|0), key: the running attempt's summary is kept (marked rewound),
--     every lease is revoked (a new round: late acks are stale), the pass's sets go, pass
--     and cursor are the cut's, and the job waits ('rewinding') while the steps below run,
--     each page k = 0, 1, ... in this order (a repeat of a page done is a no-op, a page
--     out of order INVALID). returns {code, epoch, pages, xpages, ppages, wpages, mpages};
--     with once=1, DUP when the last completed rewind went to this checkpoint and, with
--     a key (a restart's id), was made under the same key; without one, when nothing was
--     acked since
--   page, arg = k: done-bitmap page k back
--   dead, arg = k: dead-bitmap bytes RW_DEAD_BYTES k ... (512 tasks): what was dead at
--     the cut is dead again (the set and its bitmap), what was live is live (with its
--     failure counts cleared)
--   todo, arg = k: progress page k back
--   walk, arg = k: the cut's positions RW_WALK (500) k ... below its cursor: each live
--     task not done goes to the front (the cursor gives the rest), so none is unreachable
--   mark, arg = k: summaries written after the cut, 100 per page: kept, marked rewound and
--     renamed "<field>/w<epoch>", so a pass run again writes its own
--   seal, arg = 0: the done count is the set's size again; the job runs (or ends its
--     pass at once, if the cut's pass was complete)
-- A step under an epoch that is not the last begin's answers STALE (a newer rewind took
-- over); repeating the whole rewind finishes a half-done one.
local rcall, tonum, smatch, ssub, sbyte, mmin, mmax, mfloor, tconcat, lipairs =
  redis.call, tonumber, string.match, string.sub, string.byte, math.min, math.max, math.floor,
  table.concat, ipairs
local fmt, mget, mincr, mnum, mput, mset =
  lib.meta.fmt, lib.meta.mget, lib.meta.mincr, lib.meta.mnum, lib.meta.mput, lib.meta.mset
local tasks_n = lib.meta.tasks_n
local arg_enum, arg_id, arg_int, arg_len, arg_text, args_bad =
  lib.args.arg_enum, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.arg_text,
  lib.args.args_bad
local broadcast, event, flush_events =
  lib.events.broadcast, lib.events.event, lib.events.flush_events
local done, open_job = lib.call.done, lib.call.open_job
local dead_empty = lib.leases.dead_empty
local check_pass_end, dead_and_done, drop_pass_sets, perm_fn, recount_done, save_summary =
  lib.passes.check_pass_end, lib.passes.dead_and_done, lib.passes.drop_pass_sets,
  lib.passes.perm_fn, lib.passes.recount_done, lib.passes.save_summary
local arg_ckpt, ck_drop, ck_record = lib.cuts.arg_ckpt, lib.cuts.ck_drop, lib.cuts.ck_record
local restore_split, split_rec = lib.pieces.restore_split, lib.pieces.split_rec
local MIXS, mix_note, copy_at = lib.mixslot, lib.mixslot.mix_note, lib.mixslot.copy_at
local function head_acked(task)
  local s = split_rec(task)
  return s and s.hd
end
arg_id(ARGV[1], 'job_inc', true)
local id = arg_ckpt(ARGV[2], 'checkpoint')
local step = arg_enum(ARGV[3], 'step', 'begin page dead todo walk mark seal')
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
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED}) end
local rec = ck_record(id)
if not rec or rec.state ~= 'sealed' then return done({C.INVALID}) end
local STEPS = {'page', 'dead', 'todo', 'walk', 'mark'}
if step == 'begin' then
  if arg == 1 and mget(F.RW_LAST) == id and (mget(F.RW_OPEN) or '') == '' then
    if key ~= '' and mget(F.RW_KEY) == key then return done({C.DUP, 0, 0, 0, 0, 0, 0}) end
    if key == '' and mnum(F.ACKED_JOB) == mnum(F.RW_ACKS) then
      return done({C.DUP, 0, 0, 0, 0, 0, 0})
    end
  end
  -- a mixed job replays the cut's pass from its stored sequence (lib/mix.lua keeps the
  -- last few passes')
  if mget(F.SHUFFLE) == 'm' and not MIXS.mix_kept(rec.pass, rec.cursor) then
    return done({C.INVALID, 'the mixed sequence of pass ' .. fmt(rec.pass) .. ' is no longer '
      .. 'kept (a mixed job keeps its last 3 passes): rewind to a later checkpoint'})
  end
  local open = mget(F.CK_OPEN) or ''
  if open ~= '' then
    ck_drop(open)  -- a checkpoint being written of a position that goes away
    mset(F.CK_OPEN, '')
    rcall('UNLINK', K_CKPROG)
  end
  local ep = mincr(F.RW_EPOCH)
  -- the attempt that runs now is undone: its summary is kept, marked rewound
  if CALL.STATE == 'running' then save_summary('rewound', ep, id) end
  local revoked = mnum(F.NLEASED)
  if revoked > 0 then mincr(F.C_REVOKED, revoked) end
  CALL.ROUND = mincr(F.ROUND)
  drop_pass_sets(true)
  -- the plan: pages per step, the dead pages covering the bitmap of the cut and of now
  local cut_bytes = rec.xbytes or (rec.xpages or 0) * CK_PAGE_BYTES
  local xpages = math.ceil(mmax(cut_bytes, rcall('STRLEN', K_DEADBITS)) / RW_DEAD_BYTES)
  if not rec.xpages then xpages = 0 end  -- a checkpoint made before the dead pages
  local later = rcall('ZCOUNT', K_PASSIDX, '(' .. fmt(rec.sum_seq or 0), '+inf')
  local plan = {rec.pages, xpages, rec.ppages, math.ceil(rec.cursor / RW_WALK),
    math.ceil(later / RW_MARK)}
  flush_events()  -- the step entry so far is the pass's before (event_task)
  mix_note()  -- (a mixed job: how far the pass left was handed out)
  -- (the cut's order; tasks appended since the cut come after it, never done at the cut)
  mset(F.PASS, rec.pass, F.CURSOR, rec.cursor, F.PN, rec.pn or rec.n or tasks_n(),
    F.NDONE, rec.done, F.NLEASED, 0,
    F.NRESERVED, 0, F.P_STALE, 0, F.P_SKIPPED, 0, F.P_MAXLATE, 0, F.P_LEASED, 0,
    F.P_EXPIRED, 0, F.P_BACKUPS, 0, F.P_RESUMED, 0, F.P_RESUMED_S, 0, F.P_REREAD, 0,
    F.PSTART, fmt(CALL.NOW), F.STATE, 'waiting', F.REASON, 'rewinding', F.RW_OPEN, id,
    F.RW_KEY, key, F.RW_PLAN, tconcat(plan, ','), F.RW_STEP, 0, F.SROUND, '')
  if mget(F.SHUFFLE) == 'm' then MIXS.mix_rewound(rec.pass) end  -- (its pass's length, stop)
  CALL.STATE = 'waiting'
  event('rewind_started', 'checkpoint', id, 'round', CALL.ROUND, 'revoked', fmt(revoked))
  broadcast()
  return done({C.OK, ep, plan[1], plan[2], plan[3], plan[4], plan[5]})
end
-- One page k of a rewind's step (page | dead | todo | walk | mark) to checkpoint `rec`
-- (id `id`) under rewind epoch `epoch`; the plan's order is checked below.
--   page: done-bitmap page k back
--   dead: dead-bitmap bytes RW_DEAD_BYTES k ...: what was dead at the cut is dead again
--     (the set and its bitmap), what was live is live (its failure counts cleared);
--     32-byte blocks are compared as strings, bits only where they differ
--   todo: progress page k back
--   walk: the cut's positions RW_WALK k ... below its cursor: each live task not done
--     goes to the front (after the done and dead pages: the sets are the cut's)
--   mark: the summaries written after the cut, RW_MARK per page: marked rewound and
--     renamed "<field>/w<epoch>", so a pass run again writes its own
local function restore_page(step, rec, id, arg, epoch)
  if step == 'page' then
    rcall('SETRANGE', K_DONE, arg * CK_PAGE_BYTES,
      rcall('HGET', K_CKPT, id .. ':d:' .. arg) or '')
    return
  end
  if step == 'dead' then
    local mixed = mget(F.SHUFFLE) == 'm'
    local from = arg * RW_DEAD_BYTES
    local pk = mfloor(from / CK_PAGE_BYTES)
    local off = from - pk * CK_PAGE_BYTES
    local cut = ssub(rcall('HGET', K_CKPT, id .. ':x:' .. pk) or '', off + 1, off + RW_DEAD_BYTES)
    local now = rcall('GETRANGE', K_DEADBITS, from, from + RW_DEAD_BYTES - 1)
    local len = mmax(#cut, #now)
    if #cut < len then cut = cut .. string.rep('\0', len - #cut) end
    if #now < len then now = now .. string.rep('\0', len - #now) end
    if cut == now then return end
    -- blocks of 32 bytes compared as strings; bits only where they differ
    for b = 1, len, 32 do
      local e = mmin(b + 31, len)
      if ssub(cut, b, e) ~= ssub(now, b, e) then
        for i = b, e do
          local c, n = sbyte(cut, i), sbyte(now, i)
          if c ~= n then
            for j = 0, 7 do
              local mask = bit.rshift(128, j)
              local was, is = bit.band(c, mask) ~= 0, bit.band(n, mask) ~= 0
              local task = fmt((from + i - 1) * 8 + j)
              if was and not is then
                rcall('SADD', K_DEAD, task)
                CALL.DEAD_EMPTY = false
                if mixed then  -- (its copy dead again; one dead since stays dead)
                  local copy = copy_at(task)
                  if copy then rcall('SADD', K_MIXDEAD, copy) end
                end
              elseif is and not was then
                rcall('SREM', K_DEAD, task)
                rcall('HDEL', K_COUNTS, 'f:' .. task, 'a:' .. task, 's:' .. task, 'x:' .. task)
              end
            end
          end
        end
      end
    end
    rcall('SETRANGE', K_DEADBITS, from, cut)
    return
  end
  if step == 'todo' then
    -- ("task:samples", or a split "s<task>:m/n/head acked/tail acked/tail progress")
    local page = rcall('HGET', K_CKPT, id .. ':p:' .. arg) or ''
    for item in string.gmatch(page, '[^,]+') do
      local task, samples = smatch(item, '^(%d+):(%d+)$')
      if task and samples ~= '0' then
        rcall('HSET', K_PROGRESS, task, samples)
        CALL.PROGRESS_EMPTY = false
      elseif not task then
        task, samples = smatch(item, '^s(%d+):(.*)$')
        if task then restore_split(task, samples) end
      end
    end
    return
  end
  if step == 'walk' then
    -- (after the done and dead pages: the sets are the cut's)
    local perm = perm_fn()
    local from = arg * RW_WALK
    for pos = from, mmin(rec.cursor, from + RW_WALK) - 1 do
      local task = perm(pos)
      -- (a split task whose head was acked at the cut: its tail alone, an orphan)
      if rcall('GETBIT', K_DONE, task) == 0
          and (dead_empty() or rcall('SISMEMBER', K_DEAD, task) == 0)
          and (mnum(F.P_BACKUPS) == 0 or not head_acked(fmt(task))) then
        CALL.FRONT_EMPTY = false
        rcall('ZADD', K_FRONT, mincr(F.FSEQ), task)
      end
    end
    return
  end
  if step == 'mark' then
    local got = rcall('ZRANGEBYSCORE', K_PASSIDX, '(' .. fmt(rec.sum_seq or 0), '+inf',
      'WITHSCORES', 'LIMIT', arg * RW_MARK, RW_MARK)
    for i = 1, #got, 2 do
      local field, seq = got[i], got[i + 1]
      local raw = rcall('HGET', K_PASSES, field)
      local s = raw and cjson.decode(raw)
      if s and not s.rewound then
        s.rewound, s.rewound_to = true, id
        rcall('HDEL', K_PASSES, field)
        rcall('ZREM', K_PASSIDX, field)
        field = field .. '/w' .. fmt(epoch)
        rcall('ZADD', K_PASSIDX, seq, field)
        rcall('HSET', K_PASSES, field, cjson.encode(s))
      end
    end
    return
  end
end

if mget(F.RW_OPEN) ~= id or mnum(F.RW_EPOCH) ~= epoch then return done({C.STALE}) end
-- where this step stands in the plan: steps before it, and its own pages
local plan, at = {}, 0
for v in string.gmatch(mget(F.RW_PLAN) or '', '%d+') do plan[#plan + 1] = tonum(v) end
local pages = 0
for i, s in lipairs(STEPS) do
  if s == step then pages = plan[i] or 0; break end
  at = at + (plan[i] or 0)
end
local done_steps = mnum(F.RW_STEP)
if step == 'seal' then
  if done_steps < at then return done({C.INVALID}) end
else
  if arg >= pages or at + arg > done_steps then return done({C.INVALID}) end
  if at + arg < done_steps then return done({C.OK}) end  -- a repeat: done already
  mput(F.RW_STEP, done_steps + 1)
end
if step ~= 'seal' then
  restore_page(step, rec, id, arg, epoch)
  return done({C.OK})
end
-- seal: the count is the restored set's size; a dead task is never done (the cut had
-- none; a checkpoint made before the dead pages is checked here)
if not rec.xpages then dead_and_done(true) end
recount_done()
mset(F.STATE, 'running', F.REASON, '', F.RW_OPEN, '', F.RW_LAST, id,
  F.RW_ACKS, mnum(F.ACKED_JOB))
CALL.STATE = 'running'
event('rewound', 'checkpoint', id, 'pass', fmt(rec.pass), 'done', mget(F.NDONE))
broadcast()
check_pass_end()
return done({C.OK})
