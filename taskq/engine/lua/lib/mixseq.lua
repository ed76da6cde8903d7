-- mixseq.lua: a mixed job's stored sequence (docs/mixing.md), the one part that knows how it
-- is kept: pass p's copy ids by position, 10 hex digits each (lib/mix.lua charges them a
-- page at a time, lib/mixfeed.lua with stream sources; a lease's resolve reads them,
-- lib/mixslot.lua), in blocks of BLOCK positions: block b of pass p is the cold key
-- 'mixseq<p % 3>.<b>', a string holding positions b * BLOCK .. (b + 1) * BLOCK - 1, position
-- pos at byte (pos % BLOCK) * 10 (taskq/keys.py JobKeys.mixseq_block names the same keys).
-- A pass fed by an open stream source never ends: its blocks below the trim's watermark go
-- (forget), which one string could not do (Redis drops no prefix of a string). Stored
-- positions are a run from position 0 up (a charge writes on from where the last ended),
-- less the blocks forgotten: the blocks of a pass that exist are one run of block numbers.
local rcall, floor, mmin, ssub, sformat, tconcat, unpack =
  redis.call, math.floor, math.min, string.sub, string.format, table.concat, unpack

local KEEP = 3  -- constant: the kept passes' keys, p % KEEP (lib/mix.lua KEEP)
local W = 10  -- constant: the width of a stored position (a copy id, 10 hex digits)
local BLOCK = 65536  -- constant: positions a block, 640 KiB (taskq/keys.py MIXSEQ_BLOCK)
local SLICE = 1000  -- constant: keys one UNLINK names at most

local function block_key(p, b)
  return kc(sformat('mixseq%d.%d', p % KEEP, b))
end

-- The stored string of positions lo .. hi - 1 of pass p: one GETRANGE when they lie in
-- one block, else one a block (a page or a resolve's span crosses a boundary at most once).
-- Shorter where not stored: it ends at the first position not stored.
local function get(p, lo, hi)
  if hi <= lo then return '' end
  local b = floor(lo / BLOCK)
  local at = b * BLOCK
  if hi <= at + BLOCK then
    return rcall('GETRANGE', block_key(p, b), (lo - at) * W, (hi - at) * W - 1)
  end
  local parts = {}
  while lo < hi do
    local e = mmin(hi, at + BLOCK)
    local s = rcall('GETRANGE', block_key(p, b), (lo - at) * W, (e - at) * W - 1)
    parts[#parts + 1] = s
    if #s < (e - lo) * W then break end
    lo, b, at = e, b + 1, at + BLOCK
  end
  return tconcat(parts)
end

-- Stores `str` (copy ids, W bytes each) at positions from `lo` on of pass p: one SETRANGE,
-- or one a block when it crosses a boundary.
local function set(p, lo, str)
  local n = #str / W
  local b = floor(lo / BLOCK)
  local at = b * BLOCK
  if lo + n <= at + BLOCK then
    rcall('SETRANGE', block_key(p, b), (lo - at) * W, str)
    return
  end
  local off = 0
  while off < n do
    local e = mmin(lo + n, at + BLOCK)
    rcall('SETRANGE', block_key(p, b), (lo - at) * W, ssub(str, off * W + 1, (off + e - lo) * W))
    off, lo, b, at = off + e - lo, e, b + 1, at + BLOCK
  end
end

-- Unlinks blocks top - 1, top - 2, ... of pass p, SLICE keys a command, down to block 0 or
-- until a slice finds fewer than it names and (`run`) below the run of blocks that exist:
-- `run` false stops at the first such slice (the blocks below `top` known to exist
-- unless forgotten), true at a slice that finds none after one that found some (the blocks
-- above the run may be missing too). Returns the blocks unlinked.
local function unlink_down(p, top, run)
  local gone = 0
  while top > 0 do
    local lo, keys = top > SLICE and top - SLICE or 0, {}
    for b = lo, top - 1 do keys[b - lo + 1] = block_key(p, b) end
    local got = rcall('UNLINK', unpack(keys))
    if run then
      if got == 0 and gone > 0 then break end
    elseif got < top - lo then
      gone = gone + got
      break
    end
    gone, top = gone + got, lo
  end
  return gone
end

-- Drops pass p's sequence: every block holding a position below `upto` (what was ever
-- stored of it: its charged reach and the page a weight change's cut left past it,
-- lib/mix.lua drop_pass). From the top down, one UNLINK a SLICE of blocks, ending below
-- the run that exists (past it, one slice that finds nothing).
local function drop(p, upto)
  unlink_down(p, floor((upto + BLOCK - 1) / BLOCK), true)
end

-- Frees the blocks of pass p whose every position is below `below` (at or under its
-- charged reach: a stream's trim, its watermark); the positions at and above it still
-- resolve. Returns the blocks unlinked (0 when the trim called it before: one UNLINK).
local function forget(p, below)
  return unlink_down(p, floor(below / BLOCK), false)
end

return {get = get, set = set, drop = drop, forget = forget}
