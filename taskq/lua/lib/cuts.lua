-- cuts.lua: a checkpoint's records and pages (checkpoint.lua takes the cut), and the steps
-- of a rewind that restore the cut and derive the rest from it (rewind.lua).
-- A checkpoint's pages, fields of the ckpt hash: '<id>:d:<k>' done bitmap, '<id>:x:<k>'
-- dead bitmap (CK_PAGE_BYTES each), '<id>:p:<k>' progress ('task:samples,...').

-- (CK_PAGE_BYTES: the bytes of a bitmap one checkpoint page holds, 8 x as many tasks;
-- CK_PAGE_PAIRS: the most (task, samples) pairs in one page of its progress; both
-- constants of scripts.py, written into the library as numbers)

local function ck_record(id)
  local raw = rcall('HGET', K_CKPT, id)
  if not raw then return nil end
  return cjson.decode(raw)
end

-- Removes every field of checkpoint `id` (its record names its pages).
local function ck_drop(id)
  local rec = ck_record(id)
  local fields = {id}
  if rec then
    for k = 0, (rec.pages or 0) - 1 do fields[#fields + 1] = id .. ':d:' .. k end
    for k = 0, (rec.xpages or 0) - 1 do fields[#fields + 1] = id .. ':x:' .. k end
    for k = 0, (rec.ppages or 0) - 1 do fields[#fields + 1] = id .. ':p:' .. k end
  end
  rcall('HDEL', K_CKPT, unpk(fields))
  rcall('ZREM', K_CKPTS, id)
end

-- A checkpoint id (lib/args.lua's idiom): 1-64 of [A-Za-z0-9._-], so never the ':' that
-- separates it from its page in the checkpoint hash's field names.
local function arg_ckpt(v, name)
  if ltype(v) ~= 'string' or #v < 1 or #v > 64 or not smatch(v, '^[A-Za-z0-9._-]+$') then
    arg_fail(name, 'not 1-64 of A-Z a-z 0-9 . _ -', v)
    return ''
  end
  return v
end

-- One page k of a rewind's step (page | dead | todo | walk | mark) to checkpoint `rec`
-- (id `id`) under rewind epoch `epoch`; the caller checked the order (rewind.lua).
--   page: done-bitmap page k back
--   dead: dead-bitmap page k: what was dead at the cut is dead again (the set and its
--     bitmap), what was live is live (its failure counts cleared); 256-byte blocks are
--     compared as strings, bits only where they differ
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
    local from = arg * CK_PAGE_BYTES
    local cut = rcall('HGET', K_CKPT, id .. ':x:' .. arg) or ''
    local now = rcall('GETRANGE', K_DEADBITS, from, from + CK_PAGE_BYTES - 1)
    local len = mmax(#cut, #now)
    if #cut < len then cut = cut .. string.rep('\0', len - #cut) end
    if #now < len then now = now .. string.rep('\0', len - #now) end
    if cut == now then return end
    -- blocks of 256 bytes compared as strings; bits only where they differ
    for b = 1, len, 256 do
      local e = mmin(b + 255, len)
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
                DEAD_EMPTY = false
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
    local page = rcall('HGET', K_CKPT, id .. ':p:' .. arg) or ''
    for task, samples in string.gmatch(page, '(%d+):(%d+)') do
      if samples ~= '0' then
        rcall('HSET', K_PROGRESS, task, samples)
        PROGRESS_EMPTY = false
      end
    end
    return
  end
  if step == 'walk' then
    -- (after the done and dead pages: the sets are the cut's)
    local perm = perm_fn(mnum(F.N))
    local from = arg * RW_WALK
    for pos = from, mmin(rec.cursor, from + RW_WALK) - 1 do
      local task = perm(pos)
      if rcall('GETBIT', K_DONE, task) == 0
          and (dead_empty() or rcall('SISMEMBER', K_DEAD, task) == 0) then
        FRONT_EMPTY = false
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
