-- events.lua: the events stream (buffered per call), the histograms, and the wake-ups
-- of waiting workers (the wake list, the broadcast lists).
local rcall, mmin, tconcat, unpk, ltype, lpairs =
  redis.call, math.min, table.concat, unpack, type, pairs
local fmt, mget, mincr, mnum, mput =
  lib.meta.fmt, lib.meta.mget, lib.meta.mincr, lib.meta.mnum, lib.meta.mput


-- The call's grants, starts and acks are gathered into one `step` entry (docs/design.md,
-- "Events"): per kind (acked, started, leased, reserved, in the order each first came)
-- the field <kind> lists the tasks and <kind>_tokens their tokens, with <kind>_count when
-- more than EVENT_LIST_MAX were listed; it is written before any other event of the call,
-- so the stream keeps the order things happened in. The stream is capped in entries, so a
-- bounded entry bounds its bytes (docs/capacity.md).
-- (Per kind, EVT holds its task (a string) or, from its second, the list of them and EVK
-- the tokens the same way; EVORDER the kinds in the order each first came, EVT.n of them.
-- The tables are sized by their constructors for the kinds there are, and a kind of one
-- task makes no list: built one field at a time, an ack's buffer was ~10 tables and as
-- many rehashes per call, bench/HISTORY.md.)
local EVT = {n = 0, worker = false, pass = false, acked = false, started = false, leased = false, reserved = false, piece_acked = false}  -- per call
local EVK = {acked = false, started = false, leased = false, reserved = false, piece_acked = false}  -- per call
local EVORDER = {false, false, false, false, false}  -- per call
local function flush_events()
  local t = EVT
  local nk = t.n
  if nk == 0 then return end
  local a = {'XADD', K_EVENTS, 'MAXLEN', '~', CALL.EVMAX, '*', 'type', 'step', 'pass', t.pass,
    'worker', t.worker, false, false, false, false, false, false, false, false, false, false,
    false, false}
  local k = 12
  for j = 1, nk do
    local kind = EVORDER[j]
    local tasks, tokens = t[kind], EVK[kind]
    local n = 1
    if ltype(tasks) == 'table' then
      n = #tasks
      local listed = mmin(n, EVENT_LIST_MAX)
      tasks, tokens = tconcat(tasks, ',', 1, listed), tconcat(tokens, ',', 1, listed)
    end
    a[k + 1], a[k + 2], a[k + 3], a[k + 4] = kind, tasks, kind .. '_tokens', tokens
    k = k + 4
    if n > EVENT_LIST_MAX then
      a[k + 1], a[k + 2] = kind .. '_count', fmt(n)
      k = k + 2
    end
    t[kind], EVK[kind] = false, false
  end
  t.n = 0
  rcall(unpk(a, 1, k))
end
-- (An entry is one worker's in one pass: a call about another worker flushes it here,
-- and the two places that change the pass, start_pass and rewind, flush it first; the
-- pass is not read again for every task, ~0.8 k instructions each.)
local function event_task(kind, task, worker, token)
  local t = EVT
  if t.n > 0 and t.worker ~= worker then flush_events() end
  if t.n == 0 then t.worker, t.pass = worker, mget(F.PASS) end
  local v = t[kind]
  if not v then
    local n = t.n + 1
    t[kind], EVK[kind], EVORDER[n], t.n = task, token, kind, n
  elseif ltype(v) == 'string' then
    t[kind], EVK[kind] = {v, task}, {EVK[kind], token}
  else
    local tk = EVK[kind]
    v[#v + 1], tk[#tk + 1] = task, token
  end
end
-- A batch's tasks of one kind at once (tasks, tokens: lists, which the entry keeps): one
-- call for the batch, not one per task (~4.9 k instructions each, bench/HISTORY.md).
local function event_tasks(kind, tasks, tokens, worker)
  local n, t = #tasks, EVT
  if n < 2 or t[kind] then  -- (one task, or a kind begun already: one by one)
    for k = 1, n do event_task(kind, tasks[k], worker, tokens[k]) end
    return
  end
  if t.n > 0 and t.worker ~= worker then flush_events() end
  if t.n == 0 then t.worker, t.pass = worker, mget(F.PASS) end
  local k = t.n + 1
  t[kind], EVK[kind], EVORDER[k], t.n = tasks, tokens, kind, k
end
local function event(kind, ...)
  if EVT.n > 0 then flush_events() end
  rcall('XADD', K_EVENTS, 'MAXLEN', '~', CALL.EVMAX, '*', 'type', kind, 'pass', mget(F.PASS), ...)
end

local HBUF = {}  -- per call
-- A histogram ('dur' or 'late') keeps its buckets in the hist hash; its sum is a meta field
-- (written with the meta the call writes anyway) and its count the buckets' sum: one
-- HINCRBY per observation rather than three (bench/HISTORY.md, "Hot-path pass 3").
-- (nosum: the caller adds ms, returned, to the sum: an ack's, endings.lua acks_counted)
-- The hist hash's field of each bucket ('dur:1', ...), made once: a number concatenated
-- into a string goes through the C library's float printer (~1.4 k instructions an ack).
local HIST_FIELDS = {dur = {}, late = {}}  -- constant
for name, fields in lpairs(HIST_FIELDS) do
  for b = 1, #HIST_BOUNDS + 1 do fields[b] = name .. ':' .. b end
end
local function observe(name, ms, nosum)
  if ms < 0 then ms = 0 end
  local b = 1
  while HIST_BOUNDS[b] and ms > HIST_BOUNDS[b] do b = b + 1 end
  local bucket = HIST_FIELDS[name][b]
  HBUF[bucket] = (HBUF[bucket] or 0) + 1
  if nosum then return ms end
  if name == 'dur' then mincr(F.DUR_SUM, ms) else mincr(F.LATE_SUM, ms) end
  return ms
end

-- The waiting set's size is kept in the meta field nwaiting (ZADD and ZREM answer what they
-- changed), so a worker that got tasks leaves the set only when the set is not empty: most
-- calls skip that ZREM. Every change of the set goes through wait_add / wait_rem (a job
-- created before the field counts the set once).
local function nwaiting()
  if not mget(F.NWAITING) then mput(F.NWAITING, rcall('ZCARD', K_WAITING)) end
  return mnum(F.NWAITING)
end
local function wait_add(m, score)
  local n = nwaiting()
  local added = rcall('ZADD', K_WAITING, score, m)
  if added ~= 0 then mput(F.NWAITING, n + added) end
end
local function wait_rem(m)
  local n = nwaiting()
  if n > 0 then
    local removed = rcall('ZREM', K_WAITING, m)
    if removed ~= 0 then mput(F.NWAITING, n - removed) end
  end
end

-- Counted wake-ups: one token per task that became leasable, never more than waiters.
local function wake_one()
  local waiters = rcall('ZCARD', K_WAITING)
  if waiters > 0 then
    rcall('LPUSH', K_WAKE, '1')
    rcall('LTRIM', K_WAKE, 0, waiters - 1)
  end
end

-- Pass and job state changes wake every waiter: one token per waiter in the list of
-- the next generation's parity; a waiter blocks on the parity after the generation
-- its last lease reply named, so a change between that reply and its wait is not missed.
local function broadcast()
  local gen = mincr(F.GEN)
  local key = K_BCAST0
  if gen % 2 == 1 then key = K_BCAST1 end
  rcall('DEL', key)
  local waiters = mmin(rcall('ZCARD', K_WAITING), 1000)
  if waiters > 0 then
    local tokens = {}
    for i = 1, waiters do tokens[i] = '1' end
    rcall('RPUSH', key, unpk(tokens))
    rcall('PEXPIRE', key, 600000)
  end
  rcall('DEL', K_WAKE)
end

-- Writes the buckets this call observed (done()).
local function flush_hist()
  for field, n in lpairs(HBUF) do rcall('HINCRBY', K_HIST, field, fmt(n)) end
  HBUF = {}
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  EVT = {n = 0, worker = false, pass = false, acked = false, started = false, leased = false, reserved = false, piece_acked = false}
  EVK = {acked = false, started = false, leased = false, reserved = false, piece_acked = false}
  EVORDER = {false, false, false, false, false}
  HBUF = {}
end

return {flush_events = flush_events, event_task = event_task, event_tasks = event_tasks,
  event = event, flush_hist = flush_hist, observe = observe, wait_add = wait_add,
  wait_rem = wait_rem, wake_one = wake_one, broadcast = broadcast, reset = reset}
