-- _lib.lua: the shared part of taskq's Function library. scripts.py puts before it the
-- generated K_* key locals (keys.JOB_KEYS, set per call by set_keys), the C table of
-- return codes and hist_bucket / HIST_BOUNDS (HIST_BOUNDS_MS), and after it each
-- lua/verb-N.lua body, registered as a function that calls begin(KEYS) first.
-- Everything here is built once, at FUNCTION LOAD; the upper-case locals below that are
-- not constants are per-call state, reset by begin() (scripts.py checks it does).
-- Not an operation of its own. Conventions:
--   NOW  = the job's clock (server TIME in ms, or the manual clock key in tests)
--   JNOW = NOW - offset: the liveness clock, frozen through silences (DESIGN.md)
--   a lease record (HASH leases, field task) is
--     "L|worker|winc|token|round|R-or-S|since_ms|call_no|attempt"  (current)
--     "E|worker|winc|token|round|A-F-X"                            (just ended)

local NOW, JNOW, ROUND, STATE = 0, 0, 0, ''
-- NOW and JNOW as strings, made once per call (open_job sets the clocks once)
local NOW_S, JNOW_S = nil, nil
local function now_s()
  if not NOW_S then NOW_S = string.format('%.0f', NOW) end
  return NOW_S
end
local function jnow_s()
  if not JNOW_S then JNOW_S = string.format('%.0f', JNOW) end
  return JNOW_S
end
local EVMAX = 10000

local function fmt(n) return string.format('%.0f', n) end
-- The meta hash is read once (HGETALL: a few dozen short fields, cheaper than naming
-- them) and written once at the end of the call (flush, through done()): a script is
-- atomic, so nobody sees the difference. A counter changed in this call is kept as a
-- number in M (formatted once, in flush); NUM caches the numbers parsed from M's strings.
local M, DIRTY, NUM = {}, {}, {}
local function load_meta()
  local kv = redis.call('HGETALL', K_META)
  for i = 1, #kv, 2 do M[kv[i]] = kv[i + 1] end
end
local function mget(f)
  local v = M[f]
  if v == nil then
    v = redis.call('HGET', K_META, f)
    M[f] = v
  end
  if v == false then return nil end
  if type(v) == 'number' then return fmt(v) end
  return v
end
local function mnum(f)
  local v = M[f]
  if type(v) == 'number' then return v end
  local n = NUM[f]
  if n then return n end
  n = tonumber(mget(f) or '0') or 0
  NUM[f] = n
  return n
end
-- Sets a field to a number (formatted with %.0f when written).
local function mput(f, v)
  M[f] = v
  DIRTY[f] = true
end
local function mset(...)
  local a = {...}
  for i = 1, #a, 2 do
    local v = a[i + 1]
    if type(v) == 'number' then v = fmt(v) end
    M[a[i]] = v
    NUM[a[i]] = nil
    DIRTY[a[i]] = true
  end
end
local function mincr(f, n)
  local v = mnum(f) + (n or 1)
  M[f] = v
  DIRTY[f] = true
  return v
end
local function flush()
  local args = {}
  for f, _ in pairs(DIRTY) do
    local v = M[f]
    if type(v) == 'number' then v = fmt(v) end
    args[#args + 1] = f
    args[#args + 1] = v
  end
  if #args > 0 then redis.call('HSET', K_META, unpack(args)) end
  DIRTY = {}
end

local function split(s)
  local fields, start = {}, 1
  while true do
    local i = string.find(s, '|', start, true)
    if not i then
      fields[#fields + 1] = string.sub(s, start)
      return fields
    end
    fields[#fields + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end

-- A lease record as a table; rs / calls / attempts are the record's own strings (written
-- back as they are), round / since / call / attempt their numbers.
local function parse_lease(rec)
  if not rec then return nil end
  if string.byte(rec, 1) == 76 then  -- 'L'
    local w, wi, tok, r, st, since, call, att = string.match(rec,
      '^L|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    if w then
      return {live = true, worker = w, winc = wi, token = tok, round = tonumber(r), rs = r,
              st = st, since = tonumber(since), call = tonumber(call), calls = call,
              attempt = tonumber(att), attempts = att}
    end
  end
  local f = split(rec)
  if f[1] == 'L' then
    return {live = true, worker = f[2], winc = f[3], token = f[4], round = tonumber(f[5]),
            rs = f[5], st = f[6], since = tonumber(f[7]), call = tonumber(f[8]), calls = f[8],
            attempt = tonumber(f[9]), attempts = f[9]}
  end
  return {live = false, worker = f[2], winc = f[3], token = f[4], round = tonumber(f[5]),
          rs = f[5], kind = f[6]}
end

-- leased / acked events are gathered per call (one entry listing the tasks and tokens)
-- and written before any other event, so the stream keeps the order things happened in.
local EVBUF, EVORDER = {}, {}
local function flush_events()
  for _, kind in ipairs(EVORDER) do
    local b = EVBUF[kind]
    redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVMAX, '*', 'type', kind, 'pass', b.pass,
      'worker', b.worker, 'tasks', table.concat(b.tasks, ','),
      'tokens', table.concat(b.tokens, ','), 'count', #b.tasks)
  end
  EVBUF, EVORDER = {}, {}
end
local function event_task(kind, task, worker, token)
  local b = EVBUF[kind]
  if not b or b.worker ~= worker or b.pass ~= mget('pass') then
    flush_events()
    b = {worker = worker, pass = mget('pass'), tasks = {}, tokens = {}}
    EVBUF[kind] = b
    EVORDER[#EVORDER + 1] = kind
  end
  b.tasks[#b.tasks + 1] = task
  b.tokens[#b.tokens + 1] = token
end
local function event(kind, ...)
  if #EVORDER > 0 then flush_events() end
  redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVMAX, '*', 'type', kind, 'pass', mget('pass'), ...)
end

-- A write about a lease that is not current: a quiet success when it repeats the ending
-- this very lease got (tokens are unique), else stale: changes nothing, is counted.
local function repeat_or_stale(task, l, kind, worker, winc, tok, op)
  if l and not l.live and l.kind == kind and l.worker == worker and l.winc == winc
      and l.token == tok then
    return C.DUP
  end
  mincr('c_stale')
  mincr('p_stale')
  event('stale', 'task', task, 'worker', worker, 'token', tok, 'op', op)
  return C.STALE
end

-- Opens the job: checks the incarnation, reads the clock, applies the silence rule.
-- Returns nil when the job is usable, else a return code. Writes only 'seen'/'offset'.
local function open_job(inc)
  load_meta()
  local cur = mget('inc')
  if not cur then return C.JOB_NOT_FOUND end
  if inc ~= '' and inc ~= cur then return C.JOB_NOT_FOUND end
  if mget('mclock') == '1' then
    NOW = tonumber(redis.call('GET', K_CLOCK) or '0') or 0
  else
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local seen = tonumber(mget('seen') or '') or NOW
  local gap = NOW - seen
  -- A live worker calls at least every heartbeat interval, so a gap longer than
  -- ttl - interval could make healthy workers miss their deadline: that is a silence.
  if gap > mnum('ttl') - mnum('hbi') then
    -- Silence is the server's, not the workers': freeze the liveness clock over it.
    mincr('offset', gap)
    redis.call('XADD', K_EVENTS, 'MAXLEN', '~', EVMAX, '*', 'type', 'silence', 'gap_ms', fmt(gap))
  end
  if gap ~= 0 then mset('seen', fmt(NOW)) end
  JNOW = NOW - mnum('offset')
  ROUND = mnum('round')
  STATE = mget('state')
  EVMAX = mnum('evmax')
  return nil
end

-- Tokens only grow, even after a restart that lost writes: max(last + 1, real TIME in us).
local TOKEN_US = nil
local function next_token()
  if not TOKEN_US then
    local t = redis.call('TIME')
    TOKEN_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  local tok = math.max(mnum('last_token') + 1, TOKEN_US)
  mput('last_token', tok)
  return fmt(tok)
end

local HBUF = {}
local function observe(name, ms)
  if ms < 0 then ms = 0 end
  local bucket = name .. ':' .. hist_bucket(ms)
  HBUF[bucket] = (HBUF[bucket] or 0) + 1
  HBUF[name .. ':count'] = (HBUF[name .. ':count'] or 0) + 1
  HBUF[name .. ':sum'] = (HBUF[name .. ':sum'] or 0) + ms
end

-- Every script returns through done(): the buffered events, histogram counts and meta
-- writes land before the reply.
local function done(reply)
  flush_events()
  for field, n in pairs(HBUF) do redis.call('HINCRBY', K_HIST, field, fmt(n)) end
  HBUF = {}
  flush()
  return reply
end

-- Counted wake-ups: one token per task that became leasable, never more than waiters.
local function wake_one()
  local waiters = redis.call('ZCARD', K_WAITING)
  if waiters > 0 then
    redis.call('LPUSH', K_WAKE, '1')
    redis.call('LTRIM', K_WAKE, 0, waiters - 1)
  end
end

-- Pass and job state changes wake every waiter: one token per waiter in the list of
-- the next generation's parity; a waiter blocks on the parity after the generation
-- its last lease reply named, so a change between that reply and its wait is not missed.
local function broadcast()
  local gen = mincr('gen')
  local key = K_BCAST0
  if gen % 2 == 1 then key = K_BCAST1 end
  redis.call('DEL', key)
  local waiters = math.min(redis.call('ZCARD', K_WAITING), 1000)
  if waiters > 0 then
    local tokens = {}
    for i = 1, waiters do tokens[i] = '1' end
    redis.call('RPUSH', key, unpack(tokens))
    redis.call('PEXPIRE', key, 600000)
  end
  redis.call('DEL', K_WAKE)
end

-- The task timeout fixed at start: none, a number, or auto (10 x p99, at least 60 s,
-- once 20 tasks of the job were acked).
local function task_timeout_ms()
  local tt = mget('tt')
  if tt == 'none' then return 0 end
  if tt == 'auto' then return mnum('auto_tt') end
  return tonumber(tt) or 0
end

local function lease_is_current(l)
  return l and l.live and l.round == ROUND
end

-- True when `l` is the current lease of this worker incarnation under this token: the
-- only lease any write about a task may change.
local function holds(l, worker, winc, tok)
  return lease_is_current(l) and l.worker == worker and l.winc == winc and l.token == tok
end

local function member(worker, winc, task) return worker .. '|' .. winc .. '|' .. task end

-- Whether the counts hash (a: f: s: per task) is empty, read once per call; any write
-- to it in this call makes it "maybe not empty" (false).
local COUNTS_EMPTY = nil
local function counts_empty()
  if COUNTS_EMPTY == nil then COUNTS_EMPTY = redis.call('HLEN', K_COUNTS) == 0 end
  return COUNTS_EMPTY
end
-- Whether the dead set is empty, read once per call; make_dead clears it.
local DEAD_EMPTY = nil
local function dead_empty()
  if DEAD_EMPTY == nil then DEAD_EMPTY = redis.call('SCARD', K_DEAD) == 0 end
  return DEAD_EMPTY
end

-- Removes a live lease's index entries (not the lease record itself).
local function unindex(task, l)
  redis.call('ZREM', K_OWNED, member(l.worker, l.winc, task))
  redis.call('ZREM', K_DEADLINES, task)
  redis.call('ZREM', K_STARTED, task)
  if l.st == 'R' then
    redis.call('ZREM', K_RESERVED, task)
    mincr('nreserved', -1)
  end
  mincr('nleased', -1)
end

local function end_lease(task, l, kind)
  unindex(task, l)
  redis.call('HSET', K_LEASES, task,
    'E|' .. l.worker .. '|' .. l.winc .. '|' .. l.token .. '|' .. l.rs .. '|' .. kind)
end

-- Ends the leases a worker lists, (task, token) pairs from ARGV[first + 1] on: each one
-- it holds gets its ended record (kind A | F | R) and then `on_end(task, lease)`; any
-- other is a quiet repeat or stale (op names it in the stale event). Returns the result
-- per pair (C.OK, C.DUP or C.STALE).
local function end_held(argv, first, n, worker, winc, kind, op, on_end)
  local out = {}
  for k = 1, n do
    local task, tok = argv[first + 2 * k - 1], argv[first + 2 * k]
    local l = parse_lease(redis.call('HGET', K_LEASES, task))
    if holds(l, worker, winc, tok) then
      end_lease(task, l, kind)
      on_end(task, l, tok)
      out[k] = C.OK
    else
      out[k] = repeat_or_stale(task, l, kind, worker, winc, tok, op)
    end
  end
  return out
end

local function to_front(task)
  redis.call('ZADD', K_FRONT, mincr('fseq'), task)
  wake_one()
end

local function save_summary(kind)
  local p = mget('pass')
  local field = p
  if kind == 'reset' then field = p .. '/r' .. fmt(mnum('p_resets')) end
  local summary = {
    pass = tonumber(p), round = ROUND, state = kind,
    started_ms = mnum('pstart'), ended_ms = NOW,
    done = mnum('ndone'), dead = redis.call('SCARD', K_DEAD),
    skipped = mnum('p_skipped'), stale = mnum('p_stale'), resets = mnum('p_resets'),
    max_lateness_ms = mnum('p_maxlate'), leased = mnum('p_leased'),
    expired = mnum('p_expired'),
  }
  redis.call('HSET', K_PASSES, field, cjson.encode(summary))
  redis.call('HDEL', K_PASSES, tostring(tonumber(p) - 1000))
end

-- Starts pass p (a new round): O(1), the big keys go with UNLINK.
local function start_pass(p, kind)
  ROUND = mincr('round')
  redis.call('UNLINK', K_DONE, K_FRONT, K_OWNED, K_DEADLINES, K_RESERVED, K_STARTED)
  mset('pass', p, 'cursor', 0, 'ndone', 0, 'nleased', 0,
    'nreserved', 0, 'p_stale', 0, 'p_skipped', 0, 'p_maxlate', 0, 'p_leased', 0,
    'p_expired', 0, 'pstart', fmt(NOW), 'state', 'running', 'reason', '')
  if kind ~= 'pass_reset' then mset('p_resets', 0) end
  STATE = 'running'
  event(kind, 'round', ROUND)
  broadcast()
end

local function set_waiting(reason)
  if STATE == 'waiting' and mget('reason') == reason then return end
  mset('state', 'waiting', 'reason', reason)
  STATE = 'waiting'
  event('job_waiting', 'reason', reason)
  broadcast()
end

-- Ends the current pass (kind: completed | skipped) and moves on as configured.
local function finish_pass(kind)
  save_summary(kind)
  mset('last_pass_ms', fmt(NOW - mnum('pstart')))
  event('pass_' .. kind, 'done', mget('ndone'))
  local p = mnum('pass')
  local passes = mnum('passes')
  if passes >= 0 and p + 1 >= passes then
    ROUND = mincr('round')  -- nothing written under the last round is current any more
    mset('state', 'completed', 'reason', '', 'nleased', 0, 'nreserved', 0)
    redis.call('UNLINK', K_FRONT, K_OWNED, K_DEADLINES, K_RESERVED, K_STARTED)
    STATE = 'completed'
    event('job_completed')
    broadcast()
  elseif mget('advance') == '0' then
    set_waiting('manual_advance')
  else
    start_pass(p + 1, 'pass_started')
  end
end

-- A pass is complete when todo and leased are both empty.
local function check_pass_end()
  if STATE ~= 'running' then return end
  local live = mnum('n') - redis.call('SCARD', K_DEAD)
  if mnum('nleased') > 0 or mnum('ndone') < live then return end
  if live == 0 then
    set_waiting('all_dead')
    return
  end
  finish_pass('completed')
end

local function make_dead(task, why)
  redis.call('SADD', K_DEAD, task)
  DEAD_EMPTY = false
  mincr('c_dead')
  event('dead', 'task', task, 'reason', why)
end

-- A started lease that ended without an ack: count it, then dead or back to the front.
-- charge: 'failure' (fail, task timeout) | 'attempt' (lost, release) | 'none'
local function requeue(task, charge)
  local dead_reason = nil
  if charge ~= 'none' then
    COUNTS_EMPTY = false
    local a = redis.call('HINCRBY', K_COUNTS, 'a:' .. task, 1)
    if a >= mnum('maxa') then dead_reason = 'max_attempts' end
    if charge == 'failure' then
      local f = redis.call('HINCRBY', K_COUNTS, 'f:' .. task, 1)
      if f >= mnum('maxf') then dead_reason = 'max_failures' end
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
  if late > mnum('p_maxlate') then mset('p_maxlate', fmt(late)) end
  end_lease(task, l, 'X')
  if reason == 'worker_lost' then mincr('c_exp_wl') else mincr('c_exp_tt') end
  mincr('p_expired')
  event('expired', 'task', task, 'reason', reason, 'worker', l.worker, 'lateness_ms', fmt(late))
  local charge = 'attempt'
  if reason == 'task_timeout' then charge = 'failure' end
  if l.st == 'R' then charge = 'none' end
  requeue(task, charge)
end

-- A worker's record (HASH winfo, field worker) is
-- "incarnation|ttl_ms|joined_ms|host|pid|drain": its incarnation, ttl (a string) and
-- drain flag, or nil when there is none.
local function winfo(worker)
  local rec = redis.call('HGET', K_WINFO, worker)
  if not rec then return nil end
  return string.match(rec, '^([^|]*)|([^|]*)|[^|]*|[^|]*|[^|]*|([^|]*)')
end

local function remove_worker(m, kind)
  local worker, winc = string.match(m, '^(.*)|([^|]*)$')
  redis.call('ZREM', K_WORKERS, m)
  redis.call('ZREM', K_WAITING, m)
  if winfo(worker) == winc then redis.call('HDEL', K_WINFO, worker) end
  event(kind, 'worker', worker, 'incarnation', winc)
end

-- Reclaims what lost workers held and leases past their task timeout; at most `budget`
-- leases. Returns (reclaimed, more_left).
local function reclaim(budget)
  local did, more = 0, false
  local lost = redis.call('ZRANGEBYSCORE', K_WORKERS, '-inf', '(' .. jnow_s(),
    'WITHSCORES', 'LIMIT', 0, budget)
  for i = 1, #lost, 2 do
    local m, deadline = lost[i], tonumber(lost[i + 1])
    local room = budget - did
    if room <= 0 then more = true; break end
    local items = redis.call('ZRANGEBYLEX', K_OWNED, '[' .. m .. '|', '(' .. m .. '|\255',
      'LIMIT', 0, room)
    for _, item in ipairs(items) do
      local task = string.match(item, '|([^|]*)$')
      local l = parse_lease(redis.call('HGET', K_LEASES, task))
      if lease_is_current(l) and member(l.worker, l.winc, task) == item then
        expire(task, l, 'worker_lost', deadline)
        did = did + 1
      else
        redis.call('ZREM', K_OWNED, item)
      end
    end
    if #items < room then remove_worker(m, 'worker_lost') else more = true end
  end
  if #lost / 2 >= budget then more = true end  -- lost workers beyond the LIMIT may wait
  if did < budget then
    local limit = budget - did
    local exp = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', '(' .. jnow_s(),
      'WITHSCORES', 'LIMIT', 0, limit)
    for i = 1, #exp, 2 do
      local task = exp[i]
      local l = parse_lease(redis.call('HGET', K_LEASES, task))
      if lease_is_current(l) and l.st == 'S' then
        expire(task, l, 'task_timeout', tonumber(exp[i + 1]))
        did = did + 1
      else
        redis.call('ZREM', K_DEADLINES, task)
      end
    end
    if #exp / 2 >= limit then more = true end  -- (WITHSCORES: two entries per task)
  end
  if did > 0 then check_pass_end() end
  return did, more
end

-- The worker's state: 'ok', or 'lost' (unknown incarnation: it must re-register).
-- Renews its liveness as any call from it is proof of life.
local function touch_worker(worker, winc)
  local m = worker .. '|' .. winc
  local deadline = redis.call('ZSCORE', K_WORKERS, m)
  if not deadline then return 'lost' end
  local inc, ttl_s, drain = winfo(worker)
  if inc ~= winc then return 'lost' end
  local ttl = tonumber(ttl_s) or mnum('ttl')
  redis.call('ZADD', K_WORKERS, fmt(JNOW + ttl), m)
  if drain == '1' then return 'drain' end
  return 'ok'
end

-- The order of a pass: a seeded permutation of 0..N-1 (a 4-round Feistel network on
-- two halves of h bits, cycle-walking into range); identity without shuffle.
local function perm_fn(n)
  if mget('shuffle') ~= '1' or n <= 1 then return function(i) return i end end
  local seed = mnum('seed')
  local p = mnum('pass')
  if n == 2 then
    local flip = (seed + p) % 2
    return function(i) if flip == 1 then return 1 - i end return i end
  end
  local h = 1
  while math.pow(4, h) < n do h = h + 1 end
  local half = math.pow(2, h)
  local keys = {}
  for r = 1, 4 do keys[r] = (seed * 31 + p * 7919 + r * 104729) % 65536 end
  local function feistel(x)
    local left, right = math.floor(x / half), x % half
    for r = 1, 4 do
      local f = (right * 40503 + keys[r] * 9973 + 12345) % 65536
      f = bit.bxor(f, bit.rshift(f, 7))
      left, right = right, bit.bxor(left, f) % half
    end
    return left * half + right
  end
  return function(i)
    local x = feistel(i)
    while x >= n do x = feistel(x) end
    return x
  end
end

-- The deadline of a task started now (a string), or nil without a task timeout.
local DL_TT, DL_S = nil, nil
local function start_deadline()
  local tt = task_timeout_ms()
  if tt <= 0 then return nil end
  if tt ~= DL_TT then DL_TT, DL_S = tt, fmt(JNOW + tt) end
  return DL_S
end

-- Grants one lease on `task` to the caller; st = 'R' (reserved) or 'S' (started).
-- The reply's chunks (element 4) are filled in by take(), one HMGET per call.
local GRANTED = {}  -- the task ids (strings) granted by this take(), in order
local RS_N, RS_S, CN_N, CN_S = nil, nil, nil, nil
local function grant(task, worker, winc, call_no, st)
  local tok = next_token()
  local attempt, att_s = 1, '1'
  if not counts_empty() then
    attempt = (tonumber(redis.call('HGET', K_COUNTS, 'a:' .. task) or '0') or 0) + 1
    att_s = tostring(attempt)
  end
  if RS_N ~= ROUND then RS_N, RS_S = ROUND, tostring(ROUND) end
  if CN_N ~= call_no then CN_N, CN_S = call_no, tostring(call_no) end
  redis.call('HSET', K_LEASES, task, 'L|' .. worker .. '|' .. winc .. '|' .. tok .. '|'
    .. RS_S .. '|' .. st .. '|' .. now_s() .. '|' .. CN_S .. '|' .. att_s)
  GRANTED[#GRANTED + 1] = task
  redis.call('ZADD', K_OWNED, '0', member(worker, winc, task))
  if st == 'S' then
    redis.call('ZADD', K_STARTED, jnow_s(), task)
    local dl = start_deadline()
    if dl then redis.call('ZADD', K_DEADLINES, dl, task) end
  else
    redis.call('ZADD', K_RESERVED, now_s(), task)
    mincr('nreserved')
  end
  mincr('nleased')
  mincr('c_leased')
  mincr('p_leased')
  event_task(st == 'S' and 'leased' or 'reserved', task, worker, tok)
  return {tonumber(task), tok, attempt, false, st == 'S' and 1 or 0}
end

local function is_free(task)
  if not dead_empty() and redis.call('SISMEMBER', K_DEAD, task) == 1 then return false end
  if redis.call('GETBIT', K_DONE, task) == 1 then return false end
  local rec = redis.call('HGET', K_LEASES, task)
  -- no record, or an ended one ("E|..."): free without parsing it
  if not rec or string.byte(rec, 1) ~= 76 then return true end  -- 76: 'L'
  return not lease_is_current(parse_lease(rec))
end

-- Leases up to `want` tasks: the front first (a solo task only alone), then the
-- cursor's order; when nothing is left, steal a reserved task from another trainer.
local function take_leases(worker, winc, want, call_no, mode)
  local out = {}
  local function st()
    if mode == 'F' then
      if #out == 0 then return 'S' end
      return 'R'
    end
    return mode
  end
  local steps = 0
  local front_empty = false  -- ZPOPMIN found the front empty (nothing adds to it below)
  while #out < want and steps < 1000 do
    local popped = redis.call('ZPOPMIN', K_FRONT)
    if #popped == 0 then front_empty = true; break end
    steps = steps + 1
    local task = popped[1]
    if is_free(task) then
      local solo = not counts_empty() and redis.call('HGET', K_COUNTS, 's:' .. task) == '1'
      if solo and #out > 0 then
        redis.call('ZADD', K_FRONT, popped[2], task)
        return out
      end
      out[#out + 1] = grant(task, worker, winc, call_no, st())
      if solo then return out end
    end
  end
  local n = mnum('n')
  local cursor = mnum('cursor')
  if #out < want and cursor < n then
    local perm = perm_fn(n)
    while #out < want and cursor < n and steps < 1000 do
      local task = tostring(perm(cursor))
      cursor = cursor + 1
      steps = steps + 1
      if is_free(task) and (front_empty or redis.call('ZSCORE', K_FRONT, task) == false) then
        out[#out + 1] = grant(task, worker, winc, call_no, st())
      end
    end
    mset('cursor', cursor)
  end
  -- Only an idle trainer steals (it wants a task to start now); refilling a prefetch
  -- buffer from another trainer's reserved work would just move it back and forth.
  if #out == 0 and mode ~= 'R' and cursor >= n and mnum('nreserved') > 0 then
    local cands = redis.call('ZRANGE', K_RESERVED, 0, 9)
    for _, task in ipairs(cands) do
      local l = parse_lease(redis.call('HGET', K_LEASES, task))
      if lease_is_current(l) and l.st == 'R' and not (l.worker == worker and l.winc == winc) then
        end_lease(task, l, 'S')
        mincr('c_stolen')
        event('stolen', 'task', task, 'from', l.worker, 'by', worker)
        out[#out + 1] = grant(task, worker, winc, call_no, st())
        break
      end
    end
  end
  return out
end

local function take(worker, winc, want, call_no, mode)
  GRANTED = {}
  local out = take_leases(worker, winc, want, call_no, mode)
  if #out > 0 then
    local chunks = redis.call('HMGET', K_CHUNKS, unpack(GRANTED))
    for k, g in ipairs(out) do g[4] = chunks[k] end
  end
  return out
end

-- How long a waiter may block before lazy reclaim could give it work (ms; 0 = no bound).
local function wait_bound_ms()
  if mnum('nleased') == 0 then return 0 end
  local best = nil
  local d = redis.call('ZRANGE', K_DEADLINES, 0, 0, 'WITHSCORES')
  if #d > 0 then best = tonumber(d[2]) end
  local w = redis.call('ZRANGE', K_WORKERS, 0, 0, 'WITHSCORES')
  if #w > 0 and (not best or tonumber(w[2]) < best) then best = tonumber(w[2]) end
  if not best then return 0 end
  return math.max(1, best - JNOW + 1)
end

-- The lease half shared by lease.lua and ack.lua. Returns {code, tasks, wait_ms}.
local function lease_part(worker, winc, want, call_no, mode, expect_pass)
  local m = worker .. '|' .. winc
  if STATE == 'cancelled' then return {C.JOB_CANCELLED, {}, 0} end
  if STATE == 'completed' then return {C.JOB_COMPLETED, {}, 0} end
  if expect_pass >= 0 and expect_pass < mnum('pass') then return {C.PASS_DONE, {}, 0} end
  if expect_pass == mnum('pass') and STATE == 'waiting' and mget('reason') == 'manual_advance' then
    return {C.PASS_DONE, {}, 0}
  end
  -- expecting a later pass than the current one only happens after a rollback (a restart
  -- from an older AOF, a failover to a lagging replica): that work must be redone, and a
  -- per-pass iterator waiting for the next pass would otherwise wait for ever
  if want > 0 and STATE == 'running' and (expect_pass < 0 or expect_pass >= mnum('pass')) then
    local got = take(worker, winc, want, call_no, mode)
    if #got > 0 then
      redis.call('ZREM', K_WAITING, m)
      return {C.OK, got, 0}
    end
  end
  if want > 0 then
    redis.call('ZADD', K_WAITING, now_s(), m)
    return {C.NOTHING, {}, wait_bound_ms()}
  end
  return {C.OK, {}, 0}
end

local function job_info()
  return {mnum('pass'), mnum('gen'), STATE, mget('reason') or ''}
end

-- Every function of the library starts here: the keys of this call's job, and every
-- piece of per-call state back to its start (a library's locals outlive a call).
local function begin(keys)
  set_keys(keys)
  NOW, JNOW, ROUND, STATE = 0, 0, 0, ''
  NOW_S, JNOW_S = nil, nil
  EVMAX = 10000
  M, DIRTY, NUM = {}, {}, {}
  EVBUF, EVORDER = {}, {}
  TOKEN_US = nil
  HBUF = {}
  COUNTS_EMPTY = nil
  DEAD_EMPTY = nil
  DL_TT, DL_S = nil, nil
  GRANTED = {}
  RS_N, RS_S, CN_N, CN_S = nil, nil, nil, nil
end
