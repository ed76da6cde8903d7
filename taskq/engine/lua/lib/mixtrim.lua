-- mixtrim.lua: the trim of a mixed job fed by an open stream source (trim.lua walks its
-- positions as a stream's tasks; docs/mixing.md, "Trim"). Under drop and stop a copy is
-- the task of one position of a pass, so in the last pass a done position's copy is never
-- read again: its chunks and its feed ids go with the position's records, each source's
-- count of the trimmed positions moves into the 'mix' hash ('ta:<source index>': what
-- admin/mix.py's status and the audit add to what they read from the watermark up), and
-- the feed log and the weight log go below what a charge can still read.
local rcall, tonum, smatch, ssub, mfloor, mmin, lipairs, lpairs, unpk =
  redis.call, tonumber, string.match, string.sub, math.floor, math.min, ipairs, pairs, unpack
local fmt, mget, mnum = lib.meta.fmt, lib.meta.mget, lib.meta.mnum
local unpack_state, seq_get, seq_forget = lib.mixrule.unpack_state, lib.mixseq.get,
  lib.mixseq.forget

local STRIDE = 4294967296  -- constant: copy id = source (0-based) * STRIDE + its task
local W = 10  -- constant: the width of a stored position (lib/mix.lua W)
local FEED_STEP = 256  -- constant: feed log entries one trim call looks at (> 64 sources)

-- True for a mixed job the trim moves over: its spec names a stream source open at create
-- (a fixed mix's copies are every pass's tasks: never trimmed).
local function mix_fed()
  return mget(F.SHUFFLE) == 'm' and lib.mix.spec().streams ~= nil
end

-- True for a job trimmed behind a watermark (trim.lua): a stream, or a mixed job fed by an
-- open stream source; its checkpoints' cuts hold the watermark (lib/cuts.lua's bound,
-- checkpoint.lua's record of the dead tasks below a cut).
local function trims()
  return (mget(F.STREAM) or '') ~= '' or mix_fed()
end

-- The copy ids (10 hex digits) stored at positions `tasks` (ascending, as strings) of the
-- current pass: the one read of the stored sequence the trim makes (lib/mixseq.lua: one
-- read over them when they lie close, else one a position).
local function copies_at(tasks)
  local p, out = mnum(F.PASS), {}
  local lo, hi = tonum(tasks[1]), tonum(tasks[#tasks])
  if hi - lo < 2 * #tasks + 64 then
    local raw = seq_get(p, lo, hi + 1)
    for _, s in lipairs(tasks) do
      local at = (tonum(s) - lo) * W
      out[#out + 1] = ssub(raw, at + 1, at + W)
    end
  else
    for _, s in lipairs(tasks) do out[#out + 1] = seq_get(p, tonum(s), tonum(s) + 1) end
  end
  return out
end

-- Positions `tasks` of the current pass, done and trimmed now: their copies' fields (what
-- trim.lua drops from the chunks hash and the appends' index), each source's count of
-- them added to its 'ta:<i>' (the positions' acked copies, which the status no longer
-- reads from the sequence).
local function mix_trim_fields(tasks)
  local fields, per = {}, {}
  for _, f in lipairs(copies_at(tasks)) do
    if #f == W then
      fields[#fields + 1] = f
      local i = mfloor(tonum(f, 16) / STRIDE)
      per[i] = (per[i] or 0) + 1
    end
  end
  for i, c in lpairs(per) do rcall('HINCRBY', kc('mix'), 'ta:' .. fmt(i), c) end
  return fields
end

-- The sequence's blocks wholly below the watermark `w` and the lowest position set aside
-- (a dead one, or dead at a kept cut: its retry or a rewind reads its copy), lib/mixseq.lua
-- forget; and the logs (and the repaid slots, lib/mixfeed.lua) below what a charge reads: `floor`
-- is the lower of the pass's slot at `w` and the slot of the last page's start (the state's
-- 's0': a weight change's cut walks the page again from there, reading both logs from that
-- slot on). The weight log keeps its change in force at `floor`; the feed log each stream
-- source's last entry below `floor` (its store in force there, as lib/mixfeed.lua
-- feed_view reads it), looked at FEED_STEP entries a call from the oldest: an entry of a
-- source that has a later one among them goes (with at most 64 sources, a full step always
-- takes some, so the log comes down to that in a few calls).
local function mix_trim_below(w)
  local st = lib.mix.read_state()
  if not st or st.p ~= mnum(F.PASS) then return end
  local low = rcall('ZRANGE', K_ASIDE, 0, 0)[1]
  seq_forget(st.p, low and mmin(w, tonum(low)) or w)
  local h0 = st.s0 and unpack_state(st.s0, {}, false, true).h or st.h
  local floor = fmt(st.p * mnum(F.N) + mmin(w, h0))
  rcall('ZREMRANGEBYSCORE', kc('mixrepaid'), '-inf', '(' .. floor)  -- (read from the watermark)
  local last = rcall('ZREVRANGEBYSCORE', kc('mixlog'), floor, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if last[2] then rcall('ZREMRANGEBYSCORE', kc('mixlog'), '-inf', '(' .. last[2]) end
  local got = rcall('ZRANGEBYSCORE', kc('mixfeed'), '-inf', '(' .. floor, 'LIMIT', 0, FEED_STEP)
  local latest, gone = {}, {}
  for i, e in lipairs(got) do latest[smatch(e, '^[^|]*|[^|]*|(%d+)|')] = i end
  for i, e in lipairs(got) do
    if latest[smatch(e, '^[^|]*|[^|]*|(%d+)|')] ~= i then gone[#gone + 1] = e end
  end
  if #gone > 0 then rcall('ZREM', kc('mixfeed'), unpk(gone)) end
end

return {trims = trims, mix_fed = mix_fed, mix_trim_fields = mix_trim_fields,
  mix_trim_below = mix_trim_below}
