-- meta.lua: the job's meta hash, cached for the call; number formatting; record splitting.
-- The first part of taskq's Function library (scripts.py joins lib/*.lua in the order of
-- its LIB_PARTS after the generated K_* keys, C codes and hist_bucket / HIST_BOUNDS, then
-- adds the generated begin() and each lua/verb.lua as a function). Everything in the
-- library is built once, at FUNCTION LOAD, so its locals outlive a call: every top-level
-- local that is not a function ends in `-- per call`, and begin() (generated from those
-- lines) resets it at the start of every call. F.<NAME> is keys.MetaField.<NAME>, replaced by
-- the field's name when the library is built. Semantics: docs/design.md.

local function fmt(n) return string.format('%.0f', n) end

-- The meta hash is read once (HGETALL: a few dozen short fields, cheaper than naming
-- them) and written once at the end of the call (flush, through done()): a script is
-- atomic, so nobody sees the difference. A counter changed in this call is kept as a
-- number in M (formatted once, in flush); NUM caches the numbers parsed from M's strings.
local M, DIRTY, NUM = {}, {}, {}  -- per call
local function load_meta()
  local kv = redis.call('HGETALL', K_META)
  for i = 1, #kv, 2 do M[kv[i]] = kv[i + 1] end
end
local function mget(f)
  local v = M[f]
  if v == nil then
    v = redis.call('HGET', K_META, f)
    M[f] = v
  end
  if v == false then return nil end
  if type(v) == 'number' then return fmt(v) end
  return v
end
local function mnum(f)
  local v = M[f]
  if type(v) == 'number' then return v end
  local n = NUM[f]
  if n then return n end
  n = tonumber(mget(f) or '0') or 0
  NUM[f] = n
  return n
end
-- Sets a field to a number (formatted with %.0f when written).
local function mput(f, v)
  M[f] = v
  DIRTY[f] = true
end
local function mset(...)
  local a = {...}
  for i = 1, #a, 2 do
    local v = a[i + 1]
    if type(v) == 'number' then v = fmt(v) end
    M[a[i]] = v
    NUM[a[i]] = nil
    DIRTY[a[i]] = true
  end
end
local function mincr(f, n)
  local v = mnum(f) + (n or 1)
  M[f] = v
  DIRTY[f] = true
  return v
end
local function flush()
  local args = {}
  for f, _ in pairs(DIRTY) do
    local v = M[f]
    if type(v) == 'number' then v = fmt(v) end
    args[#args + 1] = f
    args[#args + 1] = v
  end
  if #args > 0 then redis.call('HSET', K_META, unpack(args)) end
  DIRTY = {}
end

local function split(s)
  local fields, start = {}, 1
  while true do
    local i = string.find(s, '|', start, true)
    if not i then
      fields[#fields + 1] = string.sub(s, start)
      return fields
    end
    fields[#fields + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end
