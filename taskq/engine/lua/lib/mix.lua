-- mix.lua: a mixed job's order of a pass (docs/mixing.md). A mixed job is a plain job whose
-- tasks are its sources' tasks, copied at create in source order (source s owns the ids
-- off_s .. off_s + n_s - 1), and whose pass order is the mix schedule instead of the seeded
-- permutation (meta 'shuffle' = 'm'): position k of pass p is *slot* p * N + k. The
-- schedule is a pure function of the sources' sizes and the weight log (taskq/mix.py
-- `pass_schedule` is the same rule in Python); a slot once charged keeps its task for good
-- (the sequence is stored, so a rewind, a pass reset or a re-dispatch never changes which
-- task a slot is), and a weight change holds from a slot not yet handed out.
-- Slots are charged a page (PAGE positions) ahead of the leases: meta 'mixh' is the slot
-- the stored sequence of the state's pass ends before, 'mixd' the slot no lease reached
-- yet (both hot meta fields: a lease below 'mixh' is one GETRANGE, no state read).
-- Keys (cold; their fields: docs/design.md's table of keys): 'mix' hash, the schedule's
-- state at its high-water ("s": one struct-packed string, read and written once a page:
-- '>ddddd' the pass, positions charged, the segment's first position, the next logged
-- change's slot or -1, 1 when the next charge starts a segment; then per source '>I4' its
-- tasks, the tasks it gave in the pass, in the segment, and '>d' its weight; "s0" the same
-- at the last page's start; ":<p>" as pass p was left);
-- 'mixsz' the tasks' sizes in samples when the weights count them ('>I4' by task id);
-- 'mixseq<p % 3>' pass p's tasks by position (8 hex digits each: SETRANGE / GETRANGE,
-- O(1)); 'mixlog' "<slot>|<seq, 12 digits>|<w,w,...>" scored by slot (the last wins).
local rcall, tonum, smatch, sgmatch, ssub, sformat, tconcat, lipairs =
  redis.call, tonumber, string.match, string.gmatch, string.sub, string.format,
  table.concat, ipairs
local fmt, mget, mnum, mput = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.mput
local mmax, mmin, unpack = math.max, math.min, unpack
local segment, choice, choose, settle, choose_by_samples, sizes_reader =
  lib.mixrule.segment, lib.mixrule.choice, lib.mixrule.choose, lib.mixrule.settle,
  lib.mixrule.choose_by_samples, lib.mixrule.sizes_reader
local unpack_state, pack_state = lib.mixrule.unpack_state, lib.mixrule.pack_state

local KEEP = 3  -- constant
-- Positions charged at once (a page: the state read and written, the tasks stored, once a
-- page; bench/mix.py). A weight change inside the page cuts it at its slot (mix_set).
local PAGE = 256  -- constant
local READ = 32  -- constant: stored positions a lease call reads at once (one GETRANGE)

local SPEC = nil  -- per call: the decoded F.MIX {sources, n, w, on_exhausted}
local ST = nil  -- per call: the schedule's state, when read (false: none yet)
local ST_DIRTY = false  -- per call

local function spec()
  if not SPEC then SPEC = cjson.decode(mget(F.MIX)) end
  return SPEC
end

-- "a,b,..." as a list of numbers (logged weights, the kept passes).
local function numbers(list)
  local out = {}
  for v in sgmatch(list, '[^,]+') do out[#out + 1] = tonum(v) end
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

local function by_samples()
  return spec().by == 'samples'
end

local function read_state()
  if ST == nil then
    local r = rcall('HMGET', kc('mix'), 's', 's0', 'kp')
    if r[1] then
      ST = unpack_state(r[1], numbers(r[3] or ''), by_samples())
      ST.s0 = r[2]
    else
      ST = false
    end
  end
  return ST
end

local function fresh_state(p, kp)
  local n, zero, k = spec().n, {}, #spec().n
  for i = 1, k do zero[i] = 0 end
  local start = p * mnum(F.N)
  local st = {p = p, h = 0, seg = 0, nx = next_change(start), rs = 1, kp = kp, n = n, sm = by_samples(),
    t = zero, c = {unpack(zero)}, w = numbers(weights_at(start)), o = {}}
  local at = 0
  for i = 1, k do st.o[i], at = at, at + n[i] end
  st.s0 = pack_state(st)
  return st
end

local function seq_key(p)
  return kc('mixseq' .. fmt(p % KEEP))
end

local function is_kept(st, p)
  for _, q in lipairs(st.kp) do if q == p then return true end end
  return false
end

-- The state's fields as HSET arguments, each name with `sfx`.
local function state_args(st, sfx, args)
  args[#args + 1] = 's' .. sfx
  args[#args + 1] = pack_state(st)
  args[#args + 1] = 's0' .. sfx
  args[#args + 1] = st.s0
  return args
end

-- Drops the sequence and the saved state of pass q.
local function drop_pass(q)
  rcall('UNLINK', seq_key(q))
  local sfx = ':' .. fmt(q)
  rcall('HDEL', kc('mix'), 's' .. sfx, 's0' .. sfx, 'd' .. sfx)
end

-- The saved state of pass p (kept) and its positions handed out, or nil.
local function saved_state(p, kp)
  local sfx = ':' .. fmt(p)
  local r = rcall('HMGET', kc('mix'), 's' .. sfx, 's0' .. sfx, 'd' .. sfx)
  if not r[1] then return nil end
  local st = unpack_state(r[1], kp, by_samples())
  st.s0 = r[2]
  return st, tonum(r[3] or '0')
end

-- Pass p's state made current: its saved one when `kept` (a rewind back to it) or a new
-- one; p joins the kept passes `keep`; the meta's high-waters follow it.
local function enter(p, keep, kept)
  local base = p * mnum(F.N)
  local st, d = nil, 0
  if not is_kept({kp = keep}, p) then keep[#keep + 1] = p end
  if kept then st, d = saved_state(p, keep) end
  if st then
    st.nx, st.raw = next_change(base + st.h - 1), nil
  else
    st, d = fresh_state(p, keep), 0
    rcall('UNLINK', seq_key(p))  -- (an older pass's, not kept)
  end
  mput(F.MIXH, base + st.h)
  mput(F.MIXD, base + d)
  ST, ST_DIRTY = st, true
  return st
end

-- The state of pass p made current: the one being left saved under ":<its pass>", the
-- one of p loaded (a rewind back to it) or made. Going to p keeps the sequences of p and the
-- KEEP - 1 passes before it; later passes' go (the log makes them again, with any change
-- set since), older ones too.
local function switch_to(p)
  local st = read_state()
  local kept = {}
  if st then
    local sfx = ':' .. fmt(st.p)
    local args = state_args(st, sfx, {})
    args[#args + 1] = 'd' .. sfx
    args[#args + 1] = fmt(mmax(0, mnum(F.MIXD) - st.p * mnum(F.N)))
    rcall('HSET', kc('mix'), unpack(args))
    kept = st.kp
  end
  local keep = {}
  for _, q in lipairs(kept) do
    if q > p or q <= p - KEEP then drop_pass(q) elseif q ~= p then keep[#keep + 1] = q end
  end
  local was_kept = is_kept({kp = kept}, p)
  -- the log below the kept passes goes, but for the change in force at their start
  local cut = (p - KEEP + 1) * mnum(F.N)
  if cut > 0 then
    local last = rcall('ZREVRANGEBYSCORE', kc('mixlog'), fmt(cut), '-inf', 'WITHSCORES', 'LIMIT',
      0, 1)
    if #last > 0 then rcall('ZREMRANGEBYSCORE', kc('mixlog'), '-inf', '(' .. last[2]) end
  end
  return enter(p, keep, was_kept)
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
  return tonum(rcall('GETRANGE', seq_key(p), pos * 8, pos * 8 + 7), 16)
end

-- Charges the next page of the state's pass by the deadline rule (lib/mixrule.lua), stored
-- in one SETRANGE; returns the page (8 hex digits a position) and its first position.
-- With `upto`, instead, the state is walked on to position `upto` by the positions stored
-- there (the rule not asked: a weight change's state at its slot, mix_set).
local function charge_page(st, upto)
  local nn = mnum(F.N)
  local base = st.p * nn
  local n, t, c, o, k = st.n, st.t, st.c, st.o, #st.n
  local h0 = st.h
  local last, kept = upto, nil
  if upto then
    kept = rcall('GETRANGE', seq_key(st.p), h0 * 8, upto * 8 - 1)
  else
    last = mmin(h0 + PAGE, nn)
    st.s0 = pack_state(st)
  end
  st.raw = nil
  local out, act, w, d, ch = {}, nil, nil, 0, nil
  local size_of, m_samples = nil, 0
  if by_samples() then
    size_of = sizes_reader(kc('mixsz'))
    for i = 1, k do m_samples = m_samples + c[i] end
  end
  for h = h0, last - 1 do
    local slot = base + h
    if st.nx >= 0 and slot >= st.nx then
      st.w = numbers(weights_at(slot))
      st.nx = next_change(slot)
      st.rs = 1
    end
    if st.rs == 1 then
      st.seg, st.rs, act, m_samples = h, 0, nil, 0
      for i = 1, k do c[i] = 0 end
    end
    local m = h - st.seg + 1
    local best
    if kept then
      local at = (h - h0) * 8
      local task = tonum(ssub(kept, at + 1, at + 8), 16)
      best = k
      while o[best] > task do best = best - 1 end
    elseif size_of then
      if not act then act, w = segment(t, n, st.w) end
      best = choose_by_samples(w, c, t, o, size_of, m_samples)
    else
      if not act then
        act, w, d = segment(t, n, st.w)
        ch = choice(act, c, w, d, m)
      end
      best = choose(ch, act, m)
    end
    local step = 1
    if size_of then step = size_of(o[best] + t[best]); m_samples = m_samples + step end
    local tb, cb = t[best] + 1, c[best] + step
    t[best], c[best] = tb, cb
    if tb >= n[best] then
      st.rs = 1  -- (drop: the others renormalise from here)
    elseif ch then
      settle(ch, best, cb, w[best], d, m)
    end
    if not kept then out[#out + 1] = sformat('%08x', o[best] + tb - 1) end
  end
  st.h = last
  mput(F.MIXH, base + last)
  ST_DIRTY = true
  if kept then return kept, h0 end
  local page = tconcat(out)
  rcall('SETRANGE', seq_key(st.p), h0 * 8, page)
  return page, h0
end

-- The order of the current pass (passes.lua perm_fn's, for a mixed job): position ->
-- task. With `charges`, a position not stored is charged with its page (dispatch walks the
-- cursor one position at a time) and one handed out raises the meta's MIXD; without, a
-- position not stored is nil (peek stops there: mix_charged).
local function mix_perm(charges)
  local p = mnum(F.PASS)
  local base = p * mnum(F.N)
  local key = seq_key(p)
  local blk, blk0, blk1 = '', 0, 0  -- the stored positions [blk0, blk1), read at once
  return function(pos)
    local slot = base + pos
    local task = nil
    if pos >= blk0 and pos < blk1 then
      local at = (pos - blk0) * 8
      task = tonum(ssub(blk, at + 1, at + 8), 16)
    elseif slot < mnum(F.MIXH) then
      local upto = mmin(mnum(F.MIXH) - base, pos + READ)
      blk = rcall('GETRANGE', key, pos * 8, upto * 8 - 1)
      blk0, blk1 = pos, pos + (#blk - #blk % 8) / 8
      task = tonum(ssub(blk, 1, 8), 16)
    end
    if not task then
      if not charges then return nil end
      local st = read_state()
      if not st or st.p ~= p then st = switch_to(p) end
      if pos < st.h then
        task = stored(p, pos)  -- (a pass come back to: its own state)
      else
        while pos >= st.h do blk, blk0 = charge_page(st) end
        blk1 = blk0 + #blk / 8
        local at = (pos - blk0) * 8
        task = tonum(ssub(blk, at + 1, at + 8), 16)
      end
    end
    if charges and slot >= mnum(F.MIXD) then mput(F.MIXD, slot + 1) end
    return task
  end
end

-- Positions of pass p handed out so far (its sequence's length; 0 when not kept).
local function mix_charged(p)
  local st = read_state()
  if not st then return 0 end
  if st.p == p then return mmax(0, mnum(F.MIXD) - p * mnum(F.N)) end
  if not is_kept(st, p) then return 0 end
  local _, d = saved_state(p, st.kp)
  return d or 0
end

-- True when pass p's sequence is kept up to position `upto` (a rewind's cut). At 0, when
-- p is kept, nothing was charged yet, or p is the current pass (not charged since it
-- started): a pass charged once and no longer kept would come again from a trimmed log.
local function mix_kept(p, upto)
  local st = read_state()
  if upto == 0 then return not st or is_kept(st, p) or p == mnum(F.PASS) end
  return stored(p, upto - 1) ~= nil
end

-- The slot from which weights set now hold: `at` (-1: none) or, if handed out already, the
-- first slot not handed out. The change is logged and the state learns of it: a page
-- charged past `at` goes back to its start (its positions before `at` come again the
-- same; at most a page is charged again). Sequences of passes after the current one (left by a rewind to an earlier pass)
-- go: the log makes them again, with this change.
local function mix_set(ws, at)
  local p = mnum(F.PASS)
  local base = p * mnum(F.N)
  local first = base + mix_charged(p)
  if at < first then at = first end
  local st = read_state()
  if st then
    local keep = {}
    for _, q in lipairs(st.kp) do
      if q > p then drop_pass(q) else keep[#keep + 1] = q end
    end
    st.kp, ST_DIRTY = keep, true
    if st.p > p then enter(p, keep, is_kept(st, p)) end  -- (its sequence just went)
  end
  local seq = rcall('HINCRBY', kc('mix'), 'lseq', 1)
  -- (the last of a slot wins: one entry a slot, so the log is bounded by the slots kept)
  rcall('ZREMRANGEBYSCORE', kc('mixlog'), fmt(at), fmt(at))
  rcall('ZADD', kc('mixlog'), fmt(at), fmt(at) .. '|' .. sformat('%012d', seq) .. '|'
    .. tconcat(ws, ','))
  st = read_state()
  if st and st.p == p then
    if at < base + st.h then
      -- charged ahead past `at`: the state at `at` made again from the page's start by
      -- the positions stored before `at` (the log below `at` is as it was), and those from
      -- `at` on dropped: the lease that reaches `at` charges them, with the change
      local back = unpack_state(st.s0, st.kp, by_samples())
      back.s0, back.nx, back.raw = st.s0, next_change(base + back.h - 1), nil
      ST = back
      charge_page(back, at - base)
    elseif st.nx < 0 or at < st.nx then
      st.nx, st.raw = at, nil
    end
    ST_DIRTY = true
  end
  return at
end

-- This call's writes of the state (dispatch, after its cursor walk).
local function mix_flush()
  if not ST_DIRTY then return end
  local kp = {}
  for i, q in lipairs(ST.kp) do kp[i] = fmt(q) end
  local args = state_args(ST, '', {})
  args[#args + 1] = 'kp'
  args[#args + 1] = tconcat(kp, ',')
  rcall('HSET', kc('mix'), unpack(args))
  ST_DIRTY = false
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  SPEC, ST, ST_DIRTY = nil, nil, false
end

return {mix_perm = mix_perm, mix_charged = mix_charged, mix_kept = mix_kept, mix_set = mix_set,
  mix_flush = mix_flush, spec = spec, reset = reset}
