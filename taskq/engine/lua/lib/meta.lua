-- meta.lua: the job's meta hash, cached for the call; number formatting; record splitting.
-- The first part of taskq's Function library (library.py builds each part in its closure,
-- in the order of LIB_PARTS: its docstring says how). A part's locals outlive a call: its
-- state is marked `-- per call` and set back by reset(), which begin() calls. F.<NAME> is
-- the slot of meta field keys.MetaField.<NAME> in this part's cache (written as a number
-- when the library is built), N.<NAME> its name. Semantics: docs/design.md.
local rcall, tonum, sfind, ssub, sformat, sbyte, unpk, ltype, lpairs =
  redis.call, tonumber, string.find, string.sub, string.format, string.byte, unpack, type, pairs
local mmax, mmin = math.max, math.min
-- A mixed job's N when a stream source was open at create: the copy ids' stride, slot
-- p * N + k (lib/mix.lua STRIDE; docs/mixing.md).
local MIX_STRIDE = 4294967296  -- constant

-- An integer (every number but the streaming median dur_med) is formatted with '%d': the
-- same digits as '%.0f', which glibc runs through its multi-precision float printer at
-- several times the cost (about 5 % of a hot call's instructions, bench/HISTORY.md).
local function fmt(n)
  if n % 1 == 0 and n <= 9007199254740992 and n >= -9007199254740992 then
    return sformat('%d', n)
  end
  return sformat('%.0f', n)
end

-- The meta hash: the fields the hot verbs (ack, lease, heartbeat) read are fetched in one
-- HMGET at open_job, any other on first use (HGET); every change is written in one HSET
-- at the end of the call (flush, through done()): a script is atomic, so nobody sees the
-- difference. Not HGETALL: the hash has ~60 fields and the reply's conversion into Lua
-- (a string and a table slot per field and name) cost more than naming the ~32 needed
-- (bench/HISTORY.md).
-- A field is known by its slot, F.<NAME> (an integer, library.py META_SLOTS; META_NAMES
-- [slot] is its name): the hot ones are slots 1..31 in the HMGET's order, so the reply is
-- the cache M itself, and the tables below are arrays over those slots (META_FALSES, written
-- by library.py as a constructor of falses each; as hash tables keyed by name the four cost
-- ~23 k instructions a call, ~370 a slot, and load_meta's copy of the reply into M ~14 k:
-- a cache by name measured 646 -> 690 k instructions a task at prefetch 1, 578 -> 621 k at
-- prefetch 0, bench/server_instructions.py).
-- M holds the stored strings (false: no such field) and those set by mset; MN a number
-- set in this call (mput, mincr: formatted once, in flush); NUM caches numbers parsed
-- from M's strings, ORIG the numbers of the stored ones (see flush). A false in MN /
-- DIRTY / NUM / ORIG means what nil means (a field past the made slots is nil until set).
local M = {}  -- per call
local MN, DIRTY, NUM, ORIG = META_FALSES, META_FALSES, META_FALSES, META_FALSES  -- per call
local function load_meta()
  M = rcall('HMGET', K_META, unpk(META_NAMES, 1, META_HOT_SLOTS))
end
local function mget(f)
  local n = MN[f]
  if n then return fmt(n) end
  local v = M[f]
  if v == nil then
    v = rcall('HGET', K_META, META_NAMES[f])
    M[f] = v
  end
  if v == false then return nil end
  return v
end
local function mnum(f)
  local n = MN[f] or NUM[f]
  if n then return n end
  local stored = mget(f)
  if not stored then
    NUM[f] = 0
    return 0
  end
  -- (the library writes these fields as digits: a string starting with one converts by
  -- arithmetic, one strtod, where tonumber makes two; anything else as before)
  local b = sbyte(stored, 1)
  local parsed
  if b and b <= 57 and (b >= 48 or b == 45) then parsed = stored + 0 else parsed = tonum(stored) end
  n = parsed or 0
  NUM[f] = n
  if parsed and not DIRTY[f] then ORIG[f] = n end  -- the stored number (flush)
  return n
end
-- Sets a field to a number (formatted with %.0f when written).
local function mput(f, v)
  MN[f] = v
  DIRTY[f] = true
end
-- Sets a field to number n whose string s the caller made already (not formatted again).
local function mput_s(f, n, s)
  M[f] = s
  if MN[f] then MN[f] = nil end
  NUM[f] = n
  DIRTY[f] = true
end
-- One field set to a string (mset without its argument table).
local function mset_s(f, s)
  M[f] = s
  if MN[f] then MN[f] = nil end
  if NUM[f] then NUM[f] = nil end
  DIRTY[f] = true
end
local function mset(...)
  local a = {...}
  for i = 1, #a, 2 do
    local f, v = a[i], a[i + 1]
    if ltype(v) == 'number' then v = fmt(v) end
    M[f] = v
    if MN[f] then MN[f] = nil end
    if NUM[f] then NUM[f] = nil end
    DIRTY[f] = true
  end
end

local function mincr(f, n)
  local v = MN[f]  -- (a field changed in this call already: no call of mnum)
  if not v then v = mnum(f) end
  v = v + (n or 1)
  MN[f] = v
  DIRTY[f] = true
  return v
end
local function flush()
  -- (the argument list sized at once: grown one pair at a time it was reallocated 5 times)
  local args = {false, false, false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false, false, false, false, false, false, false, false,
    false, false, false, false, false, false, false, false}
  local k = 0
  for f, d in lpairs(DIRTY) do
    if d then
      local n = MN[f]
      if not n then
        args[k + 1] = META_NAMES[f]
        args[k + 2] = M[f]
        k = k + 2
      elseif ORIG[f] ~= n then
        -- (a counter that came back to its stored number, a lease granted and one ended in
        -- the same call: nleased, nreserved, is not written again)
        args[k + 1] = META_NAMES[f]
        args[k + 2] = fmt(n)
        k = k + 2
      end
    end
  end
  if k > 0 then rcall('HSET', K_META, unpk(args, 1, k)) end
  DIRTY = {}
end

-- True when this call changed no field (append's end: lib/call.lua done_reads_meta).
local function meta_clean()
  for _, d in lpairs(DIRTY) do
    if d then return false end
  end
  return true
end

-- The job's tasks: meta's n (the create's) plus the tasks appended (KEY appended's
-- "tasks", keys.APPENDED_FIELDS: append writes no meta field, so that the producer's
-- credential may not write meta at all, docs/security.md). Read once per call that asks;
-- never below the create's (a producer may write the record, not hide the job's own tasks).
local APPENDED_TASKS = false  -- per call
-- The tasks there are: the create's and the appended. A mixed job's tasks are the slots of
-- its pass: n, or (on_exhausted=stop, the charge past the stop) the pass's length 'mixe'
-- says (lib/mix.lua).
local function tasks_n(walk)
  if mget(F.SHUFFLE) == 'm' then
    local n, e = mnum(F.N), tonum(mget(F.MIXE) or '')
    local base = mnum(F.PASS) * n
    if e and e > base and e <= base + n then return e - base end
    -- a stream source open at create (n the fixed stride): a pass may end at once (e ==
    -- base); not ended, the positions charged so far, but for the cursor's walk (`walk`),
    -- whose charge says where the pass stands (lib/mixslot.lua mix_charge)
    if n == MIX_STRIDE and e == base then return 0 end
    if n == MIX_STRIDE and not walk then return mmax(0, mmin(n, mnum(F.MIXH) - base)) end
    return n
  end
  if not APPENDED_TASKS then
    APPENDED_TASKS = tonum(rcall('HGET', K_APPENDED, 'tasks') or '0') or 0
    if APPENDED_TASKS < 0 then APPENDED_TASKS = 0 end
  end
  return mnum(F.N) + APPENDED_TASKS
end

-- Keeps the meta hash in Redis's hashtable encoding (F.ENC, keys.py): written at create,
-- and by the first register of a job created before it (a hash never goes back to a
-- listpack until a restart reloads it, and the field is kept across that).
-- True while a mixed job with a stream source has not ended its pass: its length is not
-- known, the pass stays open (lib/passes.lua check_pass_end).
local function mix_open()
  if mget(F.SHUFFLE) ~= 'm' or mnum(F.N) ~= MIX_STRIDE then return false end
  local e, base = tonum(mget(F.MIXE) or ''), mnum(F.PASS) * MIX_STRIDE
  return not (e and e >= base and e < base + MIX_STRIDE)
end

local function pad_meta()
  if not mget(F.ENC) then mset(F.ENC, string.rep('h', 80)) end
end

local function split(s)
  local fields, start = {}, 1
  while true do
    local i = sfind(s, '|', start, true)
    if not i then
      fields[#fields + 1] = ssub(s, start)
      return fields
    end
    fields[#fields + 1] = ssub(s, start, i - 1)
    start = i + 1
  end
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  M = {}
  APPENDED_TASKS = false
  MN, DIRTY, NUM, ORIG = META_FALSES, META_FALSES, META_FALSES, META_FALSES
end

return {fmt = fmt, load_meta = load_meta, mget = mget, mnum = mnum, mput = mput, mput_s = mput_s,
  mset_s = mset_s, mset = mset, mincr = mincr, flush = flush, meta_clean = meta_clean, tasks_n = tasks_n, mix_open = mix_open, pad_meta = pad_meta,
  split = split, reset = reset}
