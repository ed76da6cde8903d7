-- mixslot.lua: a mixed job's slots as the lease sees them (docs/mixing.md): the cursor's
-- walk charges the positions it reaches (mix_charge, lib/mix.lua's pages), a granted
-- slot's chunks are its copy's (mix_fields: the copy ids its pass's stored sequence holds,
-- lib/mixseq.lua, read with one GETRANGE) and its reply names the copy's source; before
-- the cursor goes back or to another pass, how far it reached is noted (mix_note: 'mixd');
-- a slot granted past the cursor is recorded (handed: 'mixahead').
local rcall, tonum, ssub, lipairs, mmin = redis.call, tonumber, string.sub, ipairs, math.min
local fmt, mget, mnum, mput = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.mput
local read_state, switch_to, charge_page, get_seq =
  lib.mix.read_state, lib.mix.switch_to, lib.mix.charge_page, lib.mixseq.get

local W = 10  -- constant: the width of a stored position (lib/mixseq.lua)
local RESOLVE_SPAN = 64  -- constant: granted positions read in one GETRANGE when this close

-- The copy id stored at position `pos` of pass p, as stored (10 hex digits; nil: not
-- charged, or not kept).
local function stored(p, pos)
  local st = read_state()
  if not st then return nil end
  if st.p == p then
    if pos >= st.h then return nil end
  elseif not lib.mix.is_kept(st, p) then
    return nil
  end
  local e = get_seq(p, pos, pos + 1)
  return #e == W and e or nil
end

-- The positions of the current pass stored so far, from the hot meta field alone (-1:
-- the state is another pass's, or none yet: mix_charge makes it the current pass's).
-- (A state of another pass never has 'mixh' in (base, base + N]: a later pass's with
-- nothing charged is never stored, enter() is followed by a charge; at base, the state may
-- be the pass before's, and the walk's first position charges, mix_charge.)
local function mix_high()
  local nn = mnum(F.N)
  local h = mnum(F.MIXH) - mnum(F.PASS) * nn
  if h < 0 or h > nn then return -1 end
  return h
end

-- Positions of the current pass charged up to `pos` at least (the pages that reach it;
-- the cursor's walk, dispatch, before it grants `pos`); returns the positions stored.
local function mix_charge(pos)
  local p = mnum(F.PASS)
  local st = read_state()
  if not st or st.p ~= p then st = switch_to(p) end
  while pos >= st.h and st.rs ~= 2 do  -- (rs 2: the pass stopped)
    local was = st.h
    charge_page(st)
    if st.h == was then break end  -- (a stream source's slot waits for its feed)
  end
  return st.h
end

-- The positions of the current pass charged, as the front's pops see them (dispatch: a
-- slot past them, a dead slot retried, waits in the front until the cursor's walk charges
-- it; the walk charges from there, mix_charge).
local function mix_front(front_empty)
  local h = mix_high()
  if h <= 0 and not front_empty then h = mix_charge(-1) end
  return h
end

-- The slots of the reply rows `out` granted at or past the cursor (from the front: a dead
-- slot retried; `hi` the highest) are handed out, the positions between them and the
-- cursor not: each recorded in 'mixahead', so a weight change never charges it again
-- (lib/mix.lua mix_charged) and a pass left early counts it (switch_to). Those below the
-- cursor go (its reach counts them): the record stays within the page charged ahead.
local function handed(out, hi)
  local cursor = mnum(F.CURSOR)
  if hi < cursor then return end
  local args = {}
  for _, g in lipairs(out) do
    if g[1] >= cursor then args[#args + 1] = fmt(g[1]); args[#args + 1] = fmt(g[1]) end
  end
  rcall('ZREMRANGEBYSCORE', kc('mixahead'), '-inf', '(' .. fmt(cursor))
  rcall('ZADD', kc('mixahead'), unpack(args))
end

-- The copy ids (10 hex digits, the chunks hash's fields) of the slots of the reply rows
-- `out` (element 1: the position; stored: charged before they are handed out, dispatch):
-- one GETRANGE when they lie within RESOLVE_SPAN positions (two across a block's end), else
-- one each.
local function mix_fields(out)
  local p = mnum(F.PASS)
  local n, lo = #out, out[1][1]
  local hi = lo
  for k = 2, n do
    local v = out[k][1]
    if v < lo then lo = v elseif v > hi then hi = v end
  end
  handed(out, hi)
  local fields = {}
  if hi - lo < RESOLVE_SPAN then
    local blk = get_seq(p, lo, hi + 1)
    for k = 1, n do
      local at = (out[k][1] - lo) * W
      fields[k] = ssub(blk, at + 1, at + W)
    end
  else
    for k = 1, n do
      local v = out[k][1]
      fields[k] = get_seq(p, v, v + 1)
    end
  end
  return fields
end

-- The copy id of position `pos` of the current pass (nil: not charged): what a dead
-- slot's death, retry or rewind marks in the dead copies (lib/mixdead.lua).
local function copy_at(pos)
  return stored(mnum(F.PASS), tonum(pos))
end

-- The reply rows of granted slots (dispatch take(): `fields` their copy ids) name their
-- copy's source, 0-based, after the piece's end (-1: none; trainer/iteration.py).
local function mix_sources(out, fields)
  for k, g in lipairs(out) do
    if g[7] == nil then g[7] = -1 end
    g[8] = tonum(ssub(fields[k], 1, 2), 16)
  end
end

-- Before the cursor of a mixed job goes back or to another pass (a reset, the next pass,
-- a rewind): 'mixd' raised to the slot it reached, when the state is the cursor's pass
-- (else the cursor is below the pass's saved reach: it moved from a cut under it).
local function mix_note()
  if mget(F.SHUFFLE) ~= 'm' then return end
  local nn = mnum(F.N)
  local base = mnum(F.PASS) * nn
  local h = mnum(F.MIXH) - base
  if h <= 0 or h > nn then return end  -- (at 0: nothing of this pass charged, or another's)
  local reached = base + mmin(h, mnum(F.CURSOR))
  if reached > mnum(F.MIXD) then mput(F.MIXD, reached) end
end

-- True when pass p's sequence is kept up to position `upto` (a rewind's cut). At 0, when
-- p is kept, nothing was charged yet, or p is the current pass (not charged since it
-- started): a pass charged once and no longer kept would come again from a trimmed log.
local function mix_kept(p, upto)
  local st = read_state()
  if upto == 0 then return not st or lib.mix.is_kept(st, p) or p == mnum(F.PASS) end
  return stored(p, upto - 1) ~= nil
end

-- A rewind to pass p: the schedule's state made pass p's (switch_to: its saved state when
-- kept, else a fresh one; later passes' sequences go, as at the lease that would switch
-- it), so the meta's 'mixh', 'mixd' and 'mixe' are pass p's before a lease charges it
-- again (tasks_n reads the pass's length from them: a stream source's pass is what its
-- charge reached, a stop pass ends at 'mixe').
local function mix_rewound(p)
  local st = read_state()
  if not st then return end
  if st.p ~= p then
    switch_to(p)
  else
    mput(F.MIXE, st.rs == 2 and p * mnum(F.N) + st.h or -1)
  end
  lib.mix.mix_flush()
end

return {mix_kept = mix_kept, mix_rewound = mix_rewound, mix_front = mix_front,
  mix_charge = mix_charge, mix_fields = mix_fields, mix_sources = mix_sources,
  mix_note = mix_note, copy_at = copy_at}
