#!lua flags=no-writes
-- peek: one page of the tasks of the current pass in one state, read-only.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: state (todo | leased | done | dead), cursor ('0' to start), count (1..PAGE_MAX)
-- returns: {code, {{task, lease_record_or_false, failures, attempts}...}, next_cursor}
-- The listing is complete when next_cursor is '0'. Like SCAN's, a page may hold fewer
-- than count rows (todo looks at 4 x count positions of the order per page at most) and
-- a task that changes state between pages may be listed twice or not at all; a page is
-- bounded whatever the caller asks. Cursors: todo 'o<index>' (split tasks' tail pieces
-- waiting to be leased again), 'f<rank in the front>' then 'c<position in the order>'; leased a rank, done a task id, dead an SSCAN cursor.
local rcall, tonum, smatch, ssub, sbyte, mmin, mmax, unpk, lipairs =
  redis.call, tonumber, string.match, string.sub, string.byte, math.min, math.max, unpack, ipairs
local fmt, mnum = lib.meta.fmt, lib.meta.mnum
local tasks_n = lib.meta.tasks_n
local arg_enum, arg_fail, arg_int, arg_len, arg_text, arg_token, args_bad =
  lib.args.arg_enum, lib.args.arg_fail, lib.args.arg_int, lib.args.arg_len, lib.args.arg_text,
  lib.args.arg_token, lib.args.args_bad
local done = lib.call.done
local counts_empty, dead_empty, lease_is_current, parse_lease =
  lib.leases.counts_empty, lib.leases.dead_empty, lib.leases.lease_is_current,
  lib.leases.parse_lease
local perm_fn = lib.passes.perm_fn
local waiting_tails = lib.pieces.waiting_tails
local state = arg_enum(ARGV[1], 'state', 'todo leased done dead')
local cursor = arg_text(ARGV[2], 'cursor', 24)
local count = arg_int(ARGV[3], 'count', 1, PAGE_MAX)
arg_len(ARGV, 3)
local phase, pos = '', 0
if state == 'todo' and cursor ~= '0' then
  phase = ssub(cursor, 1, 1)
  if phase ~= 'o' and phase ~= 'f' and phase ~= 'c' then
    arg_fail('cursor', 'not a todo cursor', cursor)
  end
  pos = arg_int(ssub(cursor, 2), 'cursor', 0, 4294967295)
elseif state == 'dead' then
  arg_token(cursor, 'cursor')
else
  pos = arg_int(cursor, 'cursor', 0, 4294967295)
end
local bad = args_bad()
if bad then return bad end
if rcall('EXISTS', K_META) == 0 then return {C.JOB_NOT_FOUND} end
CALL.ROUND = mnum(F.ROUND)
local ids, next_cursor = {}, '0'
if state == 'todo' then
  local n = tasks_n()
  if phase == '' or phase == 'o' then
    -- split tasks' tail pieces waiting to be leased again (lib/split.lua); a task whose
    -- head piece is leased is listed among the leased too
    local tails = waiting_tails()
    for k = pos + 1, mmin(#tails, pos + count) do ids[#ids + 1] = tails[k] end
    if #tails > pos + count then
      next_cursor = 'o' .. fmt(pos + count)
    elseif #ids == count then
      next_cursor = 'f0'
    end
    phase, pos = 'f', 0
  end
  if phase ~= 'c' and next_cursor == '0' then
    local room = count - #ids
    if room > 0 then
      for _, t in lipairs(rcall('ZRANGE', K_FRONT, pos, pos + room - 1)) do
        ids[#ids + 1] = t
      end
    end
    if #ids == count then next_cursor = 'f' .. fmt(pos + room) end
    phase, pos = 'c', 0
  end
  if next_cursor == '0' then
    pos = mmax(pos, mnum(F.CURSOR))
    -- positions of the order looked up in chunks (a few commands per chunk, not a few per
    -- task), 4 x count at most per page: free = not done, not dead, no current lease, and
    -- not in the front (listed above)
    local perm, budget = perm_fn(), 4 * count
    local any_front = rcall('ZCARD', K_FRONT) > 0
    while #ids < count and pos < n and budget > 0 do
      local span = mmin(count - #ids, n - pos, budget)
      budget = budget - span
      local cand, bits = {}, {}
      for k = 1, span do
        cand[k] = tostring(perm(pos + k - 1))
        bits[3 * k - 2], bits[3 * k - 1], bits[3 * k] = 'GET', 'u1', cand[k]
      end
      pos = pos + span
      local done = rcall('BITFIELD_RO', K_DONE, unpk(bits))
      local recs = rcall('HMGET', K_LEASES, unpk(cand))
      local dead, front = false, false
      if not dead_empty() then dead = rcall('SMISMEMBER', K_DEAD, unpk(cand)) end
      if any_front then front = rcall('ZMSCORE', K_FRONT, unpk(cand)) end
      for k = 1, span do
        local rec = recs[k]
        if done[k] == 0 and not (dead and dead[k] == 1) and not (front and front[k])
            and not (rec and sbyte(rec, 1) == 76 and lease_is_current(parse_lease(rec))) then
          ids[#ids + 1] = cand[k]
        end
      end
    end
    if pos < n then next_cursor = 'c' .. fmt(pos) end
  end
elseif state == 'leased' then
  for _, item in lipairs(rcall('ZRANGE', K_OWNED, pos, pos + count - 1)) do
    ids[#ids + 1] = smatch(item, '|([^|]*)$')
  end
  if #ids == count then next_cursor = fmt(pos + count) end
elseif state == 'done' then
  local n = tasks_n()
  while #ids < count and pos < n do
    local b = rcall('BITPOS', K_DONE, 1, pos, -1, 'BIT')
    if b < 0 then pos = n; break end
    ids[#ids + 1] = tostring(b)
    pos = b + 1
  end
  if pos < n and #ids == count then next_cursor = fmt(pos) end
elseif state == 'dead' then
  local r = rcall('SSCAN', K_DEAD, cursor, 'COUNT', count)
  next_cursor, ids = r[1], r[2]
end
-- the rows: lease records only for leased tasks, counts only when any exist (one HMGET
-- each for the page)
local out = {}
if #ids == 0 then return {C.OK, out, next_cursor} end
local recs, counts = {}, {}
if state == 'leased' then recs = rcall('HMGET', K_LEASES, unpk(ids)) end
if not counts_empty() then
  local fields = {}
  for k, t in lipairs(ids) do fields[2 * k - 1], fields[2 * k] = 'f:' .. t, 'a:' .. t end
  counts = rcall('HMGET', K_COUNTS, unpk(fields))
end
for k, t in lipairs(ids) do
  out[k] = {tonum(t), recs[k] or false, tonum(counts[2 * k - 1] or '0') or 0,
    tonum(counts[2 * k] or '0') or 0}
end
return {C.OK, out, next_cursor}
