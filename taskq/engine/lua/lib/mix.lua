-- mix.lua: a mixed job's order of a pass (docs/mixing.md). A mixed job is a plain job whose
-- tasks are its sources' tasks, copied at create in source order (source s owns the ids
-- off_s .. off_s + n_s - 1), and whose pass order is the mix schedule instead of the seeded
-- permutation (meta 'shuffle' = 'm'): position k of pass p is *slot* p * N + k. The
-- schedule is a pure function of the sources' sizes and the weight log (taskq/mix.py
-- `pass_schedule` is the same rule in Python); a slot once charged keeps its task for good
-- (the sequence is stored, so a rewind, a pass reset or a re-dispatch never changes which
-- task a slot is), and a weight change holds from a slot not yet charged.
-- Keys (cold): 'mix' hash: "st" the schedule's state at its high-water (JSON: p pass, h
-- positions charged, seg the segment's first position, t / c taken per source in the pass
-- / the segment, w the weights (strings, as logged), nx the next logged change's slot or
-- -1, rs 1 when the next charge starts a segment), "st:<p>" the state a pass was left in,
-- "q:<p>:<b>" the tasks of positions b * BLOCK .. (8 hex digits each: text, as every
-- client reads replies as text), "kept" the
-- passes whose sequence is kept (comma list), "lseq" the log's sequence. 'mixlog' zset:
-- "<slot>|<seq, 12 digits>|<w,w,...>" scored by slot (the last of a slot wins).
local rcall, tonum, smatch, sgmatch, ssub, sformat, tconcat, mfloor, unpk, lipairs, lpairs =
  redis.call, tonumber, string.match, string.gmatch, string.sub, string.format, table.concat,
  math.floor, unpack, ipairs, pairs
local fmt, mget, mnum = lib.meta.fmt, lib.meta.mget, lib.meta.mnum

local BLOCK = 1024  -- constant
local KEEP = 3  -- constant

local SPEC = nil  -- per call: the decoded F.MIX {sources, n, w, on_exhausted}
local OFF = nil  -- per call: each source's first task id
local ST = nil  -- per call: the schedule's state (decoded "st"), when read
local ST_DIRTY = false  -- per call
local BLOCKS = {}  -- per call: "q:<p>:<b>" -> its string, as read or grown
local BLOCKS_DIRTY = {}  -- per call: the set of those fields to write back

local function spec()
  if not SPEC then
    SPEC = cjson.decode(mget(F.MIX))
    OFF = {}
    local at = 0
    for i, n in lipairs(SPEC.n) do OFF[i] = at; at = at + n end
  end
  return SPEC
end

-- The weights (strings) a log entry carries, as a list.
local function entry_weights(member)
  local ws = {}
  for w in sgmatch(smatch(member, '^[^|]*|[^|]*|(.*)$'), '[^,]+') do ws[#ws + 1] = w end
  return ws
end

-- The weights in force at `slot` (the last logged at or below it; the create's if none).
local function weights_at(slot)
  local got = rcall('ZREVRANGEBYSCORE', kc('mixlog'), fmt(slot), '-inf', 'LIMIT', 0, 1)
  if #got > 0 then return entry_weights(got[1]) end
  return spec().w
end

-- The slot of the first logged change strictly after `slot` (-1: none).
local function next_change(slot)
  local got = rcall('ZRANGEBYSCORE', kc('mixlog'), '(' .. fmt(slot), '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  if #got > 0 then return tonum(got[2]) end
  return -1
end

local function read_state()
  if ST == nil then
    local raw = rcall('HGET', kc('mix'), 'st')
    ST = raw and cjson.decode(raw) or false
  end
  return ST
end

local function fresh_state(p)
  local k = #spec().n
  local t, c = {}, {}
  for i = 1, k do t[i], c[i] = 0, 0 end
  local start = p * mnum(F.N)
  return {p = p, h = 0, seg = 0, t = t, c = c, w = weights_at(start), nx = next_change(start),
    rs = 1}
end

-- The passes whose sequence is kept, and that list written back.
local function kept_passes()
  local out = {}
  for v in sgmatch(rcall('HGET', kc('mix'), 'kept') or '', '%d+') do out[#out + 1] = tonum(v) end
  return out
end

-- Drops the sequence and the saved state of pass q (ceil(N / BLOCK) fields).
local function drop_pass(q)
  local fields = {'st:' .. fmt(q)}
  for b = 0, mfloor((mnum(F.N) - 1) / BLOCK) do
    fields[#fields + 1] = 'q:' .. fmt(q) .. ':' .. fmt(b)
  end
  rcall('HDEL', kc('mix'), unpk(fields))
end

-- The state of pass p made current: the one being left saved under "st:<its pass>", the
-- one of p loaded (a rewind back to it) or made. Going to p keeps the sequences of p and the
-- KEEP - 1 passes before it; later passes' go (the log makes them again, with any change
-- set since), older ones too.
local function switch_to(p)
  local st = read_state()
  if st then rcall('HSET', kc('mix'), 'st:' .. fmt(st.p), cjson.encode(st)) end
  local raw = rcall('HGET', kc('mix'), 'st:' .. fmt(p))
  if raw then
    st = cjson.decode(raw)
    st.nx = next_change(p * mnum(F.N) + st.h - 1)
  else
    st = fresh_state(p)
  end
  local keep = {}
  for _, q in lipairs(kept_passes()) do
    if q > p or q <= p - KEEP then drop_pass(q) elseif q ~= p then keep[#keep + 1] = fmt(q) end
  end
  keep[#keep + 1] = fmt(p)
  rcall('HSET', kc('mix'), 'kept', tconcat(keep, ','))
  ST, ST_DIRTY = st, true
  return st
end

local function block(p, b)
  local f = 'q:' .. fmt(p) .. ':' .. fmt(b)
  local s = BLOCKS[f]
  if s == nil then
    s = rcall('HGET', kc('mix'), f) or ''
    BLOCKS[f] = s
  end
  return s, f
end

-- The task at position `pos` of pass p, stored (nil: not charged, or not kept).
local function stored(p, pos)
  local s = block(p, mfloor(pos / BLOCK))
  local at = (pos % BLOCK) * 8
  if #s < at + 8 then return nil end
  return tonum(ssub(s, at + 1, at + 8), 16)
end

-- Charges the next position of the state's pass: the deadline rule (docs/mixing.md).
local function charge(st)
  local sp = spec()
  local n, k = sp.n, #sp.n
  local slot = st.p * mnum(F.N) + st.h
  if st.nx >= 0 and slot >= st.nx then
    st.w = weights_at(slot)
    st.nx = next_change(slot)
    st.rs = 1
  end
  if st.rs == 1 then
    st.seg, st.rs = st.h, 0
    for i = 1, k do st.c[i] = 0 end
  end
  -- the segment's weights: the logged ones over the sources not run out; when only
  -- sources of weight 0 are left, equal shares of them
  local w, sum, left = {}, 0, 0
  for i = 1, k do
    if st.t[i] < n[i] then
      left = left + 1
      local wi = tonum(st.w[i])
      if wi > 0 then sum = sum + wi end
    end
  end
  local pos = 0
  for i = 1, k do
    w[i] = 0
    if st.t[i] < n[i] then
      local wi = tonum(st.w[i])
      if sum > 0 then
        if wi > 0 then w[i] = wi / sum; pos = pos + 1 end
      else
        w[i] = 1 / left; pos = pos + 1
      end
    end
  end
  local d = 0
  if pos >= 2 then d = 1 - 1 / (2 * pos - 2) end
  local m = st.h - st.seg + 1
  local best, best_dl, any, any_dl = nil, nil, nil, nil
  for i = 1, k do
    if w[i] > 0 then
      local dl = (st.c[i] + d) / w[i]
      if st.c[i] + 1 - d <= w[i] * m and (not best or dl < best_dl) then best, best_dl = i, dl end
      if not any or dl < any_dl then any, any_dl = i, dl end
    end
  end
  best = best or any
  local task = OFF[best] + st.t[best]
  st.t[best] = st.t[best] + 1
  st.c[best] = st.c[best] + 1
  if st.t[best] >= n[best] then st.rs = 1 end
  local s, f = block(st.p, mfloor(st.h / BLOCK))
  BLOCKS[f] = s .. sformat('%08x', task)
  BLOCKS_DIRTY[f] = true
  st.h = st.h + 1
  ST_DIRTY = true
  return task
end

-- The order of the current pass (passes.lua perm_fn's, for a mixed job): position ->
-- task. With `charges`, the position after the high-water is charged (dispatch walks the
-- cursor one position at a time, so it never asks beyond it); without, a position not
-- charged is nil (peek stops there: mix_charged).
local function mix_perm(charges)
  local p = mnum(F.PASS)
  return function(pos)
    local task = stored(p, pos)
    if task or not charges then return task end
    local st = read_state()
    if not st or st.p ~= p then st = switch_to(p) end
    return charge(st)
  end
end

-- Positions of pass p charged so far (its sequence's length; 0 when not kept).
local function mix_charged(p)
  local st = read_state()
  if st and st.p == p then return st.h end
  local raw = rcall('HGET', kc('mix'), 'st:' .. fmt(p))
  if raw then return cjson.decode(raw).h end
  return 0
end

-- True when pass p's sequence is kept up to position `upto` (a rewind's cut).
local function mix_kept(p, upto)
  if upto == 0 then return true end
  return stored(p, upto - 1) ~= nil
end

-- The slot from which weights set now hold: `at` (-1: none) or, if charged already, the
-- first slot not charged. The change is logged and the state learns of it.
-- Sequences of passes after the current one (left by a rewind to an earlier pass) go: the
-- log makes them again, with this change.
local function mix_set(ws, at)
  local p = mnum(F.PASS)
  local first = p * mnum(F.N) + mix_charged(p)
  if at < first then at = first end
  local keep = {}
  for _, q in lipairs(kept_passes()) do
    if q > p then drop_pass(q) else keep[#keep + 1] = fmt(q) end
  end
  rcall('HSET', kc('mix'), 'kept', tconcat(keep, ','))
  if read_state() and ST.p > p then
    rcall('HDEL', kc('mix'), 'st')
    ST = false
  end
  local seq = rcall('HINCRBY', kc('mix'), 'lseq', 1)
  rcall('ZADD', kc('mixlog'), fmt(at), fmt(at) .. '|' .. sformat('%012d', seq) .. '|'
    .. tconcat(ws, ','))
  local st = read_state()
  if st and st.p == p and (st.nx < 0 or at < st.nx) then
    st.nx = at
    ST_DIRTY = true
  end
  return at
end

-- This call's writes of the state and the grown blocks (dispatch, after its cursor walk).
local function mix_flush()
  if not ST_DIRTY then return end
  local fields = {'st', cjson.encode(ST)}
  for f in lpairs(BLOCKS_DIRTY) do fields[#fields + 1], fields[#fields + 2] = f, BLOCKS[f] end
  rcall('HSET', kc('mix'), unpk(fields))
  ST_DIRTY, BLOCKS_DIRTY = false, {}
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  SPEC, OFF, ST, ST_DIRTY, BLOCKS, BLOCKS_DIRTY = nil, nil, nil, false, {}, {}
end

return {mix_perm = mix_perm, mix_charged = mix_charged, mix_kept = mix_kept, mix_set = mix_set,
  mix_flush = mix_flush, spec = spec, reset = reset}
