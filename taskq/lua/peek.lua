#!lua flags=no-writes
-- peek: list up to `limit` tasks of the current pass in one state, read-only.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: state (todo | leased | done | dead), limit
-- returns: {code, {{task, lease_record_or_false, failures, attempts}...}}
if redis.call('EXISTS', K_META) == 0 then return {C.JOB_NOT_FOUND} end
ROUND = mnum(F.ROUND)
local state, limit = ARGV[1], tonumber(ARGV[2])
local ids = {}
if state == 'todo' then
  for _, t in ipairs(redis.call('ZRANGE', K_FRONT, 0, limit - 1)) do ids[#ids + 1] = t end
  local n, cursor, steps = mnum(F.N), mnum(F.CURSOR), 0
  local perm = perm_fn(n)
  while #ids < limit and cursor < n and steps < 10000 do
    local t = tostring(perm(cursor))
    cursor, steps = cursor + 1, steps + 1
    if is_free(t) and redis.call('ZSCORE', K_FRONT, t) == false then ids[#ids + 1] = t end
  end
elseif state == 'leased' then
  for _, item in ipairs(redis.call('ZRANGE', K_OWNED, 0, limit - 1)) do
    ids[#ids + 1] = string.match(item, '|([^|]*)$')
  end
elseif state == 'done' then
  local pos, n = 0, mnum(F.N)
  while #ids < limit and pos < n do
    local b = redis.call('BITPOS', K_DONE, 1, pos, -1, 'BIT')
    if b < 0 then break end
    ids[#ids + 1] = tostring(b)
    pos = b + 1
  end
elseif state == 'dead' then
  ids = redis.call('SRANDMEMBER', K_DEAD, limit)
else
  return {C.INVALID}
end
local out = {}
for _, t in ipairs(ids) do
  out[#out + 1] = {tonumber(t), redis.call('HGET', K_LEASES, t) or false,
    tonumber(redis.call('HGET', K_COUNTS, 'f:' .. t) or '0'),
    tonumber(redis.call('HGET', K_COUNTS, 'a:' .. t) or '0')}
end
return {C.OK, out}
