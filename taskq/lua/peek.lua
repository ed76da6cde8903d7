#!lua flags=no-writes
-- peek: one page of the tasks of the current pass in one state, read-only.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: state (todo | leased | done | dead), cursor ('0' to start), count (1..PAGE_MAX)
-- returns: {code, {{task, lease_record_or_false, failures, attempts}...}, next_cursor}
-- The listing is complete when next_cursor is '0'. Like SCAN's, a page may hold fewer
-- than count rows (todo looks at no more than 4 x count positions of the order per page) and
-- a task that changes state between pages may be listed twice or not at all; a page is
-- bounded whatever the caller asks. Cursors: todo 'f<rank in the front>' then
-- 'c<position in the order>'; leased a rank, done a task id, dead an SSCAN cursor.
local state = arg_enum(ARGV[1], 'state', 'todo leased done dead')
local cursor = arg_text(ARGV[2], 'cursor', 24)
local count = arg_int(ARGV[3], 'count', 1, PAGE_MAX)
arg_len(ARGV, 3)
local phase, pos = '', 0
if state == 'todo' and cursor ~= '0' then
  phase = string.sub(cursor, 1, 1)
  if phase ~= 'f' and phase ~= 'c' then arg_fail('cursor', 'not a todo cursor', cursor) end
  pos = arg_int(string.sub(cursor, 2), 'cursor', 0, 4294967295)
elseif state == 'dead' then
  arg_token(cursor, 'cursor')
else
  pos = arg_int(cursor, 'cursor', 0, 4294967295)
end
local bad = args_bad()
if bad then return bad end
if redis.call('EXISTS', K_META) == 0 then return {C.JOB_NOT_FOUND} end
ROUND = mnum(F.ROUND)
local ids, next_cursor = {}, '0'
if state == 'todo' then
  local n = mnum(F.N)
  if phase ~= 'c' then
    for _, t in ipairs(redis.call('ZRANGE', K_FRONT, pos, pos + count - 1)) do
      ids[#ids + 1] = t
    end
    if #ids == count then next_cursor = 'f' .. fmt(pos + count) end
    phase, pos = 'c', 0
  end
  if next_cursor == '0' then
    pos = math.max(pos, mnum(F.CURSOR))
    local perm, steps = perm_fn(n), 0
    local front_empty = redis.call('ZCARD', K_FRONT) == 0
    while #ids < count and pos < n and steps < 4 * count do
      local t = tostring(perm(pos))
      pos, steps = pos + 1, steps + 1
      if is_free(t) and (front_empty or redis.call('ZSCORE', K_FRONT, t) == false) then
        ids[#ids + 1] = t
      end
    end
    if pos < n then next_cursor = 'c' .. fmt(pos) end
  end
elseif state == 'leased' then
  for _, item in ipairs(redis.call('ZRANGE', K_OWNED, pos, pos + count - 1)) do
    ids[#ids + 1] = string.match(item, '|([^|]*)$')
  end
  if #ids == count then next_cursor = fmt(pos + count) end
elseif state == 'done' then
  local n = mnum(F.N)
  while #ids < count and pos < n do
    local b = redis.call('BITPOS', K_DONE, 1, pos, -1, 'BIT')
    if b < 0 then pos = n; break end
    ids[#ids + 1] = tostring(b)
    pos = b + 1
  end
  if pos < n and #ids == count then next_cursor = fmt(pos) end
elseif state == 'dead' then
  local r = redis.call('SSCAN', K_DEAD, cursor, 'COUNT', count)
  next_cursor, ids = r[1], r[2]
end
-- the lease record only where it is current (leased); no counts to read when none exist
local out = {}
local with_counts = not counts_empty()
for _, t in ipairs(ids) do
  local f, a = 0, 0
  if with_counts then
    f = tonumber(redis.call('HGET', K_COUNTS, 'f:' .. t) or '0')
    a = tonumber(redis.call('HGET', K_COUNTS, 'a:' .. t) or '0')
  end
  out[#out + 1] = {tonumber(t), state == 'leased' and redis.call('HGET', K_LEASES, t) or false,
    f, a}
end
return {C.OK, out, next_cursor}
