#!lua
-- progress: a holder records how far into its tasks it got (fenced like an ack).
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc, worker, winc, n (0..MAX_LISTED), (task, token, samples) x n, secret
--   samples: "<samples>", "<samples>:<size>" or "<samples>:<size>:<end>" (the task's
--   size in samples when the holder knows it, what tail splitting needs; the end of its
--   lease it knows, if any: lib/split.lua)
-- returns: {code, {result per task: OK | STALE}, {end per task: -1 none | -2 a pending
--   tail piece (read nothing yet) | where the holder's piece ends}, {start per task: -1 |
--   a tail piece's start}}
-- `samples` counts from the task's sample 0 (a resumed task reports start + taken) and
-- only moves the record forward. A report about a lease that is no longer the caller's
-- changes nothing; what it claims beyond the record is counted as re-read (p_reread). It
-- needs the holder's lease secret, as an ack does: the right token with another secret is
-- answered STALE and counted forged (and claims nothing re-read). A backup lease's
-- holder reports like the task's own holder, fenced by the backup's token and secret; so
-- does a split task's tail piece, whose progress goes to the split record. A holder naming
-- an end the server does not know (a split lost by a rollback) has its lease ended there.
local rcall, tonum, smatch, sfind, mmin, ltype =
  redis.call, tonumber, string.match, string.find, math.min, type
local fmt, mincr = lib.meta.fmt, lib.meta.mincr
local arg_fail, arg_id, arg_int, arg_len, arg_task, arg_token, args_bad =
  lib.args.arg_fail, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.arg_task,
  lib.args.arg_token, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local arg_secret, forged, is_forged =
  lib.secrets.arg_secret, lib.secrets.forged, lib.secrets.is_forged
local end_lease, holds_secret, lease_for =
  lib.leases.end_lease, lib.leases.holds_secret, lib.leases.lease_for
local to_front = lib.endings.to_front
local offered, split_rec = lib.pieces.offered, lib.pieces.split_rec
local reclaim = lib.reclaim.reclaim
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
-- as many reports as a heartbeat may list held tasks (a trainer's buffer may still hold
-- tasks it lost since the last flush)
local n = arg_int(ARGV[4], 'reports', 0, MAX_LISTED)
if not args_bad() and #ARGV < 4 + 3 * n then
  arg_fail('reports', 'more triples than given', ARGV[4])
  n = 0
end
for k = 1, n do
  local b = 4 + 3 * (k - 1)
  arg_task(ARGV[b + 1], 'reports task')
  arg_token(ARGV[b + 2], 'reports token')
  local sv = ARGV[b + 3]
  if ltype(sv) == 'string' and sfind(sv, ':', 1, true) then
    local a, z, e = smatch(sv, '^(%d+):(%d+):?(%d*)$')
    if not a or #a > 15 or #z > 15 or #e > 15 or tonum(z) < 1 then
      arg_fail('reports samples', 'not samples, samples:size or samples:size:end', sv)
    end
  else
    arg_int(sv, 'reports samples', 0, 9007199254740991)
  end
end
arg_secret(ARGV[5 + 3 * n])
arg_len(ARGV, 5 + 3 * n)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(LAZY_RECLAIM)  -- a worker past its deadline has lost its leases before it writes
local out, ends, starts = {}, {}, {}
for k = 1, n do
  local b = 4 + 3 * (k - 1)
  local task, tok = ARGV[b + 1], ARGV[b + 2]
  local sa, size, known = smatch(ARGV[b + 3], '^(%d+):(%d+):?(%d*)$')
  local samples = tonum(sa or ARGV[b + 3])
  -- a backup lease's holder reports under the backup's token (lease_for reads its record)
  local l = lease_for(task, worker, winc, tok)
  local cur = tonum(rcall('HGET', K_PROGRESS, task) or '0') or 0
  ends[k], starts[k] = -1, -1
  if holds_secret(l, worker, winc, tok) then
    if size and samples <= tonum(size) then rcall('HSETNX', K_LEASES, 'n:' .. task, size) end
    -- a piece of a split task (lib/split.lua): the tail's report goes to the split record
    -- (a pending tail's is answered -2: read nothing yet); while the split is pending a
    -- head's report past the split point wins (the point moves up to it, the tail's start
    -- with it) and one naming the point, or an end past it, as its known end confirms it
    -- there; once confirmed, a
    -- claim past the point is capped there (counted re-read)
    local rec, s = samples, split_rec(task)
    local upto = s and s.m or tonum(size or '')  -- where the server's record ends its piece
    if known and known ~= '' and upto and tonum(known) < upto and not l.backup then
      -- the holder honours an end short of the server's record: a split it learnt was
      -- undone (its tail handed back before it was confirmed) or lost (Redis went back to
      -- a state before it). What it read up to that end is kept; its lease ends there and
      -- the rest is leased again: re-read, never skipped (its ack is stale)
      rec = mmin(samples, tonum(known))
      if rec > cur then rcall('HSET', K_PROGRESS, task, fmt(rec)) end
      end_lease(task, l, 'V')
      mincr(F.C_REVOKED)
      event('revoked', 'task', task, 'worker', worker, 'reason', 'split_unknown')
      to_front(task)
      rec = nil
      out[k] = C.STALE
    elseif s and l.backup then
      if s.cf and samples > s.tp and samples <= s.n then
        s.tp = samples
        split_rec(task, s)
      end
      rec, ends[k], starts[k] = nil, s.cf and s.n or -2, s.tp
    elseif s then
      local honours = tonum(known or '')
      if not s.cf and honours and honours > s.m and honours >= samples then
        -- the head's reader read past the point before it learnt it and honours the end
        -- it names: the point moves up to that end, confirmed by this report (waiting
        -- for the loop's progress to get there held the tail's taker a batch or two)
        s.m = mmin(honours, s.n)
        s.tp, s.cf = s.m, true
        split_rec(task, s)
        event('split_moved', 'task', task, 'at', fmt(s.m))
        offered(task)
      elseif not s.cf and samples > s.m then
        s.m = mmin(samples, s.n)
        s.tp = s.m
        split_rec(task, s)
        event('split_moved', 'task', task, 'at', fmt(s.m))
      elseif not s.cf and known == fmt(s.m) then
        s.cf = true
        split_rec(task, s)
        offered(task)  -- a tail handed back while pending is free to lease from now
      elseif samples > s.m then
        mincr(F.P_REREAD, samples - s.m)
        rec = s.m
      end
      -- (an undone split announces no end: its holder reads on, or stops where it learnt)
      ends[k] = (s.cf or not s.td or s.hd) and s.m or -1
    end
    if rec and rec > cur then
      rcall('HSET', K_PROGRESS, task, fmt(rec))
      CALL.PROGRESS_EMPTY = false
    end
    out[k] = out[k] or C.OK
  elseif is_forged(l, worker, winc, tok) then
    forged(task, worker, tok, 'progress')
    out[k] = C.STALE
  else
    if l and l.token == tok and l.round == CALL.ROUND and samples > cur
        and rcall('GETBIT', K_DONE, task) == 0 then
      mincr(F.P_REREAD, samples - cur)
    end
    out[k] = C.STALE
  end
end
return done({C.OK, out, ends, starts})
