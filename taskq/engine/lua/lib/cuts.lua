-- cuts.lua: a checkpoint's records and pages (checkpoint.lua takes the cut; rewind.lua
-- restores it and derives the rest: its writes stay in that admin verb, so the trainers'
-- ACL rule needs none of its commands).
-- A checkpoint's pages, fields of the ckpt hash: '<id>:d:<k>' done bitmap, '<id>:x:<k>'
-- dead bitmap (CK_PAGE_BYTES each), '<id>:p:<k>' progress ('task:samples,...').
-- A stream's two more fields (no id holds ':'), so that a trim step reads what the kept
-- checkpoints' cuts hold it to in one field, not every checkpoint's record:
--   ':bound' what they hold together: {lo = the lowest of their cuts' lowest tasks
--     neither done nor dead, p0 / p1 = the lowest / highest pass of their cuts, dead =
--     the tasks dead at their cuts below it, old = a cut that did not record its lowest
--     task, or more than ASIDE_MAX of those dead tasks in all: the watermark waits}.
--     A seal adds its cut at once; a drop cannot take one out of a minimum, so it leaves
--     the bound speaking for more cuts than are kept (a trim it holds back passes nothing
--     a kept one needs) and starts a sweep.
--   ':sweep' {at = the sequence last read, acc = the bound of the cuts read, again = a
--     checkpoint dropped since it began}: trim.lua reads SWEEP_STEP checkpoints a call in
--     sequence order (a new one has the highest: a sweep reaches it), and the last step
--     makes acc the bound (and begins again when `again`).
local rcall, smatch, unpk, ltype, lipairs, mmin, mmax, tonum, cencode, cdecode =
  redis.call, string.match, unpack, type, ipairs, math.min, math.max, tonumber, cjson.encode,
  cjson.decode
local arg_fail = lib.args.arg_fail
local fmt, trims = lib.meta.fmt, lib.mixtrim.trims
local SWEEP_STEP = 25  -- constant: checkpoint records a trim step reads (~20 us each)

-- (CK_PAGE_BYTES: the bytes of a bitmap one checkpoint page holds, 8 x as many tasks;
-- CK_PAGE_PAIRS: the most (task, samples) pairs in one page of its progress; both
-- constants of contract.py, written into the library as numbers by library.py)

local function ck_record(id)
  local raw = rcall('HGET', K_CKPT, id)
  if not raw then return nil end
  return cjson.decode(raw)
end

-- `acc` (a bound, above) with the cut of record `rec` in it.
local function bound_add(acc, rec)
  local pass = rec.pass
  acc.p0, acc.p1 = mmin(acc.p0 or pass, pass), mmax(acc.p1 or pass, pass)
  if not rec.low then acc.old = true end
  if acc.old then
    acc.dead = {}
    return acc
  end
  local floor = rec.low_live or rec.low
  acc.lo = mmin(acc.lo or floor, floor)
  local dead, seen = acc.dead or {}, {}
  for _, t in lipairs(dead) do seen[t] = true end
  for _, t in lipairs(rec.dead_below or {}) do
    if not seen[t] then
      seen[t] = true
      dead[#dead + 1] = t
    end
  end
  if #dead > ASIDE_MAX then acc.old, dead = true, {} end
  acc.dead = dead
  return acc
end

-- The kept checkpoints' bound (above): nil when there is none yet (no checkpoint kept,
-- or kept ones from before the bound, which a sweep reads); {} when it holds nothing.
local function ck_bound()
  local raw = rcall('HGET', K_CKPT, ':bound')
  return raw and cdecode(raw) or nil
end

-- A stream's seal of the cut `rec`: it joins the bound (`first`: the first checkpoint
-- kept, which makes it).
local function ck_bound_add(rec, first)
  local bound = ck_bound()
  if bound or first then rcall('HSET', K_CKPT, ':bound', cencode(bound_add(bound or {}, rec))) end
end

-- One step of the sweep (above), begun when the bound is missing while checkpoints are
-- kept; returns whether a sweep goes on after it.
local function ck_sweep_step()
  local raw = rcall('HGET', K_CKPT, ':sweep')
  local sweep = raw and cdecode(raw)
  if not sweep then
    if rcall('HEXISTS', K_CKPT, ':bound') == 1 or rcall('ZCARD', K_CKPTS) == 0 then
      return false
    end
    sweep = {at = 0, acc = {}}
  end
  local page = rcall('ZRANGEBYSCORE', K_CKPTS, '(' .. fmt(sweep.at), '+inf', 'WITHSCORES',
    'LIMIT', 0, SWEEP_STEP)
  for i = 1, #page, 2 do
    local rec = ck_record(page[i])
    if rec then bound_add(sweep.acc, rec) end
    sweep.at = tonum(page[i + 1])
  end
  if #page == 2 * SWEEP_STEP then
    rcall('HSET', K_CKPT, ':sweep', cencode(sweep))
    return true
  end
  rcall('HSET', K_CKPT, ':bound', cencode(sweep.acc))
  if sweep.again then
    rcall('HSET', K_CKPT, ':sweep', cencode({at = 0, acc = {}}))
    return true
  end
  rcall('HDEL', K_CKPT, ':sweep')
  return false
end

-- Removes every field of checkpoint `id` (its record names its pages); a kept one of a
-- stream leaves the bound to a sweep (above).
local function ck_drop(id)
  local rec = ck_record(id)
  local fields = {id}
  if rec then
    for k = 0, (rec.pages or 0) - 1 do fields[#fields + 1] = id .. ':d:' .. k end
    for k = 0, (rec.xpages or 0) - 1 do fields[#fields + 1] = id .. ':x:' .. k end
    for k = 0, (rec.ppages or 0) - 1 do fields[#fields + 1] = id .. ':p:' .. k end
    if (rec.policy or 0) > 0 then fields[#fields + 1] = id .. ':policy' end
  end
  rcall('HDEL', K_CKPT, unpk(fields))
  if rcall('ZREM', K_CKPTS, id) == 1 and trims() then
    local raw = rcall('HGET', K_CKPT, ':sweep')
    local sweep = raw and cdecode(raw) or {at = 0, acc = {}}
    if raw then sweep.again = true end
    rcall('HSET', K_CKPT, ':sweep', cencode(sweep))
  end
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

return {ck_record = ck_record, ck_drop = ck_drop, arg_ckpt = arg_ckpt, ck_bound = ck_bound,
  ck_bound_add = ck_bound_add, ck_sweep_step = ck_sweep_step}
