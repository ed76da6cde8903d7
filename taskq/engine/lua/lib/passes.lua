-- passes.lua: the order of a pass (perm_fn), pass ends and starts, the per-pass summaries
-- (bounded in all), the waiting states, and completion by membership.
local rcall, tonum, mfloor, lipairs = redis.call, tonumber, math.floor, ipairs
local fmt, mget, mincr, mnum, mput, mset =
  lib.meta.fmt, lib.meta.mget, lib.meta.mincr, lib.meta.mnum, lib.meta.mput, lib.meta.mset
local tasks_n, mix_open = lib.meta.tasks_n, lib.meta.mix_open
local broadcast, event, flush_events =
  lib.events.broadcast, lib.events.event, lib.events.flush_events
local done = lib.call.done
local dead_empty = lib.leases.dead_empty
local mix_note = lib.mixslot.mix_note

-- The order of a pass: a seeded permutation of 0..PN-1 (a 4-round Feistel network on
-- two halves of h bits, cycle-walking into range; identity without shuffle), PN being the
-- tasks there were when the pass started; tasks appended since come after them in the
-- order they were appended (positions PN.., a position its task id), so a position
-- walked never changes its task. (A job made before PN: its create's tasks, meta n.) A
-- mixed job's order is the identity too: its tasks are its slots (lib/mix.lua).
local function perm_fn()
  local sh = mget(F.SHUFFLE)
  if sh ~= '1' then return function(i) return i end end
  -- (read only when shuffling: without, every position is its task id anyway)
  local n = tonum(mget(F.PN) or '') or mnum(F.N)
  if n <= 1 then return function(i) return i end end
  local seed = mnum(F.SEED)
  local p = mnum(F.PASS)
  if n == 2 then
    local flip = (seed + p) % 2
    return function(i) if flip == 1 and i < 2 then return 1 - i end return i end
  end
  local h = 1
  while math.pow(4, h) < n do h = h + 1 end
  local half = math.pow(2, h)
  local keys = {}
  for r = 1, 4 do keys[r] = (seed * 31 + p * 7919 + r * 104729) % 65536 end
  local function feistel(x)
    local left, right = mfloor(x / half), x % half
    for r = 1, 4 do
      local f = (right * 40503 + keys[r] * 9973 + 12345) % 65536
      f = bit.bxor(f, bit.rshift(f, 7))
      left, right = right, bit.bxor(left, f) % half
    end
    return left * half + right
  end
  return function(i)
    if i >= n then return i end
    local x = feistel(i)
    while x >= n do x = feistel(x) end
    return x
  end
end

-- The live tasks: all of them but the dead.
local function live_tasks()
  if dead_empty() then return tasks_n() end
  return tasks_n() - rcall('SCARD', K_DEAD)
end

-- The dead tasks whose done bit is set (a dead task is in no set of the pass), checked
-- when the dead set is small enough to read in one call (nil: not checked here; the
-- audit reads it in pages). Cleared (fix = true): the task is not live, so no ack of it
-- can stand for one of a live task. Never found by construction (docs/design.md,
-- "Invariants"); the check is what makes "complete" a statement about membership.
local function dead_and_done(fix)
  if dead_empty() then return 0 end
  if rcall('SCARD', K_DEAD) > DEAD_CHECK_MAX then return nil end
  local found = 0
  for _, task in lipairs(rcall('SMEMBERS', K_DEAD)) do
    if rcall('GETBIT', K_DONE, task) == 1 then
      found = found + 1
      if fix then rcall('SETBIT', K_DONE, task, 0) end
    end
  end
  return found
end

-- The done count made the done set's size again (a BITCOUNT of at most N / 8 bytes):
-- where the count could drift from the set (a rewind, a retry, a forced advance, the
-- pass's end). Returns the count; a drift found is an event.
local function recount_done()
  local bits = rcall('BITCOUNT', K_DONE)
  if bits ~= mnum(F.NDONE) then
    event('recount', 'done', fmt(bits), 'was', fmt(mnum(F.NDONE)))
    mput(F.NDONE, bits)
  end
  return bits
end

-- kind: completed | skipped | reset | cancelled | rewound (`epoch`, `to`: the rewind's
-- epoch and checkpoint). A
-- summary says what the attempt's sets held at its end: `acked` the done set's size,
-- `live` the live tasks, `dead_done` the dead tasks found done (nil: not checked).
local function save_summary(kind, epoch, to)
  local p = mget(F.PASS)
  local field = p
  if kind == 'reset' then field = p .. '/r' .. fmt(mnum(F.P_RESETS)) end
  if kind == 'rewound' then field = p .. '/w' .. fmt(epoch) end
  local summary = {
    pass = tonum(p), round = CALL.ROUND, state = kind,
    started_ms = mnum(F.PSTART), ended_ms = CALL.NOW,
    done = mnum(F.NDONE), dead = rcall('SCARD', K_DEAD),
    acked = rcall('BITCOUNT', K_DONE), live = live_tasks(), dead_done = dead_and_done(false),
    skipped = mnum(F.P_SKIPPED), stale = mnum(F.P_STALE), resets = mnum(F.P_RESETS),
    max_lateness_ms = mnum(F.P_MAXLATE), leased = mnum(F.P_LEASED),
    expired = mnum(F.P_EXPIRED),
    resumed = mnum(F.P_RESUMED), resumed_samples = mnum(F.P_RESUMED_S),
    reread_samples = mnum(F.P_REREAD),
  }
  if kind == 'rewound' then summary.rewound, summary.rewound_to = true, to end
  -- the write that adds a summary drops the oldest beyond SUMMARIES_MAX (passes, resets
  -- and rewound attempts together), so the hash is bounded in all; passidx orders the
  -- fields by a sequence (sum_seq), which a checkpoint notes
  local seq = mincr(F.SUM_SEQ)
  summary.seq = seq
  rcall('HSET', K_PASSES, field, cjson.encode(summary))
  rcall('ZADD', K_PASSIDX, seq, field)
  if rcall('ZCARD', K_PASSIDX) > SUMMARIES_MAX then
    local old = rcall('ZPOPMIN', K_PASSIDX)
    if old[1] then rcall('HDEL', K_PASSES, old[1]) end
  end
end

-- The sets of a pass attempt go (a new pass, a reset, a rewind): O(1), with UNLINK; with
-- `wake`, the per-task wake list too.
local function drop_pass_sets(wake)
  rcall('UNLINK', K_DONE, K_FRONT, K_OWNED, K_DEADLINES, K_RESERVED, K_STARTED,
    K_PROGRESS)
  if wake then rcall('UNLINK', K_WAKE) end
end

-- Starts pass p (a new round): O(1), the big keys go with UNLINK.
local function start_pass(p, kind)
  CALL.ROUND = mincr(F.ROUND)
  drop_pass_sets(false)
  mset(F.P_RESUMED, 0, F.P_RESUMED_S, 0, F.P_REREAD, 0)
  flush_events()  -- the step entry so far is the last pass's (event_task)
  mix_note()  -- (a mixed job: how far the pass left was handed out)
  if p ~= mnum(F.PASS) and mget(F.SHUFFLE) == 'm' then
    -- a mixed job's dead are its copies (K_MIXDEAD): no slot of the new pass is dead for
    -- its position (its charge marks the dead copies' slots, lib/mix.lua), and a slot's
    -- counts were its last copy's
    rcall('UNLINK', K_DEAD, K_DEADBITS, K_COUNTS)
    CALL.DEAD_EMPTY, CALL.COUNTS_EMPTY = true, true
  end
  mset(F.PASS, p, F.CURSOR, 0, F.PN, fmt(tasks_n()), F.NDONE, 0, F.NLEASED, 0,
    F.NRESERVED, 0, F.P_STALE, 0, F.P_SKIPPED, 0, F.P_MAXLATE, 0, F.P_LEASED, 0,
    F.P_EXPIRED, 0, F.P_BACKUPS, 0, F.PSTART, fmt(CALL.NOW), F.STATE, 'running', F.REASON, '',
    F.SROUND, '')
  if kind ~= 'pass_reset' then mset(F.P_RESETS, 0) end
  CALL.STATE = 'running'
  event(kind, 'round', CALL.ROUND)
  broadcast()
end

local function set_waiting(reason)
  if CALL.STATE == 'waiting' and mget(F.REASON) == reason then return end
  mset(F.STATE, 'waiting', F.REASON, reason)
  CALL.STATE = 'waiting'
  event('job_waiting', 'reason', reason)
  broadcast()
end

-- Ends the current pass (kind: completed | skipped) and moves on as configured; `last`:
-- the job completes whatever its passes (a sealed stream of no task: a pass would read
-- nothing).
local function finish_pass(kind, last)
  save_summary(kind)
  mset(F.LAST_PASS_MS, fmt(CALL.NOW - mnum(F.PSTART)))
  event('pass_' .. kind, 'done', mget(F.NDONE))
  local p = mnum(F.PASS)
  local passes = mnum(F.PASSES)
  if last or (passes >= 0 and p + 1 >= passes) then
    -- the attempt's pieces and progress stand (a retry reopens it: what its dead tasks
    -- had read is not read again, what was acked stays acked), recorded under its round
    if (mget(F.SROUND) or '') == '' then mset(F.SROUND, CALL.ROUND) end
    CALL.ROUND = mincr(F.ROUND)  -- nothing written under the last round is current any more
    mset(F.STATE, 'completed', F.REASON, '', F.NLEASED, 0, F.NRESERVED, 0)
    rcall('UNLINK', K_FRONT, K_OWNED, K_DEADLINES, K_RESERVED, K_STARTED)
    CALL.STATE = 'completed'
    event('job_completed')
    broadcast()
  elseif mget(F.ADVANCE) == '0' then
    set_waiting('manual_advance')
  else
    start_pass(p + 1, 'pass_started')
  end
end

-- A pass attempt is complete exactly when every live task is in its done set and no
-- lease is current. The count (ndone, kept with the set by every ack) says when to look;
-- the set decides: its size is counted again and a dead task found done is taken out
-- (once per attempt, at its end), so a drifted count can neither end an attempt early
-- nor keep it open.
local function check_pass_end()
  if CALL.STATE ~= 'running' then return end
  if mnum(F.NLEASED) > 0 then return end
  local dead = 0
  if not dead_empty() then dead = rcall('SCARD', K_DEAD) end
  -- (fewer done than the create's live tasks: the appended ones need not be counted)
  if mnum(F.NDONE) < mnum(F.N) - dead and mget(F.SHUFFLE) ~= 'm' then return end
  local live = tasks_n() - dead
  if mnum(F.NDONE) < live then return end
  if mget(F.STREAM) == 'open' then return end  -- appends may come: it ends once sealed
  if mix_open() then return end  -- (a mixed job's stream source not run out: its feed may come)
  if live == 0 then
    -- no task at all (a sealed stream nothing was appended to): nothing to wait for
    if tasks_n() == 0 then finish_pass('completed', true) else set_waiting('all_dead') end
    return
  end
  local wrong = dead_and_done(true)
  if wrong and wrong > 0 then event('recount', 'dead_done', fmt(wrong)) end
  if recount_done() ~= live then return end
  finish_pass('completed')
end

-- A take (dispatch's `take`, called with the arguments after `expect_pass`) of a mixed job
-- that leased nothing may have charged its pass's end (every source run out, a stream
-- sealed since the last ack: lib/mixfeed.lua): the pass ends here. Then the caller gets
-- JOB_COMPLETED, PASS_DONE when it expects the pass, else the new pass's take.
local function mix_take(take, expect_pass, ...)
  local p0 = mnum(F.PASS)
  local got = take(...)
  if #got > 0 or mget(F.SHUFFLE) ~= 'm' then return got end
  check_pass_end()
  if CALL.STATE == 'completed' then return got, C.JOB_COMPLETED end
  if mnum(F.PASS) == p0 then return got end
  if expect_pass >= 0 then return got, C.PASS_DONE end
  if CALL.STATE == 'running' then got = take(...) end
  return got
end

return {perm_fn = perm_fn, mix_take = mix_take, live_tasks = live_tasks, dead_and_done = dead_and_done,
  recount_done = recount_done, save_summary = save_summary, drop_pass_sets = drop_pass_sets,
  start_pass = start_pass, finish_pass = finish_pass, check_pass_end = check_pass_end}
