-- endings.lua: where a task goes after its lease ended: done (acked_one), back to the
-- front or dead (requeue, charged by charge_task), carried on by its other lease
-- (survives), and the ends end_held applies (acked_one, failed_one, released_one).
-- Backup leases: leases.lua's header.
local rcall, tonum, sbyte, mfloor, unpk = redis.call, tonumber, string.byte, math.floor, unpack
local fmt, mincr, mnum, mput, mset, mset_s =
  lib.meta.fmt, lib.meta.mincr, lib.meta.mnum, lib.meta.mput, lib.meta.mset, lib.meta.mset_s
local event, event_task, event_tasks, observe, wake_one =
  lib.events.event, lib.events.event_task, lib.events.event_tasks, lib.events.observe,
  lib.events.wake_one
local jnow_s, now_s = lib.call.jnow_s, lib.call.now_s
local mget, copy_at = lib.meta.mget, lib.mixslot.copy_at
local repeat_or_stale = lib.secrets.repeat_or_stale
local counts_empty, end_lease, holds_secret, lease_for, lw_flush, lw_new, other_lease, parse_lease,
  progress_empty, recompute_auto_timeout, start_due =
  lib.leases.counts_empty, lib.leases.end_lease, lib.leases.holds_secret, lib.leases.lease_for,
  lib.leases.lw_flush, lib.leases.lw_new, lib.leases.other_lease, lib.leases.parse_lease,
  lib.leases.progress_empty, lib.leases.recompute_auto_timeout, lib.leases.start_due
local split_dead, split_ended, split_rec, tail_stands, offered =
  lib.pieces.split_dead, lib.split.split_ended, lib.pieces.split_rec, lib.pieces.tail_stands,
  lib.pieces.offered

local function to_front(task)
  CALL.FRONT_EMPTY = false
  rcall('ZADD', K_FRONT, mincr(F.FSEQ), task)
  wake_one()
end

-- Notes who failed a task (fail, task timeout), so take_leases gives it to another
-- worker first (dispatch.lua: avoided).
local function note_failer(task, worker)
  CALL.COUNTS_EMPTY = false
  rcall('HSET', K_COUNTS, 'x:' .. task, worker .. '|' .. jnow_s())
end

local function make_dead(task, why)
  rcall('SADD', K_DEAD, task)
  rcall('SETBIT', K_DEADBITS, task, 1)  -- the set's bitmap, which a checkpoint copies
  CALL.DEAD_EMPTY = false
  -- a mixed job's slot: its copy is dead, in this pass and every later one (lib/mix.lua)
  if mget(F.SHUFFLE) == 'm' then
    local copy = copy_at(task)
    if copy then rcall('SADD', K_MIXDEAD, copy) end
  end
  -- a split task: a retry brings back what of it was not acked (split.lua: split_dead)
  if mnum(F.P_BACKUPS) > 0 then split_dead(task) end
  mincr(F.C_DEAD)
  event('dead', 'task', task, 'reason', why)
end

-- Counts a lease that ended without an ack; returns why the task is now dead, or nil.
-- charge: 'failure' (fail, task timeout) | 'attempt' (lost, release) | 'none'
local function charge_task(task, charge)
  local dead_reason = nil
  if charge ~= 'none' then
    CALL.COUNTS_EMPTY = false
    local a = rcall('HINCRBY', K_COUNTS, 'a:' .. task, 1)
    if a >= mnum(F.MAXA) then dead_reason = 'max_attempts' end
    if charge == 'failure' then
      local f = rcall('HINCRBY', K_COUNTS, 'f:' .. task, 1)
      if f >= mnum(F.MAXF) then dead_reason = 'max_failures' end
    end
  end
  return dead_reason
end

-- A started lease that ended without an ack: count it, then dead or back to the front.
local function requeue(task, charge)
  local dead_reason = charge_task(task, charge)
  if dead_reason then
    make_dead(task, dead_reason)
  else
    to_front(task)
  end
end

-- The ends end_held applies (ack, fail, release), with its arguments.
-- An ack's counts: n acks, `fresh` of them set a done bit, `ms` their task times' sum, med
-- the streaming median after them. A batch's (buf.acks, end_held) are gathered and made
-- once: ~8 k instructions an ack when each made its own, bench/HISTORY.md.
local function acks_counted(n, fresh, ms, med)
  if fresh > 0 then mincr(F.NDONE, fresh) end
  mincr(F.DUR_SUM, ms)
  mput(F.DUR_MED, med)
  mincr(F.C_ACKED, n)
  local acked = mincr(F.ACKED_JOB, n)
  mset_s(F.LAST_ACK, now_s())
  -- at every 20th ack of the job (a batch across a multiple of 20 recomputes once: the
  -- histogram it reads holds none of this call's acks yet, HBUF lands in done())
  if acked % 20 < n then recompute_auto_timeout() end
end

-- (buf: a batch's writes, leases.lua lw_new, in a pass attempt without backups or splits:
-- no split piece, no other lease; its counts gathered in buf.acks)
local function acked_one(task, l, tok, worker, _, _, buf)
  -- a piece of a split task: the done bit waits for the other piece's ack
  local was_split = false
  if not buf then
    local over
    over, was_split = split_ended(task, l, true, worker, tok)
    if not over then return end
  end
  local a = buf and buf.acks
  -- the count follows the set: a bit already set (never, by construction) adds nothing
  local fresh = 0
  if rcall('SETBIT', K_DONE, task, '1') == 0 then fresh = 1 end
  local b, ran = sbyte(l.sinces or '', 1), 0  -- (the record's digits: one strtod)
  if b and b >= 48 and b <= 57 then ran = CALL.NOW - l.sinces end
  local ms = observe('dur', ran, true)
  -- the median task time for backup leases: a frugal streaming median, 5 % steps (the
  -- histogram's buckets are too coarse for it, and a mean follows the stragglers)
  local d, med = ran * 1000, nil
  if a then med = a.med else med = mnum(F.DUR_MED) end
  -- (a split task's tail acked last ran for its piece only: not a task's time)
  if not (was_split and l.backup) then
    if med <= 0 then med = d elseif d > med then med = med * 1.05 elseif d < med then
      med = med / 1.05 end
  end
  -- (kept a whole number of µs, as it is stored: '%d', not '%.0f''s float printer)
  med = mfloor(med + 0.5)
  if not counts_empty() then
    rcall('HDEL', K_COUNTS, 'f:' .. task, 'a:' .. task, 's:' .. task, 'x:' .. task)
  end
  -- a done task's progress is spent: the hash keeps only unfinished tasks (checkpoints)
  if not progress_empty() then
    rcall('HDEL', K_PROGRESS, task)
  end
  if a then
    local k = a.n + 1
    a.n, a.fresh, a.ms, a.med = k, a.fresh + fresh, a.ms + ms, med
    a.tasks[k], a.tokens[k] = task, tok  -- (their step event's lists: end_held)
    return
  elseif buf then
    buf.acks = {n = 1, fresh = fresh, ms = ms, med = med, tasks = {task}, tokens = {tok}}
    return
  end
  acks_counted(1, fresh, ms, med)
  event_task('acked', task, worker, tok)
  local o = other_lease(task, l)
  if o then  -- the first ack wins: the other holder's lease is revoked (its ack is stale)
    end_lease(task, o, 'V')
    mincr(F.C_REVOKED)
    event('revoked', 'task', task, 'worker', o.worker, 'reason', 'acked_elsewhere')
  end
end

-- After `l` ended without an ack: true when the task's other lease is current and carries
-- on as the task's lease (not requeued). The ending is charged as ever (a task that kills
-- whoever runs it must not kill twice as many trainers): at a cap the other lease is
-- revoked and the task is dead. A surviving backup takes the task's record (the two
-- records swap, so a repeat of the ending is still recognised) and its indexes, with a
-- task timeout from now.
-- A piece of a split task does not carry the other on: it goes back (split_ended).
local function survives(task, l, charge)
  local o = other_lease(task, l)
  local s = split_rec(task)
  if not o and not s then return false end
  if s and l.backup and not s.cf then charge = 'none' end  -- a pending piece read nothing
  local dead_reason = charge_task(task, charge or 'none')
  if dead_reason then
    if o then
      end_lease(task, o, 'V')
      mincr(F.C_REVOKED)
      event('revoked', 'task', task, 'worker', o.worker, 'reason', dead_reason)
    end
    if s and s.hd and l.backup then tail_stands(task, nil) end  -- it stood for its task
    make_dead(task, dead_reason)
    return true
  end
  if s and not l.backup
      and (tonum(rcall('HGET', K_PROGRESS, task) or '0') or 0) >= s.m then
    -- a head piece with nothing left to read (empty: a task handed over whole at point
    -- 0; or read to its point) is acked by construction, its split confirmed (the tail
    -- offered if it was pending): sent to the front it waited for a range reader to
    -- lease and ack it, for ever if none was left
    if not s.cf then
      s.cf = true
      split_rec(task, s)
      if not s.td then offered(task) end
    end
    acked_one(task, l, l.token, l.worker)
    return true
  end
  if s then return split_ended(task, l, false) end
  if o.backup then
    local ended = rcall('HGET', K_LEASES, task)
    rcall('HSET', K_LEASES, task, rcall('HGET', K_LEASES, 'b:' .. task))
    rcall('HSET', K_LEASES, 'b:' .. task, ended)
    rcall('ZADD', K_STARTED, jnow_s(), task)
    start_due()
    mincr(F.NLEASED)
  end
  event('carries_on', 'task', task, 'worker', o.worker)
  return true
end

-- Expire one current lease (reason: worker_lost | task_timeout), deadline on JNOW.
local function expire(task, l, reason, deadline)
  local late = CALL.JNOW - deadline
  if late < 0 then late = 0 end
  observe('late', late)
  if late > mnum(F.P_MAXLATE) then mset(F.P_MAXLATE, fmt(late)) end
  end_lease(task, l, 'X')
  if reason == 'worker_lost' then mincr(F.C_EXP_WL) else mincr(F.C_EXP_TT) end
  mincr(F.P_EXPIRED)
  event('expired', 'task', task, 'reason', reason, 'worker', l.worker, 'lateness_ms', fmt(late))
  local charge = 'attempt'
  if reason == 'task_timeout' then charge = 'failure' end
  if l.st == 'R' then charge = 'none' end
  if survives(task, l, charge) then return end
  if charge == 'failure' then note_failer(task, l.worker) end
  requeue(task, charge)
end

-- One failing task is charged a failure; each of a failing batch of n > 1 goes back
-- uncharged, marked solo (see fail.lua). `why` is the error text.
local function failed_one(task, l, _, worker, n, why)
  mincr(F.C_FAILED)
  if survives(task, l, n == 1 and 'failure' or 'none') then
    event('failed', 'task', task, 'worker', worker, 'error', why)
    return
  end
  note_failer(task, worker)
  if n > 1 then
    rcall('HSET', K_COUNTS, 's:' .. task, '1')
    event('failed', 'task', task, 'worker', worker, 'error', why, 'batch', n)
    to_front(task)
  else
    rcall('HDEL', K_COUNTS, 's:' .. task)
    event('failed', 'task', task, 'worker', worker, 'error', why)
    requeue(task, 'failure')
  end
end

local function released_one(task, l, _, worker)
  mincr(F.C_RELEASED)
  event('released', 'task', task, 'worker', worker)
  if survives(task, l, l.st == 'S' and 'attempt' or 'none') then return end
  if l.st == 'S' then requeue(task, 'attempt') else requeue(task, 'none') end
end

-- Ends the leases a worker lists, (task, token) pairs from ARGV[first + 1] on: each one
-- it holds (with its secret, use_secret) gets its ended record (kind A | F | R) and then
-- `on_end(task, lease, token, worker, n, note, buf)` (one of the *_one functions above,
-- defined once in the library rather than as a closure on every call); any other is a quiet
-- repeat or stale (op names it in the stale event). Returns the result per pair (C.OK,
-- C.DUP or C.STALE).
-- A batch of acks in a pass attempt without backups or splits (whose acks read and write
-- other records: acked_one) reads its records in one HMGET and gathers its writes
-- (lw_new); a task listed twice reads the record its first listing wrote.
local function end_held(argv, first, n, worker, winc, kind, op, on_end, note)
  local out = {}
  local buf, recs, into = nil, nil, nil
  if n > 1 and kind == 'A' and mnum(F.P_BACKUPS) == 0 then
    buf = lw_new()
    -- (the holder's records, each parsed into this one table: used before the next;
    -- leases.lua end_lease makes their ended records alike)
    into = {live = true, worker = worker, winc = winc, token = false, round = CALL.ROUND,
      rs = false, st = false, sinces = false, calls = false, attempts = false, dig = false}
    buf.into = into
    local tasks = {}
    for k = 1, n do tasks[k] = argv[first + 2 * k - 1] end
    recs = rcall('HMGET', K_LEASES, unpk(tasks))  -- (checked ids: a read before the checks)
  end
  for k = 1, n do
    local task, tok = argv[first + 2 * k - 1], argv[first + 2 * k]
    local l
    if buf then  -- (lease_for without backups: the task's record)
      l = parse_lease(buf.p[task] or recs[k], worker, winc, tok, into)
    else
      l = lease_for(task, worker, winc, tok)
    end
    local held
    if l ~= nil and l == into then
      -- (the named holder's current lease: its head matched, only the secret is left)
      held = CALL.CALLER_DIG ~= nil and l.dig == CALL.CALLER_DIG
    else
      held = holds_secret(l, worker, winc, tok)
    end
    if held then
      end_lease(task, l, kind, buf)
      on_end(task, l, tok, worker, n, note, buf)
      out[k] = C.OK
    else
      out[k] = repeat_or_stale(task, l, kind, worker, winc, tok, op)
    end
  end
  if buf then
    if buf.nl > 0 then mincr(F.NLEASED, -buf.nl) end
    if buf.nr > 0 then mincr(F.NRESERVED, -buf.nr) end
    local a = buf.acks
    if a then
      acks_counted(a.n, a.fresh, a.ms, a.med)
      event_tasks('acked', a.tasks, a.tokens, worker)
    end
    lw_flush(buf)
  end
  return out
end

return {to_front = to_front, requeue = requeue, survives = survives, expire = expire,
  acked_one = acked_one, failed_one = failed_one, released_one = released_one,
  end_held = end_held}
