-- mix.lua: a mixed job's order of a pass (docs/mixing.md). A mixed job is a plain job whose
-- tasks are its sources' tasks, copied at create in source order (source s owns the ids
-- off_s .. off_s + n_s - 1), and whose pass order is the mix schedule instead of the seeded
-- permutation (meta 'shuffle' = 'm'): position k of pass p is *slot* p * N + k. The
-- schedule is a pure function of the sources' sizes and the weight log (taskq/mix.py
-- `pass_schedule` is the same rule in Python); a slot once charged keeps its task for good
-- (the sequence is stored, so a rewind, a pass reset or a re-dispatch never changes which
-- task a slot is), and a weight change holds from a slot not yet charged.
-- Keys (cold): 'mix' hash, the schedule's state at its high-water: "s" = "p,h,seg,nx,rs"
-- (the pass, positions charged, the segment's first position, the next logged change's
-- slot or -1, 1 when the next charge starts a segment), "t" / "c" the tasks each source
-- gave in the pass / the segment (8 hex digits a source: a charge rewrites one source's
-- digits, not a document), "w" the weights in force (as logged, ',' between); the same
-- with ":<p>" as pass p was left; "n" the sources' sizes (8 hex digits each), "kp" the
-- passes whose sequence is kept, "lseq" the log's sequence. 'mixseq<p % 3>' strings: pass
-- p's tasks by position, 8 hex digits each (text, as every client reads replies as text;
-- SETRANGE / GETRANGE, O(1)). 'mixlog' zset: "<slot>|<seq, 12 digits>|<w,w,...>" scored by
-- slot (the last of a slot wins).
local rcall, tonum, smatch, sgmatch, ssub, srep, sformat, tconcat, lipairs =
  redis.call, tonumber, string.match, string.gmatch, string.sub, string.rep, string.format,
  table.concat, ipairs
local fmt, mget, mnum = lib.meta.fmt, lib.meta.mget, lib.meta.mnum

local KEEP = 3  -- constant

local SPEC = nil  -- per call: the decoded F.MIX {sources, n, w, on_exhausted}
local ST = nil  -- per call: the schedule's state, when read (false: none yet)
local ST_DIRTY = false  -- per call

local function spec()
  if not SPEC then SPEC = cjson.decode(mget(F.MIX)) end
  return SPEC
end

local function hex_list(s)
  local out = {}
  for i = 1, #s / 8 do out[i] = tonum(ssub(s, 8 * i - 7, 8 * i), 16) end
  return out
end

local function csv(s)
  local out = {}
  for v in sgmatch(s, '[^,]+') do out[#out + 1] = v end
  return out
end

-- The weights in force at `slot` (the last logged at or below it; the create's if none),
-- as logged: "w,w,...".
local function weights_at(slot)
  local got = rcall('ZREVRANGEBYSCORE', kc('mixlog'), fmt(slot), '-inf', 'LIMIT', 0, 1)
  if #got > 0 then return smatch(got[1], '^[^|]*|[^|]*|(.*)$') end
  return tconcat(spec().w, ',')
end

-- The slot of the first logged change strictly after `slot` (-1: none).
local function next_change(slot)
  local got = rcall('ZRANGEBYSCORE', kc('mixlog'), '(' .. fmt(slot), '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  if #got > 0 then return tonum(got[2]) end
  return -1
end

-- A state from its fields (s, t, c, w: strings; kp, n: the job's). The lists t, c, w, n
-- are made when a charge needs them (lists()).
local function decode(s, t, c, w, kp, n)
  local p, h, seg, nx, rs = smatch(s, '^(%d+),(%d+),(%d+),(-?%d+),(%d)$')
  return {p = tonum(p), h = tonum(h), seg = tonum(seg), nx = tonum(nx), rs = tonum(rs),
    ts = t, cs = c, ws = w, kp = kp, ns = n}
end

local function read_state()
  if ST == nil then
    local r = rcall('HMGET', kc('mix'), 's', 't', 'c', 'w', 'kp', 'n')
    if r[1] then
      local kp = {}
      for _, q in lipairs(csv(r[5] or '')) do kp[#kp + 1] = tonum(q) end
      ST = decode(r[1], r[2], r[3], r[4], kp, r[6])
    else
      ST = false
    end
  end
  return ST
end

-- The lists a charge reads: t, c (numbers), w (the weights, numbers), n, o (the sources'
-- sizes and first task ids).
local function lists(st)
  if st.t then return end
  st.t, st.c, st.n = hex_list(st.ts), hex_list(st.cs), hex_list(st.ns)
  st.w = {}
  for i, v in lipairs(csv(st.ws)) do st.w[i] = tonum(v) end
  st.o = {}
  local at = 0
  for i = 1, #st.n do st.o[i], at = at, at + st.n[i] end
end

local function fresh_state(p, kp, ns)
  if not ns then
    local parts = {}
    for i, n in lipairs(spec().n) do parts[i] = sformat('%08x', n) end
    ns = tconcat(parts)
    rcall('HSET', kc('mix'), 'n', ns)
  end
  local zero = srep('00000000', #ns / 8)
  local start = p * mnum(F.N)
  return decode(fmt(p) .. ',0,0,' .. fmt(next_change(start)) .. ',1', zero, zero,
    weights_at(start), kp, ns)
end

local function seq_key(p)
  return kc('mixseq' .. fmt(p % KEEP))
end

local function is_kept(st, p)
  for _, q in lipairs(st.kp) do if q == p then return true end end
  return false
end

local function scalars(st)
  return fmt(st.p) .. ',' .. fmt(st.h) .. ',' .. fmt(st.seg) .. ',' .. fmt(st.nx) .. ','
    .. fmt(st.rs)
end

-- Drops the sequence and the saved state of pass q.
local function drop_pass(q)
  rcall('UNLINK', seq_key(q))
  local sfx = ':' .. fmt(q)
  rcall('HDEL', kc('mix'), 's' .. sfx, 't' .. sfx, 'c' .. sfx, 'w' .. sfx)
end

-- The saved state of pass p (kept), or nil.
local function saved_state(p, kp, ns)
  local sfx = ':' .. fmt(p)
  local r = rcall('HMGET', kc('mix'), 's' .. sfx, 't' .. sfx, 'c' .. sfx, 'w' .. sfx)
  if not r[1] then return nil end
  return decode(r[1], r[2], r[3], r[4], kp, ns)
end

-- The state of pass p made current: the one being left saved under ":<its pass>", the
-- one of p loaded (a rewind back to it) or made. Going to p keeps the sequences of p and the
-- KEEP - 1 passes before it; later passes' go (the log makes them again, with any change
-- set since), older ones too.
local function switch_to(p)
  local st = read_state()
  local kept, ns = {}, nil
  if st then
    local sfx = ':' .. fmt(st.p)
    rcall('HSET', kc('mix'), 's' .. sfx, scalars(st), 't' .. sfx, st.ts, 'c' .. sfx, st.cs,
      'w' .. sfx, st.ws)
    kept, ns = st.kp, st.ns
  end
  local was_kept = is_kept({kp = kept}, p)
  local keep = {}
  for _, q in lipairs(kept) do
    if q > p or q <= p - KEEP then drop_pass(q) elseif q ~= p then keep[#keep + 1] = q end
  end
  keep[#keep + 1] = p
  -- the log below the kept passes goes, but for the change in force at their start
  local cut = (p - KEEP + 1) * mnum(F.N)
  if cut > 0 then
    local last = rcall('ZREVRANGEBYSCORE', kc('mixlog'), fmt(cut), '-inf', 'WITHSCORES', 'LIMIT',
      0, 1)
    if #last > 0 then rcall('ZREMRANGEBYSCORE', kc('mixlog'), '-inf', '(' .. last[2]) end
  end
  st = was_kept and saved_state(p, keep, ns)
  if st then
    st.nx = next_change(p * mnum(F.N) + st.h - 1)
  else
    st = fresh_state(p, keep, ns)
    rcall('UNLINK', seq_key(p))  -- (an older pass's, not kept)
  end
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
  lists(st)
  local n, t, c, k = st.n, st.t, st.c, #st.n
  local slot = st.p * mnum(F.N) + st.h
  if st.nx >= 0 and slot >= st.nx then
    st.ws = weights_at(slot)
    st.w = {}
    for i, v in lipairs(csv(st.ws)) do st.w[i] = tonum(v) end
    st.nx = next_change(slot)
    st.rs = 1
  end
  if st.rs == 1 then
    st.seg, st.rs = st.h, 0
    for i = 1, k do c[i] = 0 end
    st.cs = srep('00000000', k)
  end
  -- the segment's weights: the logged ones over the sources not run out; when only
  -- sources of weight 0 are left, equal shares of them
  local w, wn, sum, left = {}, st.w, 0, 0
  for i = 1, k do
    if t[i] < n[i] then
      left = left + 1
      if wn[i] > 0 then sum = sum + wn[i] end
    end
  end
  local pos = 0
  for i = 1, k do
    w[i] = 0
    if t[i] < n[i] then
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
      local dl = (c[i] + d) / w[i]
      if c[i] + 1 - d <= w[i] * m and (not best or dl < best_dl) then best, best_dl = i, dl end
      if not any or dl < any_dl then any, any_dl = i, dl end
    end
  end
  best = best or any
  local task = st.o[best] + t[best]
  t[best], c[best] = t[best] + 1, c[best] + 1
  local at = 8 * best
  st.ts = ssub(st.ts, 1, at - 8) .. sformat('%08x', t[best]) .. ssub(st.ts, at + 1)
  st.cs = ssub(st.cs, 1, at - 8) .. sformat('%08x', c[best]) .. ssub(st.cs, at + 1)
  if t[best] >= n[best] then st.rs = 1 end
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
  local saved = is_kept(st, p) and saved_state(p, st.kp, st.ns)
  if saved then return saved.h end
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
      ST = is_kept(st, p) and saved_state(p, keep, st.ns)
      if not ST then
        ST = fresh_state(p, keep, st.ns)
        rcall('UNLINK', seq_key(p))
      end
    end
  end
  local seq = rcall('HINCRBY', kc('mix'), 'lseq', 1)
  -- (the last of a slot wins: one entry a slot, so the log is bounded by the slots kept)
  rcall('ZREMRANGEBYSCORE', kc('mixlog'), fmt(at), fmt(at))
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
  local kp = {}
  for i, q in lipairs(ST.kp) do kp[i] = fmt(q) end
  rcall('HSET', kc('mix'), 's', scalars(ST), 't', ST.ts, 'c', ST.cs, 'w', ST.ws, 'kp',
    tconcat(kp, ','))
  ST_DIRTY = false
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  SPEC, ST, ST_DIRTY = nil, nil, false
end

return {mix_perm = mix_perm, mix_charged = mix_charged, mix_kept = mix_kept, mix_set = mix_set,
  mix_flush = mix_flush, spec = spec, reset = reset}
