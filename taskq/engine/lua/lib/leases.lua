-- leases.lua: lease records, tokens, task timeouts, the owned / started / reserved
-- indexes, ending a lease (end_lease; end_held, endings.lua). Where the task goes then is
-- endings.lua's; whose a write is (the caller's lease secret) is secrets.lua's.
-- A lease record (HASH leases, field task) is
--   "L|worker|winc|token|round|R-or-S|since_ms|call_no|attempt|digest"  (current)
--   "E|worker|winc|token|round|A-F-R-X-S-V-U|digest"                    (just ended)
-- digest: the holder's lease secret digest (use_secret), copied from the worker record
-- at the grant so the ended record still answers the holder's repeats after the worker
-- record is gone. Tokens order leases and anyone who reads the hash sees them; only the
-- holder knows the secret behind the digest (docs/design.md, "Lease secrets").
-- A started task may also have a backup lease (dispatch.lua: take_backup), the same
-- record (with its own holder's digest) in field "b:<task>": the first ack wins and the
-- other lease is revoked; when one ends without an ack the other carries on as the task's
-- lease (survives).
local rcall, tonum, smatch, ssub, sbyte, mmax, unpk =
  redis.call, tonumber, string.match, string.sub, string.byte, math.max, unpack
local fmt, mget, mincr, mnum, mput, mput_s, mset, split =
  lib.meta.fmt, lib.meta.mget, lib.meta.mincr, lib.meta.mnum, lib.meta.mput, lib.meta.mput_s,
  lib.meta.mset, lib.meta.split
local round_s = lib.call.round_s

-- A current lease record is written here alone (the layout above): its head (holder),
-- token, middle (round, state, since, call), attempt and digest. A batch's grants share
-- head and middle (dispatch.lua: grant), so those are functions of their own.
local function lease_head(worker, winc)
  return 'L|' .. worker .. '|' .. winc .. '|'
end

local function lease_mid(rs, st, since_s, calls)
  return '|' .. rs .. '|' .. st .. '|' .. since_s .. '|' .. calls .. '|'
end

local function lease_rec(worker, winc, tok, rs, st, since_s, calls, attempts, dig)
  return lease_head(worker, winc) .. tok .. lease_mid(rs, st, since_s, calls) .. attempts
    .. '|' .. dig
end

-- A lease record as a table; rs / sinces / calls / attempts are the record's own strings
-- (written back as they are), round its number. Only the round is compared on every call,
-- so the other numbers are left as strings (tonumber where used: each conversion is a
-- strtod, bench/HISTORY.md), and the round is converted only when it is not the current one.
-- A caller that names the holder it expects (worker, winc, tok: checked ids, so no '|' in
-- them) has the record's head compared as one string when it is that holder's current
-- lease, and only the rest matched (the whole pattern was ~half of an ack's record work).
-- (into: a table to fill rather than one made, for that holder's record: a batch's acks,
-- endings.lua end_held, each used before the next; a table of 11 fields is ~4.4 k
-- instructions to make, bench/HISTORY.md)
local function parse_lease(rec, worker, winc, tok, into)
  if not rec then return nil end
  if sbyte(rec, 1) == 76 then  -- 'L'
    if tok then
      local rs = round_s()
      -- (lease_rec's head, token and round, compared, not written: one concat per ack on
      -- the hot path rather than a call of lease_head and two)
      local head = 'L|' .. worker .. '|' .. winc .. '|' .. tok .. '|' .. rs .. '|'
      if ssub(rec, 1, #head) == head then
        local st, since, call, att, dig = smatch(rec,
          '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$', #head + 1)
        if st and into then
          into.token, into.rs, into.st, into.sinces, into.calls, into.attempts, into.dig =
            tok, rs, st, since, call, att, dig
          return into
        elseif st then
          return {live = true, worker = worker, winc = winc, token = tok, round = CALL.ROUND,
                  rs = rs, st = st, sinces = since, calls = call, attempts = att, dig = dig}
        end
      end
    end
    local w, wi, tok, r, st, since, call, att, dig = smatch(rec,
      '^L|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    if w then
      local round = CALL.ROUND
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

-- Tokens only grow, even after a restart that lost writes: max(last + 1, real TIME in us).
local function next_token()
  if not CALL.TIME_US then  -- this call's TIME (open_job), else read once (the manual clock)
    local t = rcall('TIME')
    CALL.TIME_US = tonum(t[1]) * 1000000 + tonum(t[2])
  end
  local tok = mmax(mnum(F.LAST_TOKEN) + 1, CALL.TIME_US)
  local tok_s = fmt(tok)
  mput_s(F.LAST_TOKEN, tok, tok_s)
  return tok_s
end

-- A deadline (JNOW ms) is set at `ms`: reclaim's hint F.DUE stays below every deadline.
local function due_by(ms)
  if ms < mnum(F.DUE) then mput(F.DUE, ms) end
end

-- The task timeout in ms (0: none), applied from each started lease's start time (its
-- score in the started zset, the liveness clock): none, a number, or auto (10 x p99, at
-- least 60 s, once 20 tasks of the job were acked; a change applies to running tasks).
local function task_tt()
  local tt = mget(F.TT)
  if tt == 'none' then return 0 end
  if tt == 'auto' then return mnum(F.AUTO_TT) end
  return tonum(tt) or 0
end
-- A lease started now: reclaim's hint F.DUE stays below its deadline (once per call).
local DL_DONE = false  -- per call
local function start_due()
  if DL_DONE then return end
  DL_DONE = true
  local tt = task_tt()
  if tt > 0 then due_by(CALL.JNOW + tt) end
end

-- The auto task timeout: 10 x the p99 of task durations (histogram "dur"), at least 60 s.
-- (The buckets in one HMGET, their sum the count: every 20th ack reads them, and one
-- command per bucket was about 5 % of an ack's server time, bench/HISTORY.md.)
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
  local was, tt = task_tt(), mmax(60000, 10 * p99)
  mset(F.AUTO_TT, fmt(tt))
  -- the running tasks' deadlines move with it: a shorter (or a first) timeout may make
  -- one due now, so the next call's reclaim scans and sets the hint again
  if mget(F.TT) == 'auto' and (was <= 0 or tt < was) then mput(F.DUE, CALL.JNOW - 1) end
end

local function lease_is_current(l)
  return l and l.live and l.round == CALL.ROUND
end

-- True when `l` is the current lease of this worker incarnation under this token: the
-- only lease any write about a task may change.
local function holds(l, worker, winc, tok)
  return lease_is_current(l) and l.worker == worker and l.winc == winc and l.token == tok
end

-- holds(), and the caller's secret (use_secret) is the holder's: what ending or starting
-- a lease needs.
local function holds_secret(l, worker, winc, tok)
  return holds(l, worker, winc, tok) and CALL.CALLER_DIG ~= nil and l.dig == CALL.CALLER_DIG
end

local function member(worker, winc, task) return worker .. '|' .. winc .. '|' .. task end

-- The lease of `task` this worker incarnation holds or last held: the task's record, or
-- its backup record (l.backup) when that one is the worker's. Backups exist only in a pass
-- attempt that granted one (p_backups), so other calls read one record.
-- (tok: the token the caller names, if any: parse_lease's short way for its own lease)
local function lease_for(task, worker, winc, tok)
  local l = parse_lease(rcall('HGET', K_LEASES, task), worker, winc, tok)
  local mine = l and l.worker == worker and l.winc == winc
  -- (the token the caller names picks its record: a backup or a piece beside its own)
  if (mine and lease_is_current(l) and (not tok or l.token == tok))
      or mnum(F.P_BACKUPS) == 0 then return l end
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
local function read_empties()
  CALL.EMPTIES_READ = true
  if rcall('EXISTS', K_COUNTS, K_DEAD, K_PROGRESS, K_FRONT) == 0 then
    if CALL.COUNTS_EMPTY == nil then CALL.COUNTS_EMPTY = true end
    if CALL.DEAD_EMPTY == nil then CALL.DEAD_EMPTY = true end
    if CALL.PROGRESS_EMPTY == nil then CALL.PROGRESS_EMPTY = true end
    if CALL.FRONT_EMPTY == nil then CALL.FRONT_EMPTY = true end
  end
end
local function counts_empty()
  if CALL.COUNTS_EMPTY == nil and not CALL.EMPTIES_READ then read_empties() end
  if CALL.COUNTS_EMPTY == nil then CALL.COUNTS_EMPTY = rcall('HLEN', K_COUNTS) == 0 end
  return CALL.COUNTS_EMPTY
end
local function dead_empty()
  if CALL.DEAD_EMPTY == nil and not CALL.EMPTIES_READ then read_empties() end
  if CALL.DEAD_EMPTY == nil then CALL.DEAD_EMPTY = rcall('SCARD', K_DEAD) == 0 end
  return CALL.DEAD_EMPTY
end
local function progress_empty()
  if CALL.PROGRESS_EMPTY == nil and not CALL.EMPTIES_READ then read_empties() end
  if CALL.PROGRESS_EMPTY == nil then CALL.PROGRESS_EMPTY = rcall('EXISTS', K_PROGRESS) == 0 end
  return CALL.PROGRESS_EMPTY
end

-- A batch's lease writes, gathered: the records (p, the pending ones by task, which the
-- batch's own reads see first; h, the HSET pairs) and the index changes (o / s / r: owned,
-- started, reserved members removed; oa / sa / ra: (score, member) pairs added); a take's
-- grants also note their step event's lists in S / R ({tasks, tokens}, dispatch.lua
-- grant) and a batch of acks its counts and lists in acks (endings.lua acked_one), the
-- leases it ended in nl (nr of them reserved), counted once (end_held). lw_flush
-- writes them, one command each, in the order one lease's writes go (the removals, then
-- the records, then the additions); nothing reads those keys between. A batch of 16 wrote
-- them one command per lease: ~3.5 k instructions each beyond its work, bench/HISTORY.md.
local function lw_new()
  return {p = {}, h = {}, o = {}, s = {}, r = {}, oa = {}, sa = {}, ra = {}, nl = 0, nr = 0}
end
local function lw_flush(b)
  if #b.o > 0 then rcall('ZREM', K_OWNED, unpk(b.o)) end
  if #b.s > 0 then rcall('ZREM', K_STARTED, unpk(b.s)) end
  if #b.r > 0 then rcall('ZREM', K_RESERVED, unpk(b.r)) end
  if #b.h > 0 then rcall('HSET', K_LEASES, unpk(b.h)) end
  if #b.oa > 0 then rcall('ZADD', K_OWNED, unpk(b.oa)) end
  if #b.sa > 0 then rcall('ZADD', K_STARTED, unpk(b.sa)) end
  if #b.ra > 0 then rcall('ZADD', K_RESERVED, unpk(b.ra)) end
end
-- (buf: a batch's lw_new(), whose writes lw_flush makes; nil: written at once)
local function end_lease(task, l, kind, buf)
  local rec
  if buf and l == buf.into then
    -- (the batch's holder: all its records but the token alike, their two ends made once)
    if not buf.eh then
      buf.eh, buf.et = 'E|' .. l.worker .. '|' .. l.winc .. '|', '|' .. l.rs .. '|' .. kind
        .. '|' .. (l.dig or '')
    end
    rec = buf.eh .. l.token .. buf.et
  else
    rec = 'E|' .. l.worker .. '|' .. l.winc .. '|' .. l.token .. '|' .. l.rs .. '|' .. kind
      .. '|' .. (l.dig or '')
  end
  if buf and not l.backup then  -- (its counts made once, end_held)
    buf.nl = buf.nl + 1
    if l.st == 'R' then
      buf.nr = buf.nr + 1
      buf.r[#buf.r + 1] = task
    end
    if not buf.mh then buf.mh = member(l.worker, l.winc, '') end
    local o, s, h = buf.o, buf.s, buf.h
    o[#o + 1], s[#s + 1] = buf.mh .. task, task
    local n = #h
    h[n + 1], h[n + 2] = task, rec
    buf.p[task] = rec
    return
  end
  if l.backup then  -- a backup is in no index but owned, and not counted in nleased
    rcall('ZREM', K_OWNED, member(l.worker, l.winc, task))
    rcall('HSET', K_LEASES, 'b:' .. task, rec)
    return
  end
  if l.st == 'R' then mincr(F.NRESERVED, -1) end
  mincr(F.NLEASED, -1)
  -- the live lease's index entries (not the record itself)
  rcall('ZREM', K_OWNED, member(l.worker, l.winc, task))
  rcall('ZREM', K_STARTED, task)
  if l.st == 'R' then rcall('ZREM', K_RESERVED, task) end
  rcall('HSET', K_LEASES, task, rec)
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  DL_DONE = false
end

return {lease_head = lease_head, lease_mid = lease_mid, lease_rec = lease_rec,
  parse_lease = parse_lease, next_token = next_token, due_by = due_by, task_tt = task_tt,
  start_due = start_due, recompute_auto_timeout = recompute_auto_timeout,
  lease_is_current = lease_is_current, holds_secret = holds_secret, member = member,
  lease_for = lease_for, other_lease = other_lease, read_empties = read_empties,
  counts_empty = counts_empty, dead_empty = dead_empty, progress_empty = progress_empty,
  lw_new = lw_new, lw_flush = lw_flush, end_lease = end_lease, reset = reset}
