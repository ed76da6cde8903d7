-- dispatch.lua: the front, the cursor (the pass's order: passes.lua perm_fn), granting and
-- stealing leases, and the lease half of a call.
local rcall, tonum, smatch, sbyte, mmin, mmax, unpk, lipairs =
  redis.call, tonumber, string.match, string.byte, math.min, math.max, unpack, ipairs
local fmt, mget, mincr, mnum, mset_s, tasks_n = lib.meta.fmt, lib.meta.mget, lib.meta.mincr,
  lib.meta.mnum, lib.meta.mset_s, lib.meta.tasks_n
local event, event_task, event_tasks, wait_add, wait_rem, wake_one =
  lib.events.event, lib.events.event_task, lib.events.event_tasks, lib.events.wait_add,
  lib.events.wait_rem, lib.events.wake_one
local jnow_s, now_s, round_s = lib.call.jnow_s, lib.call.now_s, lib.call.round_s
local counts_empty, dead_empty, end_lease, lease_is_current, lw_flush, lw_new, member, next_token,
  parse_lease, read_empties, start_due, task_tt =
  lib.leases.counts_empty, lib.leases.dead_empty, lib.leases.end_lease, lib.leases.lease_is_current,
  lib.leases.lw_flush, lib.leases.lw_new, lib.leases.member, lib.leases.next_token,
  lib.leases.parse_lease, lib.leases.read_empties, lib.leases.start_due, lib.leases.task_tt
local lease_head, lease_mid, lease_rec =
  lib.leases.lease_head, lib.leases.lease_mid, lib.leases.lease_rec
local split_rec, take_split, whole_ok, whole_anyway =
  lib.pieces.split_rec, lib.split.take_split, lib.pieces.whole_ok, lib.pieces.whole_anyway
local reads_of = lib.workers.reads_of
local perm_fn, mix_take = lib.passes.perm_fn, lib.passes.mix_take
local mix_flush, mix_charge, mix_fields, mix_front, mix_sources = lib.mix.mix_flush,
  lib.mixslot.mix_charge, lib.mixslot.mix_fields, lib.mixslot.mix_front, lib.mixslot.mix_sources
local add_starts = lib.progress.add_starts
local reclaim = lib.reclaim.reclaim

-- Grants one lease on `task` to the caller; st = 'R' (reserved) or 'S' (started).
-- The reply's chunks (element 4) are filled in by take(), one HMGET per call.
local GRANTED = {}  -- per call: the task ids (strings) granted by this take(), in order
local SKIPPED = {}  -- per call: {task, score} popped from the front and left for others
local MIXED = false  -- per call: a mixed job's take (lib/mix.lua)
-- (cn: the call number's digits; task_n: the task's number when the caller has it, else nil)
-- (buf: a batch's writes, leases.lua lw_new; nil: written at once)
local function grant(task, worker, winc, cn, st, task_n, buf)
  local tok = next_token()
  local attempt, att_s = 1, '1'
  if not counts_empty() then
    attempt = (tonum(rcall('HGET', K_COUNTS, 'a:' .. task) or '0') or 0) + 1
    att_s = fmt(attempt)
  end
  GRANTED[#GRANTED + 1] = task
  if st == 'S' then start_due() else mincr(F.NRESERVED) end
  -- the record but its token and attempt (a batch's are alike: made once per take, buf.lh
  -- and buf.ts / buf.tr, and the owned members' head buf.mh)
  local lh, lt
  if buf then
    lh = buf.lh
    if st == 'S' then lt = buf.ts else lt = buf.tr end
  end
  if not lh then
    lh = lease_head(worker, winc)
    if buf then buf.lh, buf.mh = lh, member(worker, winc, '') end
  end
  if not lt then
    lt = lease_mid(round_s(), st, now_s(), cn)
    if buf and st == 'S' then buf.ts = lt elseif buf then buf.tr = lt end
  end
  local rec = lh .. tok .. lt .. att_s .. '|' .. CALL.CALLER_DIG
  if buf then
    local h, oa = buf.h, buf.oa
    local n = #h
    h[n + 1], h[n + 2] = task, rec
    buf.p[task] = rec
    n = #oa
    oa[n + 1], oa[n + 2] = '0', buf.mh .. task
    local z, score = buf.ra, nil
    if st == 'S' then z, score = buf.sa, jnow_s() else score = now_s() end
    n = #z
    z[n + 1], z[n + 2] = score, task
  else
    rcall('HSET', K_LEASES, task, rec)
    rcall('ZADD', K_OWNED, '0', member(worker, winc, task))
    if st == 'S' then
      rcall('ZADD', K_STARTED, jnow_s(), task)
    else
      rcall('ZADD', K_RESERVED, now_s(), task)
    end
  end
  -- (nleased, c_leased and p_leased: counted once per take, for all its grants; a batch's
  -- step event lists too, take())
  if buf then  -- (buf.S, buf.R: {tasks, tokens} of the grants of each kind)
    local e = buf[st]
    if e then
      local n = #e[1] + 1
      e[1][n], e[2][n] = task, tok
    else
      buf[st] = {{task}, {tok}}
    end
  else
    event_task(st == 'S' and 'leased' or 'reserved', task, worker, tok)
  end
  -- (the row with its start slot, which add_starts sets: a sixth slot set later grew the
  -- array, a rehash per row)
  return {task_n or tonum(task), tok, attempt, false, st == 'S' and 1 or 0, 0}
end

-- After a failure, the worker that failed a task does not get it back for one heartbeat
-- interval while another worker is alive (one broken node must not burn a task's
-- failures in milliseconds); counts' "x:<task>" = "worker|jnow of the failure".
local OTHERS_ALIVE = nil  -- per call
local AVOID_UNTIL = nil  -- per call: the earliest end of a backoff that made this call skip
local BACKUP_AT = nil  -- per call: when a backup or a tail left to others may come (job clock)
local function avoided(task, worker)
  if mnum(F.P_BACKUPS) > 0 and split_rec(task) then  -- a split task's pieces: two workers
    local b = parse_lease(rcall('HGET', K_LEASES, 'b:' .. task))
    if lease_is_current(b) and b.worker == worker then return true end
  end
  if counts_empty() then return false end
  local x = rcall('HGET', K_COUNTS, 'x:' .. task)
  if not x then return false end
  local w, at = smatch(x, '^(.*)|([^|]*)$')
  if w ~= worker then return false end
  local until_ms = (tonum(at) or 0) + mnum(F.HBI)
  if until_ms <= CALL.JNOW then return false end
  if OTHERS_ALIVE == nil then
    OTHERS_ALIVE = rcall('ZCOUNT', K_WORKERS, jnow_s(), '+inf') > 1
  end
  if not OTHERS_ALIVE then return false end
  if not AVOID_UNTIL or until_ms < AVOID_UNTIL then AVOID_UNTIL = until_ms end
  return true
end

-- Whether the caller may lease `task` (from the front or by a steal): a head piece of a
-- split task only if its loop honours ranges, else only whole (pieces.lua whole_ok, which
-- may undo the split; whole_anyway when no range reader is left). One HGET when a split
-- was made in this pass attempt, else none.
local READS = nil  -- per call: the caller's reads_of
local PIECE_LEFT = false  -- per call: a head piece was left for a range reader
local function piece_ok(task, worker, winc)
  if mnum(F.P_BACKUPS) == 0 or not split_rec(task) then return true end
  if READS == nil then READS = reads_of(worker, winc) end
  if READS ~= 'w' or whole_ok(task) or whole_anyway(task) then return true end
  PIECE_LEFT = true
  return false
end

-- A whole-task reader that got nothing and left a head piece in the front passes its
-- wake-up on to a range reader waiting (the first ten waiters looked at), if any: the
-- token it may have taken was that piece's, and a range reader blocked behind it would
-- otherwise notice the piece only at its wait bound. (A whole-task reader woken by it
-- in turn leaves it again and passes it on; the waiters are served in the order they
-- blocked, the range reader among the first.)
local function pass_wake(m)
  for _, w in lipairs(rcall('ZRANGE', K_WAITING, 0, 9)) do
    local wk, wi = smatch(w, '^(.*)|([^|]*)$')
    if w ~= m and wk and reads_of(wk, wi) ~= 'w' then
      wake_one()
      return
    end
  end
end

-- (buf: a batch's writes, whose records it reads first)
local function is_free(task, buf)
  if not dead_empty() and rcall('SISMEMBER', K_DEAD, task) == 1 then return false end
  if rcall('GETBIT', K_DONE, task) == 1 then return false end
  local rec = buf and buf.p[task] or rcall('HGET', K_LEASES, task)
  -- no record, or an ended one ("E|..."): free without parsing it
  if not rec or sbyte(rec, 1) ~= 76 then return true end  -- 76: 'L'
  return not lease_is_current(parse_lease(rec))
end

-- At the tail of a pass (nothing left to lease or steal), an idle trainer may take a
-- backup lease of a started task that has run longer than backup_k x the median task
-- time: at most one backup per task at a time, never of the caller's own task. The
-- record goes to field "b:<task>" (leases.lua); the first ack wins.
-- (cn: the call number's digits)
local function take_backup(worker, winc, cn)
  local k = tonum(mget(F.BACKUP_K) or '') or 0
  if k <= 0 then return nil end
  -- the job's median task time (ms; acked_one keeps it), once 10 tasks were acked
  if mnum(F.ACKED_JOB) < 10 then return nil end
  local med = mnum(F.DUR_MED) / 1000
  local cands = rcall('ZRANGEBYSCORE', K_STARTED, '-inf', fmt(CALL.JNOW - k * med),
    'LIMIT', 0, 10)
  for _, task in lipairs(cands) do
    local l = parse_lease(rcall('HGET', K_LEASES, task))
    -- a task on its first attempt only: one that already cost a trainer may be poison
    if lease_is_current(l) and l.st == 'S' and l.worker ~= worker and l.attempts == '1'
        and not split_rec(task)
        and not lease_is_current(parse_lease(rcall('HGET', K_LEASES, 'b:' .. task))) then
      local tok = next_token()
      rcall('HSET', K_LEASES, 'b:' .. task,
        lease_rec(worker, winc, tok, l.rs, 'S', now_s(), cn, l.attempts, CALL.CALLER_DIG))
      GRANTED[#GRANTED + 1] = task
      rcall('ZADD', K_OWNED, '0', member(worker, winc, task))
      mincr(F.C_LEASED)
      mincr(F.P_LEASED)
      mincr(F.C_BACKUPS)
      mincr(F.P_BACKUPS)
      event('backup', 'task', task, 'worker', worker, 'token', tok, 'of', l.worker,
        'running_ms', fmt(CALL.JNOW - tonum(rcall('ZSCORE', K_STARTED, task))))
      return {tonum(task), tok, tonum(l.attempts), false, 1, 0}
    end
  end
  -- none yet: a waiter comes back when the next started task passes the bar
  local nxt = rcall('ZRANGEBYSCORE', K_STARTED, '(' .. fmt(CALL.JNOW - k * med), '+inf',
    'WITHSCORES', 'LIMIT', 0, 1)
  if #nxt > 0 then BACKUP_AT = math.ceil(tonum(nxt[2]) + k * med) end
  return nil
end

-- Leases up to `want` tasks: the front first (a solo task only alone), then the
-- cursor's order; when nothing is left, steal a reserved task from another trainer.
-- The kind of the next lease of a take: mode S or R as asked; F: the first started, the
-- rest reserved (`got`: leases granted so far in this take).
local function lease_kind(mode, got)
  if mode == 'F' then
    if got == 0 then return 'S' end
    return 'R'
  end
  return mode
end

local function take_leases(worker, winc, want, cn, mode, buf)
  local out = {}
  local steps = 0
  -- the front found empty (by the call's EXISTS or a ZPOPMIN; nothing adds to it below)
  if CALL.FRONT_EMPTY == nil and not CALL.EMPTIES_READ then read_empties() end
  local front_empty = CALL.FRONT_EMPTY == true
  local charged = MIXED and mix_front(front_empty) or math.huge  -- (lib/mixslot.lua)
  while not front_empty and #out < want and steps < 1000 do
    local popped = rcall('ZPOPMIN', K_FRONT)
    if #popped == 0 then front_empty = true; break end
    steps = steps + 1
    local task = popped[1]
    local free = is_free(task, buf)
    SKIPPED[task] = MIXED and tonum(task) >= charged  -- (not charged: left, not walked)
    if free and (SKIPPED[task] or avoided(task, worker) or not piece_ok(task, worker, winc)) then
      SKIPPED[#SKIPPED + 1] = popped  -- back to the front in take(), at its place
    elseif free then
      local solo = not counts_empty() and rcall('HGET', K_COUNTS, 's:' .. task) == '1'
      if solo and #out > 0 then
        CALL.FRONT_EMPTY = false
        rcall('ZADD', K_FRONT, popped[2], task)
        return out, #out
      end
      out[#out + 1] = grant(task, worker, winc, cn, lease_kind(mode, #out), nil, buf)
      if solo then return out, #out end
    end
  end
  local cursor, n = mnum(F.CURSOR), mnum(F.N)
  -- The walk goes under 1,000 positions: the appended tasks (after the create's) are
  -- counted only when it may reach them (one HGET, lib/meta.lua tasks_n).
  if MIXED or cursor + 1000 > n then n = tasks_n(true) end  -- (a mixed pass may stop before n)
  if #out < want and cursor < n then
    local perm = perm_fn()
    while #out < want and cursor < n and steps < 1000 do
      if cursor >= charged then charged = mix_charge(cursor) end
      if cursor >= charged then n = charged; break end  -- (a mixed pass stopped before it)
      local task_n = perm(cursor)
      local task = fmt(task_n)
      cursor = cursor + 1
      steps = steps + 1
      if is_free(task, buf) and (front_empty or rcall('ZSCORE', K_FRONT, task) == false)
          and not (MIXED and SKIPPED[task]) then
        out[#out + 1] = grant(task, worker, winc, cn, lease_kind(mode, #out), task_n, buf)
      end
    end
    mset_s(F.CURSOR, fmt(cursor))
  end
  -- Only an idle trainer steals (it wants a task to start now); refilling a prefetch
  -- buffer from another trainer's reserved work would just move it back and forth.
  if #out == 0 and mode ~= 'R' and cursor >= n and mnum(F.NRESERVED) > 0 then
    local cands = rcall('ZRANGE', K_RESERVED, 0, 9)
    for _, task in lipairs(cands) do
      local l = parse_lease(rcall('HGET', K_LEASES, task))
      -- (never the other piece of a split task the caller holds a piece of: avoided)
      if lease_is_current(l) and l.st == 'R' and not (l.worker == worker and l.winc == winc)
          and not avoided(task, worker) and piece_ok(task, worker, winc) then
        end_lease(task, l, 'S')
        mincr(F.C_STOLEN)
        event('stolen', 'task', task, 'from', l.worker, 'by', worker)
        out[#out + 1] = grant(task, worker, winc, cn, lease_kind(mode, #out))
        break
      end
    end
  end
  if #out == 0 and mode ~= 'R' and cursor >= n and CALL.STATE == 'running' then
    local piece, back = take_split(worker, winc, cn)
    if piece then GRANTED[#GRANTED + 1] = fmt(piece[1]) end
    if back and (not BACKUP_AT or back < BACKUP_AT) then BACKUP_AT = back end
    out[#out + 1] = piece or take_backup(worker, winc, cn)
    return out, 0  -- (a piece or a backup, counted where it was taken)
  end
  return out, #out
end

local function take(worker, winc, want, call_no, mode)
  GRANTED = {}
  SKIPPED = {}
  MIXED = mget(F.SHUFFLE) == 'm'
  -- (a take of more than one gathers its grants' writes, leases.lua lw_new: made before
  -- anything else reads those keys; a steal, a split piece or a backup comes only when
  -- nothing was granted)
  local buf = nil
  if want > 1 then buf = lw_new() end
  -- (the leases grant() made: counted here at once, three mincr's rather than three each)
  local out, granted = take_leases(worker, winc, want, fmt(call_no), mode, buf)
  if MIXED then mix_flush() end
  if buf then
    lw_flush(buf)
    -- (as grant() would have: the started ones first, mode F)
    if buf.S then event_tasks('leased', buf.S[1], buf.S[2], worker) end
    if buf.R then event_tasks('reserved', buf.R[1], buf.R[2], worker) end
  end
  if granted > 0 then
    mincr(F.NLEASED, granted)
    mincr(F.C_LEASED, granted)
    mincr(F.P_LEASED, granted)
  end
  for _, p in lipairs(SKIPPED) do
    CALL.FRONT_EMPTY = false
    rcall('ZADD', K_FRONT, p[2], p[1])
  end
  if #out > 0 then
    local fields = MIXED and mix_fields(out) or GRANTED  -- (a mixed job's: its copies')
    local chunks = rcall('HMGET', K_CHUNKS, unpk(fields))
    for k, g in lipairs(out) do g[4] = chunks[k] end
    add_starts(out, GRANTED)
    if MIXED then mix_sources(out, fields) end
  end
  return out
end

-- How long a waiter may block before lazy reclaim could give it work (ms; 0 = no bound).
local function wait_bound_ms()
  local best = AVOID_UNTIL  -- a failed task this worker must leave to others a while
  if BACKUP_AT and (not best or BACKUP_AT < best) then best = BACKUP_AT end
  if mnum(F.NLEASED) == 0 and not best then return 0 end
  local tt = task_tt()
  if tt > 0 then
    local d = rcall('ZRANGE', K_STARTED, 0, 0, 'WITHSCORES')
    if #d > 0 and (not best or tonum(d[2]) + tt < best) then best = tonum(d[2]) + tt end
  end
  local w = rcall('ZRANGE', K_WORKERS, 0, 0, 'WITHSCORES')
  if #w > 0 and (not best or tonum(w[2]) < best) then best = tonum(w[2]) end
  if not best then return 0 end
  return mmax(1, best - CALL.JNOW + 1)
end

-- The lease half shared by lease.lua and ack.lua. Returns {code, tasks, wait_ms}.
local function lease_part(worker, winc, want, call_no, mode, expect_pass)
  local m = worker .. '|' .. winc
  if CALL.STATE == 'cancelled' then return {C.JOB_CANCELLED, {}, 0} end
  if CALL.STATE == 'completed' then return {C.JOB_COMPLETED, {}, 0} end
  if expect_pass >= 0 and expect_pass < mnum(F.PASS) then return {C.PASS_DONE, {}, 0} end
  if expect_pass == mnum(F.PASS) and CALL.STATE == 'waiting' and mget(F.REASON) == 'manual_advance' then
    return {C.PASS_DONE, {}, 0}
  end
  if want > 0 and mget(F.PAUSED) == '1' then
    -- paused: wait like a waiting state (resume broadcasts), keeping what is held
    wait_add(m, now_s())
    return {C.NOTHING, {}, 0}
  end
  -- A worker's holdings are capped, so what one heartbeat or leave goes through is too.
  -- The cap is only within reach when the whole job holds that many: a worker's leases are
  -- among the job's nleased plus its backups (owned, not counted in nleased; p_backups, the
  -- pass attempt's, bounds the live ones), so below that its count is not needed.
  if want > 0 and mnum(F.NLEASED) + mnum(F.P_BACKUPS) + want > MAX_HELD then
    local held = rcall('ZLEXCOUNT', K_OWNED, '[' .. m .. '|', '(' .. m .. '|\255')
    if held >= MAX_HELD then
      return {C.INVALID, 'worker ' .. worker .. ' holds ' .. held .. ' leases, the most one '
        .. 'worker may hold (' .. MAX_HELD .. '): ack or release some first', 0}
    end
    want = mmin(want, MAX_HELD - held)
  end
  -- expecting a later pass than the current one only happens after a rollback (a restart
  -- from an older AOF, a failover to a lagging replica): that work must be redone, and a
  -- per-pass iterator waiting for the next pass would otherwise wait for ever
  if want > 0 and CALL.STATE == 'running' and (expect_pass < 0 or expect_pass >= mnum(F.PASS)) then
    local got, code = mix_take(take, expect_pass, worker, winc, want, call_no, mode)
    if code then return {code, {}, 0} end
    if #got > 0 then
      wait_rem(m)
      return {C.OK, got, 0}
    end
  end
  if want > 0 then
    wait_add(m, now_s())
    if PIECE_LEFT then pass_wake(m) end
    return {C.NOTHING, {}, wait_bound_ms()}
  end
  return {C.OK, {}, 0}
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  GRANTED = {}
  SKIPPED = {}
  OTHERS_ALIVE = nil
  AVOID_UNTIL = nil
  BACKUP_AT = nil
  READS = nil
  PIECE_LEFT = false
  MIXED = false
end

return {lease_part = lease_part, reset = reset}
