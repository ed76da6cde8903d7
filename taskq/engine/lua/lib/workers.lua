-- workers.lua: worker records (winfo), liveness (touch_worker), removal.
local rcall, smatch, sfind, ssub, sbyte, tconcat =
  redis.call, string.match, string.find, string.sub, string.byte, table.concat
local fmt, mincr, mnum, split = lib.meta.fmt, lib.meta.mincr, lib.meta.mnum, lib.meta.split
local event, wait_rem = lib.events.event, lib.events.wait_rem

-- A worker's record (HASH winfo, field worker) is
-- "incarnation|ttl_ms|joined_ms|host|pid|drain|digest|conn[|witness]": its incarnation,
-- ttl (a string), drain flag and lease secret digest (use_secret; '' in a record
-- written before lease secrets), or nil when there is none (conn, witness: set_conn).
-- `rec`: the record read already in this call (false: none), unless a write since
-- (WINFO_WRITTEN) may have changed it.
local WINFO_WRITTEN = false  -- per call
local function winfo(worker, rec)
  if rec == nil or WINFO_WRITTEN then rec = rcall('HGET', K_WINFO, worker) end
  if not rec then return nil end
  -- (the separators found by plain search: a pattern walked every byte of the record
  -- through a character class, host and digest included)
  local p1 = sfind(rec, '|', 1, true)
  local p2 = p1 and sfind(rec, '|', p1 + 1, true)
  local p3 = p2 and sfind(rec, '|', p2 + 1, true)
  local p4 = p3 and sfind(rec, '|', p3 + 1, true)
  local p5 = p4 and sfind(rec, '|', p4 + 1, true)
  if not p5 then return nil end
  local p6 = sfind(rec, '|', p5 + 1, true)
  if not p6 then return ssub(rec, 1, p1 - 1), ssub(rec, p1 + 1, p2 - 1), ssub(rec, p5 + 1), '' end
  local p7 = sfind(rec, '|', p6 + 1, true)
  return ssub(rec, 1, p1 - 1), ssub(rec, p1 + 1, p2 - 1), ssub(rec, p5 + 1, p6 - 1),
    ssub(rec, p6 + 1, (p7 or 0) - 1)
end

-- Records the connection id a worker incarnation sent (a heartbeat after a reconnect
-- carries a new one); a no-op when unchanged or not its record. The first change keeps
-- the id it replaces, the connection the worker registered on, as the record's 9th field:
-- another connection of the same process, which a SIGKILL closes with the heartbeat's and
-- a CLIENT KILL of the heartbeat's leaves open (connwatch.py).
local function set_conn(worker, winc, cid)
  if cid == nil or cid == '' then return end
  local rec = rcall('HGET', K_WINFO, worker)
  if not rec then return end
  local f = split(rec)
  if f[1] ~= winc or f[8] == cid then return end
  for k = #f + 1, 7 do f[k] = '' end
  if f[9] == nil then f[9] = f[8] or '' end  -- the first change only
  f[8] = cid
  WINFO_WRITTEN = true
  rcall('HSET', K_WINFO, worker, tconcat(f, '|', 1, 9))
end

-- What a worker incarnation's loop honours of a lease, declared at register (field
-- "r:<worker>" of the leases hash: "winc|kind", absent for 'w'): 'w' whole tasks only,
-- 'r' the range [start, end) it is handed, 's' that range and an end that moves while it
-- reads (a tail split may take its task's unread end). Only 'r' and 's' are handed a
-- piece of a split task; only an 's' holder's task is split, by an 's' caller
-- (lib/split.lua, lib/dispatch.lua; docs/design.md "Tail splitting"). With `kind`,
-- records it (register).
-- The range readers not removed yet are counted (meta rangers: a field holds one
-- incarnation's kind, so the count drops when it is overwritten or removed).
local function reads_of(worker, winc, kind)
  local f = 'r:' .. worker
  if kind then
    local was = smatch(rcall('HGET', K_LEASES, f) or '', '^.*|(%a)$')
    if was then mincr(F.RANGERS, -1) end
    if kind == 'w' then
      rcall('HDEL', K_LEASES, f)
    else
      rcall('HSET', K_LEASES, f, winc .. '|' .. kind)
      mincr(F.RANGERS)
    end
    return kind
  end
  local w, k = smatch(rcall('HGET', K_LEASES, f) or '', '^(.*)|(%a)$')
  if w ~= winc then return 'w' end
  return k
end

local function remove_worker(m, kind)
  local worker, winc = smatch(m, '^(.*)|([^|]*)$')
  rcall('ZREM', K_WORKERS, m)
  wait_rem(m)
  WINFO_WRITTEN = true
  if winfo(worker) == winc then rcall('HDEL', K_WINFO, worker) end
  if reads_of(worker, winc) ~= 'w' then
    rcall('HDEL', K_LEASES, 'r:' .. worker)
    mincr(F.RANGERS, -1)
  end
  rcall('HDEL', K_LEASES, 'v:' .. worker)  -- its pace (lib/split.lua pace_of)
  event(kind, 'worker', worker, 'incarnation', winc)
end

-- The worker's state: 'ok', 'drain' (an operator asked it to leave), or 'lost' (unknown
-- incarnation, or past its deadline: it must re-register), or 'forged' when `check` and
-- the caller's secret (use_secret) is not the worker's (a forged call renews nothing).
-- `renew` (heartbeat): its deadline moves to JNOW + ttl; ZADD XX CH renews and says
-- whether the member exists in one command (0: missing, or renewed to the same score;
-- only then ZSCORE tells the two apart). Without (lease, ack: the heartbeats renew a
-- worker, docs/design.md "Two clocks") the record is the answer: a record of this
-- incarnation is a member of the workers zset (every removal deletes both), and one past
-- its deadline is left only when this call's reclaim stopped at its budget (`left`; its
-- deadline is read then): skipped, it found none due (F.DUE), else it removed them all.
-- (rec: the worker's record if the caller read it already, see winfo)
local function touch_worker(worker, winc, check, rec, renew, left)
  local m = worker .. '|' .. winc
  local inc, ttl_s, drain, dig = winfo(worker, rec)
  if inc ~= winc then return 'lost' end
  if check and not (CALL.CALLER_DIG and dig == CALL.CALLER_DIG) then
    if not rcall('ZSCORE', K_WORKERS, m) then return 'lost' end
    return 'forged'
  end
  if renew then
    -- (digits, written by register: converted by arithmetic, one strtod, not tonumber's two)
    local b = sbyte(ttl_s, 1)
    local ttl
    if b and b >= 48 and b <= 57 then ttl = ttl_s + 0 else ttl = mnum(F.TTL) end
    if rcall('ZADD', K_WORKERS, 'XX', 'CH', fmt(CALL.JNOW + ttl), m) == 0
        and not rcall('ZSCORE', K_WORKERS, m) then
      return 'lost'
    end
  elseif left then
    local deadline = rcall('ZSCORE', K_WORKERS, m)
    if not deadline or deadline + 0 < CALL.JNOW then return 'lost' end
  end
  if drain == '1' then return 'drain' end
  return 'ok'
end

-- This part's per-call state back to its start (begin(), every call).
local function reset()
  WINFO_WRITTEN = false
end

return {winfo = winfo, reads_of = reads_of, set_conn = set_conn, remove_worker = remove_worker,
  touch_worker = touch_worker, reset = reset}
