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
-- -1, rs 1 when the next charge starts a segment, n / o the sources' sizes and first task
-- ids, kp the passes whose sequence is kept), "st:<p>" the state a pass was left in,
-- "lseq" the log's sequence. 'mixseq<p % 3>' strings: pass p's tasks by position, 8 hex
-- digits each (text, as every client reads replies as text; SETRANGE / GETRANGE, O(1)).
-- 'mixlog' zset: "<slot>|<seq, 12 digits>|<w,w,...>" scored by slot (the last of a slot
-- wins).
local rcall, tonum, smatch, sgmatch, sformat, tconcat, lipairs =
  redis.call, tonumber, string.match, string.gmatch, string.format, table.concat, ipairs
local fmt, mget, mnum = lib.meta.fmt, lib.meta.mget, lib.meta.mnum

local KEEP = 3  -- constant

local SPEC = nil  -- per call: the decoded F.MIX {sources, n, w, on_exhausted}
local ST = nil  -- per call: the schedule's state (decoded "st"), when read
local ST_DIRTY = false  -- per call

local function spec()
  if not SPEC then SPEC = cjson.decode(mget(F.MIX)) end
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
  local n = spec().n
  local t, c, o, at = {}, {}, {}, 0
  for i = 1, #n do t[i], c[i], o[i], at = 0, 0, at, at + n[i] end
  local start = p * mnum(F.N)
  return {p = p, h = 0, seg = 0, t = t, c = c, w = weights_at(start), nx = next_change(start),
    rs = 1, n = n, o = o, kp = {}}
end

local function seq_key(p)
  return kc('mixseq' .. fmt(p % KEEP))
end

local function is_kept(st, p)
  for _, q in lipairs(st.kp) do if q == p then return true end end
  return false
end

-- Drops the sequence and the saved state of pass q.
local function drop_pass(q)
  rcall('UNLINK', seq_key(q))
  rcall('HDEL', kc('mix'), 'st:' .. fmt(q))
end

-- The state of pass p made current: the one being left saved under "st:<its pass>", the
-- one of p loaded (a rewind back to it) or made. Going to p keeps the sequences of p and the
-- KEEP - 1 passes before it; later passes' go (the log makes them again, with any change
-- set since), older ones too.
local function switch_to(p)
  local st = read_state()
  local kept = {}
  if st then
    rcall('HSET', kc('mix'), 'st:' .. fmt(st.p), cjson.encode(st))
    kept = st.kp
  end
  local raw = is_kept({kp = kept}, p) and rcall('HGET', kc('mix'), 'st:' .. fmt(p))
  if raw then
    st = cjson.decode(raw)
    st.nx = next_change(p * mnum(F.N) + st.h - 1)
  else
    st = fresh_state(p)
    rcall('UNLINK', seq_key(p))  -- (an older pass's, not kept)
  end
  st.kp = {}
  for _, q in lipairs(kept) do
    if q > p or q <= p - KEEP then drop_pass(q) elseif q ~= p then st.kp[#st.kp + 1] = q end
  end
  st.kp[#st.kp + 1] = p
  ST, ST_DIRTY = st, true
  return st
end

-- The task at position `pos` of pass p, stored (nil: not charged, or not kept).
local function stored(p, pos)
  local st = read_state()
  if not st then return nil end
  if st.p == p then
    if pos >= st.h then return nil end
  elseif not is_kept(st, p) then
    return nil
  end
  local r = rcall('GETRANGE', seq_key(p), pos * 8, pos * 8 + 7)
  if #r < 8 then return nil end
  return tonum(r, 16)
end

-- Charges the next position of the state's pass: the deadline rule (docs/mixing.md).
local function charge(st)
  local n, k = st.n, #st.n
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
  local w, wn, sum, left = {}, {}, 0, 0
  for i = 1, k do
    if st.t[i] < n[i] then
      left = left + 1
      local wi = tonum(st.w[i])
      wn[i] = wi
      if wi > 0 then sum = sum + wi end
    end
  end
  local pos = 0
  for i = 1, k do
    w[i] = 0
    if st.t[i] < n[i] then
      local wi = wn[i]
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
  local task = st.o[best] + st.t[best]
  st.t[best] = st.t[best] + 1
  st.c[best] = st.c[best] + 1
  if st.t[best] >= n[best] then st.rs = 1 end
  rcall('SETRANGE', seq_key(st.p), st.h * 8, sformat('%08x', task))
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
    if pos < st.h then return stored(p, pos) end  -- (a pass come back to: its own state)
    return charge(st)
  end
end

-- Positions of pass p charged so far (its sequence's length; 0 when not kept).
local function mix_charged(p)
  local st = read_state()
  if not st then return 0 end
  if st.p == p then return st.h end
  local raw = is_kept(st, p) and rcall('HGET', kc('mix'), 'st:' .. fmt(p))
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
  local st = read_state()
  if st then
    local keep = {}
    for _, q in lipairs(st.kp) do
      if q > p then drop_pass(q) else keep[#keep + 1] = q end
    end
    st.kp, ST_DIRTY = keep, true
    if st.p > p then  -- (its sequence just went: the pass is made again when reached)
      local saved = rcall('HGET', kc('mix'), 'st:' .. fmt(p))
      ST = saved and cjson.decode(saved) or fresh_state(p)
      ST.kp = keep
      if not saved then rcall('UNLINK', seq_key(p)) end
    end
  end
  local seq = rcall('HINCRBY', kc('mix'), 'lseq', 1)
  rcall('ZADD', kc('mixlog'), fmt(at), fmt(at) .. '|' .. sformat('%012d', seq) .. '|'
    .. tconcat(ws, ','))
  st = read_state()
  if st and st.p == p and (st.nx < 0 or at < st.nx) then
    st.nx = at
    ST_DIRTY = true
  end
  return at
end

-- This call's writes of the state and the grown blocks (dispatch, after its cursor walk).
local function mix_flush()
  if not ST_DIRTY then return end
  rcall('HSET', kc('mix'), 'st', cjson.encode(ST))
  ST_DIRTY = false
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  SPEC, ST, ST_DIRTY = nil, nil, false
end

return {mix_perm = mix_perm, mix_charged = mix_charged, mix_kept = mix_kept, mix_set = mix_set,
  mix_flush = mix_flush, spec = spec, reset = reset}
