#!lua
-- progress: a holder records how far into its tasks it got (fenced like an ack).
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc, worker, winc, n (0..MAX_LISTED), (task, token, samples) x n, secret
-- returns: {code, {result per task: OK | STALE}}
-- `samples` counts from the task's sample 0 (a resumed task reports start + taken) and
-- only moves the record forward. A report about a lease that is no longer the caller's
-- changes nothing; what it claims beyond the record is counted as re-read (p_reread). It
-- needs the holder's lease secret, as an ack does: the right token with another secret is
-- answered STALE and counted forged (and claims nothing re-read). A backup lease's
-- holder reports like the task's own holder, fenced by the backup's token and secret.
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
  arg_int(ARGV[b + 3], 'reports samples', 0, 9007199254740991)
end
arg_secret(ARGV[5 + 3 * n])
arg_len(ARGV, 5 + 3 * n)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
reclaim(LAZY_RECLAIM)  -- a worker past its deadline has lost its leases before it writes
local out = {}
for k = 1, n do
  local b = 4 + 3 * (k - 1)
  local task, tok, samples = ARGV[b + 1], ARGV[b + 2], tonum(ARGV[b + 3])
  -- a backup lease's holder reports under the backup's token (lease_for reads its record)
  local l = lease_for(task, worker, winc)
  local cur = tonum(rcall('HGET', K_PROGRESS, task) or '0') or 0
  if holds_secret(l, worker, winc, tok) then
    if samples > cur then
      rcall('HSET', K_PROGRESS, task, fmt(samples))
      PROGRESS_EMPTY = false
    end
    out[k] = C.OK
  elseif is_forged(l, worker, winc, tok) then
    forged(task, worker, tok, 'progress')
    out[k] = C.STALE
  else
    if l and l.token == tok and l.round == ROUND and samples > cur
        and rcall('GETBIT', K_DONE, task) == 0 then
      mincr(F.P_REREAD, samples - cur)
    end
    out[k] = C.STALE
  end
end
return done({C.OK, out})
