-- call.lua: one call's frame: the job's clocks, open_job (incarnation check, clock,
-- silence rule), done (every buffered write lands before the reply), job_info.
--   NOW  = the job's clock (server TIME in ms, or the manual clock key in tests)
--   JNOW = NOW - offset: the liveness clock, frozen through silences (docs/design.md)

local NOW, JNOW, ROUND, STATE = 0, 0, 0, ''  -- per call
-- the server's TIME in µs, read by open_job (or next_token, on the manual clock): the
-- floor of the tokens, else nil
local TIME_US = nil  -- per call
-- NOW and JNOW as strings, made once per call (open_job sets the clocks once)
local NOW_S, JNOW_S = nil, nil  -- per call
local function now_s()
  if not NOW_S then NOW_S = fmt(NOW) end
  return NOW_S
end
local function jnow_s()
  if not JNOW_S then JNOW_S = fmt(JNOW) end
  return JNOW_S
end
-- ROUND as a string (lease records carry it), made again only when ROUND changed
local ROUND_N, ROUND_S = nil, nil  -- per call
local function round_s()
  if ROUND_N ~= ROUND then ROUND_N, ROUND_S = ROUND, fmt(ROUND) end
  return ROUND_S
end

-- Opens the job: checks the incarnation, reads the clock, applies the silence rule.
-- Returns nil when the job is usable, else a return code. Writes only 'seen'/'offset'.
-- (loaded: the caller ran load_meta already, in this call)
local function open_job(inc, loaded)
  if not loaded then load_meta() end
  local cur = mget(F.INC)
  if not cur then return C.JOB_NOT_FOUND end
  if inc ~= '' and inc ~= cur then return C.JOB_NOT_FOUND end
  if mget(F.MCLOCK) == '1' then
    NOW = tonum(rcall('GET', K_CLOCK) or '0') or 0
  else
    local t = rcall('TIME')
    local sec, us = t[1] + 0, t[2] + 0  -- (digits: one strtod each, tonumber makes two)
    NOW = sec * 1000 + mfloor(us / 1000)
    TIME_US = sec * 1000000 + us
  end
  local seen = NOW
  if mget(F.SEEN) then seen = mnum(F.SEEN) end
  local gap = NOW - seen
  -- A live worker calls at least every heartbeat interval, so a gap longer than
  -- ttl - interval could make healthy workers miss their deadline: that is a silence.
  if gap > mnum(F.TTL) - mnum(F.HBI) then
    -- Silence is the server's, not the workers': freeze the liveness clock over it.
    mincr(F.OFFSET, gap)
    rcall('XADD', K_EVENTS, 'MAXLEN', '~', EVMAX, '*', 'type', 'silence', 'gap_ms', fmt(gap))
  end
  if gap ~= 0 then mset_s(F.SEEN, now_s()) end
  JNOW = NOW - mnum(F.OFFSET)
  ROUND = mnum(F.ROUND)
  STATE = mget(F.STATE)
  EVMAX = mget(F.EVMAX) or '0'  -- a string: XADD's argument as stored
  return nil
end

-- Every script returns through done(): the buffered events, histogram counts and meta
-- writes land before the reply.
local function done(reply)
  flush_events()
  for field, n in lpairs(HBUF) do rcall('HINCRBY', K_HIST, field, fmt(n)) end
  HBUF = {}
  flush()
  return reply
end

local function job_info()
  return {mnum(F.PASS), mnum(F.GEN), STATE, mget(F.REASON) or ''}
end
