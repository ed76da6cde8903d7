-- call.lua: one call's frame: the job's clocks, open_job (incarnation check, clock,
-- silence rule) and open_by_inc (a verb taking only job_inc: its ARGV, then open_job),
-- read_clocks (a read-only script's clocks), done (every buffered write lands before the
-- reply), job_info.
-- A call's state that several parts read lives in the table CALL (made anew on every call
-- by reset(), which begin() calls; a field not set is nil):
--   CALL.NOW   = the job's clock (server TIME in ms, or the manual clock key in tests)
--   CALL.JNOW  = NOW - offset: the liveness clock, frozen through silences (docs/design.md)
--   CALL.ROUND, CALL.STATE, CALL.EVMAX: the job's round, state and event stream cap
--   CALL.TIME_US = the server's TIME in µs, read by open_job (or next_token, on the manual
--     clock): the floor of the tokens
--   CALL.CALLER_DIG = the caller's secret's digest (secrets.lua)
--   CALL.COUNTS_EMPTY, DEAD_EMPTY, PROGRESS_EMPTY, FRONT_EMPTY, EMPTIES_READ: what this
--     call knows of those keys being empty (leases.lua counts_empty ...)
local rcall, tonum, mfloor = redis.call, tonumber, math.floor
local flush, fmt, load_meta, meta_clean, mget, mincr, mnum, mset_s =
  lib.meta.flush, lib.meta.fmt, lib.meta.load_meta, lib.meta.meta_clean, lib.meta.mget,
  lib.meta.mincr, lib.meta.mnum, lib.meta.mset_s
local flush_events, flush_hist = lib.events.flush_events, lib.events.flush_hist
local arg_id, arg_len, args_bad = lib.args.arg_id, lib.args.arg_len, lib.args.args_bad

-- NOW and JNOW as strings, made once per call (open_job sets the clocks once)
local NOW_S, JNOW_S = nil, nil  -- per call
local function now_s()
  if not NOW_S then NOW_S = fmt(CALL.NOW) end
  return NOW_S
end
local function jnow_s()
  if not JNOW_S then JNOW_S = fmt(CALL.JNOW) end
  return JNOW_S
end
-- ROUND as a string (lease records carry it), made again only when ROUND changed
local ROUND_N, ROUND_S = nil, nil  -- per call
local function round_s()
  if ROUND_N ~= CALL.ROUND then ROUND_N, ROUND_S = CALL.ROUND, fmt(CALL.ROUND) end
  return ROUND_S
end

-- Opens the job: checks the incarnation, reads the clock, applies the silence rule.
-- Returns nil when the job is usable, else a return code. Writes only 'seen'/'offset',
-- and not those when `reads_meta_only` (append: the producer's credential writes no meta
-- field, docs/security.md; the next call of the job's own verbs sees the silence, as the
-- gap since 'seen' is still there). (loaded: the caller ran load_meta already, in this call)
local function open_job(inc, loaded, reads_meta_only)
  if not loaded then load_meta() end
  local cur = mget(F.INC)
  if not cur then return C.JOB_NOT_FOUND end
  if inc ~= '' and inc ~= cur then return C.JOB_NOT_FOUND end
  if mget(F.MCLOCK) == '1' then
    CALL.NOW = tonum(rcall('GET', K_CLOCK) or '0') or 0
  else
    local t = rcall('TIME')
    local sec, us = t[1] + 0, t[2] + 0  -- (digits: one strtod each, tonumber makes two)
    CALL.NOW = sec * 1000 + mfloor(us / 1000)
    CALL.TIME_US = sec * 1000000 + us
  end
  local seen = CALL.NOW
  if mget(F.SEEN) then seen = mnum(F.SEEN) end
  local gap = CALL.NOW - seen
  -- A live worker calls at least every heartbeat interval, so a gap longer than
  -- ttl - interval could make healthy workers miss their deadline: that is a silence.
  if reads_meta_only then
    gap = 0
  elseif gap > mnum(F.TTL) - mnum(F.HBI) then
    -- Silence is the server's, not the workers': freeze the liveness clock over it.
    mincr(F.OFFSET, gap)
    rcall('XADD', K_EVENTS, 'MAXLEN', '~', CALL.EVMAX, '*', 'type', 'silence', 'gap_ms', fmt(gap))
  end
  if gap ~= 0 then mset_s(F.SEEN, now_s()) end
  CALL.JNOW = CALL.NOW - mnum(F.OFFSET)
  CALL.ROUND = mnum(F.ROUND)
  CALL.STATE = mget(F.STATE)
  CALL.EVMAX = mget(F.EVMAX) or '0'  -- a string: XADD's argument as stored
  return nil
end

-- The job's clocks as a read-only script (conns, stats) sees them, without open_job's
-- writes (the silence rule's offset is left to the next call that writes): now (ms) and
-- jnow = now - offset.
local function read_clocks()
  local now
  if rcall('HGET', K_META, N.MCLOCK) == '1' then
    now = tonum(rcall('GET', K_CLOCK) or '0') or 0
  else
    local t = rcall('TIME')
    now = tonum(t[1]) * 1000 + mfloor(tonum(t[2]) / 1000)
  end
  return now, now - (tonum(rcall('HGET', K_META, N.OFFSET) or '0') or 0)
end

-- Every script returns through done(): the buffered events, histogram counts and meta
-- writes land before the reply.
local function done(reply)
  flush_events()
  flush_hist()
  flush()
  return reply
end

-- Append's end: only its events land. It writes no meta field and observes no histogram
-- (the producer's credential may not write them, ops/acl.py), so it never reaches their
-- writes (tests/ops/test_tenants.py reads what each verb reaches); a change of meta in its
-- call is a bug, refused loudly.
local function done_reads_meta(reply)
  if not meta_clean() then error('taskq: append changed a meta field') end
  flush_events()
  return reply
end

-- The opening of a verb whose one argument is the job's incarnation (cancel, pause,
-- resume): its ARGV checked, the job opened. Returns nil when the job is usable, else the
-- reply to return.
local function open_by_inc(argv)
  arg_id(argv[1], 'job_inc', true)
  arg_len(argv, 1)
  local bad = args_bad()
  if bad then return bad end
  local err = open_job(argv[1])
  if err then return done({err}) end
  return nil
end

local function job_info()
  return {mnum(F.PASS), mnum(F.GEN), CALL.STATE, mget(F.REASON) or ''}
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  -- (one constructor naming every field, the nil ones too: the table is sized once, not
  -- grown field by field)
  CALL = {NOW = 0, JNOW = 0, ROUND = 0, STATE = '', EVMAX = '10000', TIME_US = nil,
    CALLER_DIG = nil, COUNTS_EMPTY = nil, DEAD_EMPTY = nil, PROGRESS_EMPTY = nil,
    FRONT_EMPTY = nil, EMPTIES_READ = nil}
  NOW_S, JNOW_S = nil, nil
  ROUND_N, ROUND_S = nil, nil
end

return {now_s = now_s, jnow_s = jnow_s, round_s = round_s, open_job = open_job, done = done,
  done_reads_meta = done_reads_meta, job_info = job_info, reset = reset,
  read_clocks = read_clocks, open_by_inc = open_by_inc}
