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

-- A lease record as a table; rs / calls / attempts are the record's own strings (written
-- back as they are), round / since / call / attempt their numbers.
local function parse_lease(rec)
  if not rec then return nil end
  if string.byte(rec, 1) == 76 then  -- 'L'
    local w, wi, tok, r, st, since, call, att, dig = string.match(rec,
      '^L|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    if w then
      return {live = true, worker = w, winc = wi, token = tok, round = tonumber(r), rs = r,
              st = st, since = tonumber(since), call = tonumber(call), calls = call,
              attempt = tonumber(att), attempts = att, dig = dig}
    end
  end
  -- (a record written before lease secrets has no digest: nil, which no secret matches)
  local f = split(rec)
  if f[1] == 'L' then
    return {live = true, worker = f[2], winc = f[3], token = f[4], round = tonumber(f[5]),
            rs = f[5], st = f[6], since = tonumber(f[7]), call = tonumber(f[8]), calls = f[8],
            attempt = tonumber(f[9]), attempts = f[9], dig = f[10]}
  end
  return {live = false, worker = f[2], winc = f[3], token = f[4], round = tonumber(f[5]),
          rs = f[5], kind = f[6], dig = f[7]}
end

-- The caller's lease secret as the digest records keep: the first 16 hex digits (64
-- bits) of its SHA-1, or nil for a missing or short secret (matching no record). Hashed
-- once per call (use_secret); the secret itself is never written anywhere.
local CALLER_DIG = nil  -- per call
local function secret_digest(secret)
  if type(secret) ~= 'string' or #secret < 16 then return nil end
  return string.sub(redis.sha1hex(secret), 1, 16)
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
    local t = redis.call('TIME')
    TOKEN_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local tok = math.max(mnum(F.LAST_TOKEN) + 1, TOKEN_US)
  mput(F.LAST_TOKEN, tok)
  return fmt(tok)
end

-- The task timeout fixed at start: none, a number, or auto (10 x p99, at least 60 s,
-- once 20 tasks of the job were acked).
local function task_timeout_ms()
  local tt = mget(F.TT)
  if tt == 'none' then return 0 end
  if tt == 'auto' then return mnum(F.AUTO_TT) end
  return tonumber(tt) or 0
end

-- The deadline of a task started now (a string), or nil without a task timeout.
local DL_TT, DL_S = nil, nil  -- per call
local function start_deadline()
  local tt = task_timeout_ms()
  if tt <= 0 then return nil end
  if tt ~= DL_TT then DL_TT, DL_S = tt, fmt(JNOW + tt) end
  return DL_S
end

-- The auto task timeout: 10 x the p99 of task durations (histogram "dur"), at least 60 s.
local function recompute_auto_timeout()
  local total = tonumber(redis.call('HGET', K_HIST, 'dur:count') or '0') or 0
  local need, seen = total * 0.99, 0
  local bounds = HIST_BOUNDS
  local p99 = bounds[#bounds]
  for b = 1, #bounds do
    seen = seen + (tonumber(redis.call('HGET', K_HIST, 'dur:' .. b) or '0') or 0)
    if seen >= need then p99 = bounds[b]; break end
  end
  mset(F.AUTO_TT, fmt(math.max(60000, 10 * p99)))
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

-- Whether the counts hash (a: f: s: per task) is empty, read once per call; any write
-- to it in this call makes it "maybe not empty" (false).
local COUNTS_EMPTY = nil  -- per call
local function counts_empty()
  if COUNTS_EMPTY == nil then COUNTS_EMPTY = redis.call('HLEN', K_COUNTS) == 0 end
  return COUNTS_EMPTY
end
-- Whether the dead set is empty, read once per call; make_dead clears it.
local DEAD_EMPTY = nil  -- per call
local function dead_empty()
  if DEAD_EMPTY == nil then DEAD_EMPTY = redis.call('SCARD', K_DEAD) == 0 end
  return DEAD_EMPTY
end
-- Whether no task of this pass attempt has recorded progress, read once per call.
local PROGRESS_EMPTY = nil  -- per call
local function progress_empty()
  if PROGRESS_EMPTY == nil then PROGRESS_EMPTY = redis.call('EXISTS', K_PROGRESS) == 0 end
  return PROGRESS_EMPTY
end

-- Removes a live lease's index entries (not the lease record itself).
local function unindex(task, l)
  redis.call('ZREM', K_OWNED, member(l.worker, l.winc, task))
  redis.call('ZREM', K_DEADLINES, task)
  redis.call('ZREM', K_STARTED, task)
  if l.st == 'R' then
    redis.call('ZREM', K_RESERVED, task)
    mincr(F.NRESERVED, -1)
  end
  mincr(F.NLEASED, -1)
end

local function end_lease(task, l, kind)
  unindex(task, l)
  redis.call('HSET', K_LEASES, task, 'E|' .. l.worker .. '|' .. l.winc .. '|' .. l.token
    .. '|' .. l.rs .. '|' .. kind .. '|' .. (l.dig or ''))
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
    local l = parse_lease(redis.call('HGET', K_LEASES, task))
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
  redis.call('ZADD', K_FRONT, mincr(F.FSEQ), task)
  wake_one()
end

local function make_dead(task, why)
  redis.call('SADD', K_DEAD, task)
  DEAD_EMPTY = false
  mincr(F.C_DEAD)
  event('dead', 'task', task, 'reason', why)
end

-- A started lease that ended without an ack: count it, then dead or back to the front.
-- charge: 'failure' (fail, task timeout) | 'attempt' (lost, release) | 'none'
local function requeue(task, charge)
  local dead_reason = nil
  if charge ~= 'none' then
    COUNTS_EMPTY = false
    local a = redis.call('HINCRBY', K_COUNTS, 'a:' .. task, 1)
    if a >= mnum(F.MAXA) then dead_reason = 'max_attempts' end
    if charge == 'failure' then
      local f = redis.call('HINCRBY', K_COUNTS, 'f:' .. task, 1)
      if f >= mnum(F.MAXF) then dead_reason = 'max_failures' end
    end
  end
  if dead_reason then
    make_dead(task, dead_reason)
  else
    to_front(task)
  end
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
  requeue(task, charge)
end

-- The ends end_held applies (ack, fail, release), with its arguments.
local function acked_one(task, l, tok, worker)
  redis.call('SETBIT', K_DONE, task, '1')
  mincr(F.NDONE)
  observe('dur', NOW - l.since)
  if not counts_empty() then
    redis.call('HDEL', K_COUNTS, 'f:' .. task, 'a:' .. task, 's:' .. task)
  end
  -- a done task's progress is spent: the hash keeps only unfinished tasks (checkpoints)
  if not progress_empty() then redis.call('HDEL', K_PROGRESS, task) end
  mincr(F.C_ACKED)
  local acked = mincr(F.ACKED_JOB)
  mset(F.LAST_ACK, now_s())
  if acked % 20 == 0 then recompute_auto_timeout() end
  event_task('acked', task, worker, tok)
end

-- One failing task is charged a failure; each of a failing batch of n > 1 goes back
-- uncharged, marked solo (see fail.lua). `why` is the error text.
local function failed_one(task, _, _, worker, n, why)
  mincr(F.C_FAILED)
  if n > 1 then
    redis.call('HSET', K_COUNTS, 's:' .. task, '1')
    event('failed', 'task', task, 'worker', worker, 'error', why, 'batch', n)
    to_front(task)
  else
    redis.call('HDEL', K_COUNTS, 's:' .. task)
    event('failed', 'task', task, 'worker', worker, 'error', why)
    requeue(task, 'failure')
  end
end

local function released_one(task, l, _, worker)
  mincr(F.C_RELEASED)
  event('released', 'task', task, 'worker', worker)
  if l.st == 'S' then requeue(task, 'attempt') else requeue(task, 'none') end
end
