-- leases.lua: lease records, tokens, task timeouts, the owned / started / deadlines /
-- reserved indexes, ending a lease (end_lease, end_held), and where a task goes after a
-- lease ended without an ack (requeue: the front or dead; expire).
-- A lease record (HASH leases, field task) is
--   "L|worker|winc|token|round|R-or-S|since_ms|call_no|attempt|digest"  (current)
--   "E|worker|winc|token|round|A-F-X|digest"                            (just ended)
-- digest: the holder's lease secret digest (secret_digest), copied from the worker record
-- at the grant so the ended record still answers the holder's repeats after the worker
-- record is gone. Tokens order leases and anyone who reads the hash sees them; only the
-- holder knows the secret behind the digest (docs/design.md, "Lease secrets").
-- A started task may also have a backup lease (dispatch.lua: take_backup), the same
-- record (with its own holder's digest) in field "b:<task>": the first ack wins and the
-- other lease is revoked; when one ends without an ack the other carries on as the task's
-- lease (survives).

-- A lease record as a table; rs / sinces / calls / attempts are the record's own strings
-- (written back as they are), round its number. Only the round is compared on every call,
-- so the other numbers are left as strings (tonumber where used: each conversion is a
-- strtod, bench/README.md), and the round is converted only when it is not the current one.
-- A caller that names the holder it expects (worker, winc, tok: checked ids, so no '|' in
-- them) has the record's head compared as one string when it is that holder's current
-- lease, and only the rest matched (the whole pattern was ~half of an ack's record work).
local function parse_lease(rec, worker, winc, tok)
  if not rec then return nil end
  if sbyte(rec, 1) == 76 then  -- 'L'
    if tok then
      local rs = round_s()
      local head = 'L|' .. worker .. '|' .. winc .. '|' .. tok .. '|' .. rs .. '|'
      if ssub(rec, 1, #head) == head then
        local st, since, call, att, dig = smatch(rec,
          '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$', #head + 1)
        if st then
          return {live = true, worker = worker, winc = winc, token = tok, round = ROUND,
                  rs = rs, st = st, sinces = since, calls = call, attempts = att, dig = dig}
        end
      end
    end
    local w, wi, tok, r, st, since, call, att, dig = smatch(rec,
      '^L|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    if w then
      local round = ROUND
      if r ~= round_s() then round = tonum(r) end
      return {live = true, worker = w, winc = wi, token = tok, round = round, rs = r,
              st = st, sinces = since, calls = call, attempts = att, dig = dig}
    end
  end
  -- (a record written before lease secrets has no digest: nil, which no secret matches)
  local f = split(rec)
  if f[1] == 'L' then
    return {live = true, worker = f[2], winc = f[3], token = f[4], round = tonum(f[5]),
            rs = f[5], st = f[6], sinces = f[7], calls = f[8], attempts = f[9], dig = f[10]}
  end
  return {live = false, worker = f[2], winc = f[3], token = f[4], round = tonum(f[5]),
          rs = f[5], kind = f[6], dig = f[7]}
end

-- The caller's lease secret as the digest records keep: the first 16 hex digits (64
-- bits) of its SHA-1, or nil for a missing or short secret (matching no record). Hashed
-- once per call (use_secret); the secret itself is never written anywhere.
local CALLER_DIG = nil  -- per call
local function secret_digest(secret)
  if ltype(secret) ~= 'string' or #secret < 16 then return nil end
  return ssub(redis.sha1hex(secret), 1, 16)
end
local function use_secret(secret)
  CALLER_DIG = secret_digest(secret)
  return CALLER_DIG
end
-- The secret argument, checked with the others (lib/args.lua) but never shown in the
-- answer; the caller's digest from then on. Returns the digest (or a stand-in when bad).
local function arg_secret(v)
  if not use_secret(v) then
    arg_fail('secret', 'missing or shorter than 16 characters (a taskq client older '
      .. 'than this library? upgrade it)')
    return ''
  end
  return CALLER_DIG
end

-- A write naming a lease's holder and token with the wrong secret: someone who read the
-- leases hash. Answered stale by the caller, counted apart so an operator notices.
-- (task nil: a lease request in a worker's name, whose record has the digest.)
local function forged(task, worker, tok, op)
  mincr(F.C_FORGED)
  if task then
    event('forged', 'task', task, 'worker', worker, 'token', tok, 'op', op)
  else
    event('forged', 'worker', worker, 'op', op)
  end
end

-- A write naming the lease's own holder (worker, incarnation) and token with another
-- secret: someone who read the record (the holder itself never does: its incarnation and
-- secret change together, so after a re-register its late writes name another
-- incarnation and are merely stale).
local function is_forged(l, worker, winc, tok)
  return l and l.token == tok and l.worker == worker and l.winc == winc
    and not (CALLER_DIG and l.dig == CALLER_DIG)
end

-- A write about a lease that is not current: a quiet success when its holder (the secret
-- matches) repeats the ending this very lease got (tokens are unique); forged (above);
-- else stale. Forged and stale change nothing, are counted.
local function repeat_or_stale(task, l, kind, worker, winc, tok, op)
  if is_forged(l, worker, winc, tok) then
    forged(task, worker, tok, op)
    return C.STALE
  end
  if l and not l.live and l.kind == kind and l.worker == worker and l.winc == winc
      and l.token == tok then
    return C.DUP
  end
  mincr(F.C_STALE)
  mincr(F.P_STALE)
  event('stale', 'task', task, 'worker', worker, 'token', tok, 'op', op)
  return C.STALE
end

-- Tokens only grow, even after a restart that lost writes: max(last + 1, real TIME in us).
local TOKEN_US = nil  -- per call
local function next_token()
  if not TOKEN_US then
    TOKEN_US = TIME_US  -- this call's TIME (open_job), read once
    if not TOKEN_US then
      local t = rcall('TIME')
      TOKEN_US = tonum(t[1]) * 1000000 + tonum(t[2])
    end
  end
  local tok = mmax(mnum(F.LAST_TOKEN) + 1, TOKEN_US)
  local tok_s = fmt(tok)
  mput_s(F.LAST_TOKEN, tok, tok_s)
  return tok_s
end

-- The task timeout fixed at start: none, a number, or auto (10 x p99, at least 60 s,
-- once 20 tasks of the job were acked).
local function task_timeout_ms()
  local tt = mget(F.TT)
  if tt == 'none' then return 0 end
  if tt == 'auto' then return mnum(F.AUTO_TT) end
  return tonum(tt) or 0
end

-- A deadline (JNOW ms) is set at `ms`: reclaim's hint F.DUE stays below every deadline.
local function due_by(ms)
  if ms < mnum(F.DUE) then mput(F.DUE, ms) end
end

-- The deadline of a task started now (a string), or nil without a task timeout.
local DL_TT, DL_S = nil, nil  -- per call
local function start_deadline()
  local tt = task_timeout_ms()
  if tt <= 0 then return nil end
  if tt ~= DL_TT then
    DL_TT, DL_S = tt, fmt(JNOW + tt)
    due_by(JNOW + tt)
  end
  return DL_S
end

-- The auto task timeout: 10 x the p99 of task durations (histogram "dur"), at least 60 s.
-- (The buckets in one HMGET, their sum the count: every 20th ack reads them, and one
-- command per bucket was about 5 % of an ack's server time, bench/README.md.)
local function recompute_auto_timeout()
  local bounds = HIST_BOUNDS
  local fields = {}
  for b = 1, #bounds + 1 do fields[b] = 'dur:' .. b end
  local got = rcall('HMGET', K_HIST, unpk(fields))
  local total = 0
  for b = 1, #bounds + 1 do
    local c = tonum(got[b] or '0') or 0
    got[b] = c
    total = total + c
  end
  local need, seen = total * 0.99, 0
  local p99 = bounds[#bounds]
  for b = 1, #bounds do
    seen = seen + got[b]
    if seen >= need then p99 = bounds[b]; break end
  end
  mset(F.AUTO_TT, fmt(mmax(60000, 10 * p99)))
end

local function lease_is_current(l)
  return l and l.live and l.round == ROUND
end

-- True when `l` is the current lease of this worker incarnation under this token: the
-- only lease any write about a task may change.
local function holds(l, worker, winc, tok)
  return lease_is_current(l) and l.worker == worker and l.winc == winc and l.token == tok
end

-- holds(), and the caller's secret (use_secret) is the holder's: what ending or starting
-- a lease needs.
local function holds_secret(l, worker, winc, tok)
  return holds(l, worker, winc, tok) and CALLER_DIG ~= nil and l.dig == CALLER_DIG
end

local function member(worker, winc, task) return worker .. '|' .. winc .. '|' .. task end

-- The lease of `task` this worker incarnation holds or last held: the task's record, or
-- its backup record (l.backup) when that one is the worker's. Backups exist only in a pass
-- attempt that granted one (p_backups), so other calls read one record.
-- (tok: the token the caller names, if any: parse_lease's short way for its own lease)
local function lease_for(task, worker, winc, tok)
  local l = parse_lease(rcall('HGET', K_LEASES, task), worker, winc, tok)
  local mine = l and l.worker == worker and l.winc == winc
  if (mine and lease_is_current(l)) or mnum(F.P_BACKUPS) == 0 then return l end
  local b = parse_lease(rcall('HGET', K_LEASES, 'b:' .. task))
  if b and b.worker == worker and b.winc == winc and (lease_is_current(b) or not mine) then
    b.backup = true
    return b
  end
  return l
end

-- The task's other current lease once `l` ended: its backup, or the lease it backed up.
local function other_lease(task, l)
  if mnum(F.P_BACKUPS) == 0 then return nil end
  local o
  if l.backup then
    o = parse_lease(rcall('HGET', K_LEASES, task))
  else
    o = parse_lease(rcall('HGET', K_LEASES, 'b:' .. task))
    if o then o.backup = true end
  end
  if lease_is_current(o) then return o end
  return nil
end

-- Whether the counts hash (a: f: s: per task), the dead set, this pass attempt's progress
-- hash and the front are empty, each read once per call; any write to one in this call
-- makes it "maybe not empty" (false). Most calls ask about all four and all are empty: one
-- EXISTS of the four keys answers them together, else each is read alone (the front by
-- the ZPOPMIN that would pop from it).
-- (The waiting set is not asked along: with workers waiting, which is common, the
-- EXISTS would answer "some" and each flag would cost its own command again.)
local COUNTS_EMPTY, DEAD_EMPTY, PROGRESS_EMPTY, FRONT_EMPTY = nil, nil, nil, nil  -- per call
local EMPTIES_READ = false  -- per call
local function read_empties()
  EMPTIES_READ = true
  if rcall('EXISTS', K_COUNTS, K_DEAD, K_PROGRESS, K_FRONT) == 0 then
    if COUNTS_EMPTY == nil then COUNTS_EMPTY = true end
    if DEAD_EMPTY == nil then DEAD_EMPTY = true end
    if PROGRESS_EMPTY == nil then PROGRESS_EMPTY = true end
    if FRONT_EMPTY == nil then FRONT_EMPTY = true end
  end
end
local function counts_empty()
  if COUNTS_EMPTY == nil and not EMPTIES_READ then read_empties() end
  if COUNTS_EMPTY == nil then COUNTS_EMPTY = rcall('HLEN', K_COUNTS) == 0 end
  return COUNTS_EMPTY
end
local function dead_empty()
  if DEAD_EMPTY == nil and not EMPTIES_READ then read_empties() end
  if DEAD_EMPTY == nil then DEAD_EMPTY = rcall('SCARD', K_DEAD) == 0 end
  return DEAD_EMPTY
end
local function progress_empty()
  if PROGRESS_EMPTY == nil and not EMPTIES_READ then read_empties() end
  if PROGRESS_EMPTY == nil then PROGRESS_EMPTY = rcall('EXISTS', K_PROGRESS) == 0 end
  return PROGRESS_EMPTY
end
-- True only when the front is known empty (nil: maybe not; its ZPOPMIN tells).
local function front_known_empty()
  if FRONT_EMPTY == nil and not EMPTIES_READ then read_empties() end
  return FRONT_EMPTY == true
end

-- Removes a live lease's index entries (not the lease record itself).
local function unindex(task, l)
  rcall('ZREM', K_OWNED, member(l.worker, l.winc, task))
  ck_left(task)
  rcall('ZREM', K_DEADLINES, task)
  rcall('ZREM', K_STARTED, task)
  if l.st == 'R' then
    rcall('ZREM', K_RESERVED, task)
    mincr(F.NRESERVED, -1)
  end
  mincr(F.NLEASED, -1)
end

local function end_lease(task, l, kind)
  local rec = 'E|' .. l.worker .. '|' .. l.winc .. '|' .. l.token .. '|' .. l.rs .. '|' .. kind
    .. '|' .. (l.dig or '')
  if l.backup then  -- a backup is in no index but owned, and not counted in nleased
    rcall('ZREM', K_OWNED, member(l.worker, l.winc, task))
    ck_left(task)
    rcall('HSET', K_LEASES, 'b:' .. task, rec)
    return
  end
  unindex(task, l)
  rcall('HSET', K_LEASES, task, rec)
end

-- Ends the leases a worker lists, (task, token) pairs from ARGV[first + 1] on: each one
-- it holds (with its secret, use_secret) gets its ended record (kind A | F | R) and then
-- `on_end(task, lease, token, worker, n, note)` (one of the *_one functions below, defined
-- once in the library rather than as a closure on every call); any other is a quiet
-- repeat or stale (op names it in the stale event). Returns the result per pair (C.OK,
-- C.DUP or C.STALE).
local function end_held(argv, first, n, worker, winc, kind, op, on_end, note)
  local out = {}
  for k = 1, n do
    local task, tok = argv[first + 2 * k - 1], argv[first + 2 * k]
    local l = lease_for(task, worker, winc, tok)
    if holds_secret(l, worker, winc, tok) then
      end_lease(task, l, kind)
      on_end(task, l, tok, worker, n, note)
      out[k] = C.OK
    else
      out[k] = repeat_or_stale(task, l, kind, worker, winc, tok, op)
    end
  end
  return out
end

local function to_front(task)
  FRONT_EMPTY = false
  rcall('ZADD', K_FRONT, mincr(F.FSEQ), task)
  wake_one()
end

-- Notes who failed a task (fail, task timeout), so take_leases gives it to another
-- worker first (dispatch.lua: avoided).
local function note_failer(task, worker)
  COUNTS_EMPTY = false
  rcall('HSET', K_COUNTS, 'x:' .. task, worker .. '|' .. jnow_s())
end

local function make_dead(task, why)
  rcall('SADD', K_DEAD, task)
  DEAD_EMPTY = false
  mincr(F.C_DEAD)
  event('dead', 'task', task, 'reason', why)
end

-- Counts a lease that ended without an ack; returns why the task is now dead, or nil.
-- charge: 'failure' (fail, task timeout) | 'attempt' (lost, release) | 'none'
local function charge_task(task, charge)
  local dead_reason = nil
  if charge ~= 'none' then
    COUNTS_EMPTY = false
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

-- After `l` ended without an ack: true when the task's other lease is current and carries
-- on as the task's lease (not requeued). The ending is charged as ever (a task that kills
-- whoever runs it must not kill twice as many trainers): at a cap the other lease is
-- revoked and the task is dead. A surviving backup takes the task's record (the two
-- records swap, so a repeat of the ending is still recognised) and its indexes, with a
-- task timeout from now.
local function survives(task, l, charge)
  local o = other_lease(task, l)
  if not o then return false end
  local dead_reason = charge_task(task, charge or 'none')
  if dead_reason then
    end_lease(task, o, 'V')
    mincr(F.C_REVOKED)
    event('revoked', 'task', task, 'worker', o.worker, 'reason', dead_reason)
    make_dead(task, dead_reason)
    return true
  end
  if o.backup then
    local ended = rcall('HGET', K_LEASES, task)
    rcall('HSET', K_LEASES, task, rcall('HGET', K_LEASES, 'b:' .. task))
    rcall('HSET', K_LEASES, 'b:' .. task, ended)
    rcall('ZADD', K_STARTED, jnow_s(), task)
    local dl = start_deadline()
    if dl then rcall('ZADD', K_DEADLINES, dl, task) end
    mincr(F.NLEASED)
  end
  event('carries_on', 'task', task, 'worker', o.worker)
  return true
end

-- Expire one current lease (reason: worker_lost | task_timeout), deadline on JNOW.
local function expire(task, l, reason, deadline)
  local late = JNOW - deadline
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

-- The ends end_held applies (ack, fail, release), with its arguments.
local function acked_one(task, l, tok, worker)
  rcall('SETBIT', K_DONE, task, '1')
  mincr(F.NDONE)
  local ran = NOW - (tonum(l.sinces) or NOW)
  observe('dur', ran)
  -- the median task time for backup leases: a frugal streaming median, 5 % steps (the
  -- histogram's buckets are too coarse for it, and a mean follows the stragglers)
  local d, med = ran * 1000, mnum(F.DUR_MED)
  if med <= 0 then med = d elseif d > med then med = med * 1.05 elseif d < med then
    med = med / 1.05 end
  mput(F.DUR_MED, med)
  if not counts_empty() then
    rcall('HDEL', K_COUNTS, 'f:' .. task, 'a:' .. task, 's:' .. task, 'x:' .. task)
  end
  -- a done task's progress is spent: the hash keeps only unfinished tasks (checkpoints)
  if not progress_empty() then
    ck_before(task)
    rcall('HDEL', K_PROGRESS, task)
  end
  mincr(F.C_ACKED)
  local acked = mincr(F.ACKED_JOB)
  mset_s(F.LAST_ACK, now_s())
  if acked % 20 == 0 then recompute_auto_timeout() end
  event_task('acked', task, worker, tok)
  local o = other_lease(task, l)
  if o then  -- the first ack wins: the other holder's lease is revoked (its ack is stale)
    end_lease(task, o, 'V')
    mincr(F.C_REVOKED)
    event('revoked', 'task', task, 'worker', o.worker, 'reason', 'acked_elsewhere')
  end
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
