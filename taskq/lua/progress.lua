#!lua
-- progress: a holder records how far into its tasks it got (fenced like an ack).
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, n, (task, token, samples) x n, secret
-- returns: {code, {result per task: OK | STALE}}
-- `samples` counts from the task's sample 0 (a resumed task reports start + taken) and
-- only moves the record forward. A report about a lease that is no longer the caller's
-- changes nothing; what it claims beyond the record is counted as re-read (p_reread). It
-- needs the holder's lease secret, as an ack does: the right token with another secret is
-- answered STALE and counted forged (and claims nothing re-read).
local n = uint(ARGV[4])
if not n or #ARGV ~= 5 + 3 * n then return {C.INVALID} end
if not use_secret(ARGV[5 + 3 * n]) then
  return {C.INVALID, 'secret: missing or shorter than 16 characters (a taskq client older '
    .. 'than this library? upgrade it)'}
end
for k = 1, n do
  local b = 4 + 3 * (k - 1)
  if not uint(ARGV[b + 1]) or not uint(ARGV[b + 2]) or not uint(ARGV[b + 3]) then
    return {C.INVALID}
  end
end
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(100)  -- a worker past its deadline has lost its leases before it writes
local worker, winc = ARGV[2], ARGV[3]
local out = {}
for k = 1, n do
  local b = 4 + 3 * (k - 1)
  local task, tok, samples = ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3])
  local l = parse_lease(redis.call('HGET', K_LEASES, task))
  local cur = tonumber(redis.call('HGET', K_PROGRESS, task) or '0') or 0
  if holds_secret(l, worker, winc, tok) then
    if samples > cur then
      redis.call('HSET', K_PROGRESS, task, fmt(samples))
      PROGRESS_EMPTY = false
    end
    out[k] = C.OK
  elseif is_forged(l, worker, winc, tok) then
    forged(task, worker, tok, 'progress')
    out[k] = C.STALE
  else
    if l and l.token == tok and l.round == ROUND and samples > cur
        and redis.call('GETBIT', K_DONE, task) == 0 then
      mincr(F.P_REREAD, samples - cur)
    end
    out[k] = C.STALE
  end
end
return done({C.OK, out})
