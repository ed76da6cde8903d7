#!lua
-- closed: the reaper saw a worker's heartbeat connection gone: declare the worker lost.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), worker, winc, conn id, min_quiet_ms, budget
-- returns: {code (OK | NOTHING), reclaimed}
-- Fenced: only this incarnation, only while its record still names this connection (a
-- heartbeat after a reconnect records the new one), and only when it has sent no heartbeat for
-- min_quiet_ms on the job's liveness clock (frozen through silences, so a Redis restart
-- or failover that dropped every connection at once does not count). Its leases then end
-- as any lost worker's do (reclaim: worker_lost).
local rcall, tonum, smatch = redis.call, tonumber, string.match
local fmt, mnum = lib.meta.fmt, lib.meta.mnum
local arg_id, arg_int, arg_len, arg_token, args_bad =
  lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.arg_token, lib.args.args_bad
local event = lib.events.event
local done, open_job = lib.call.done, lib.call.open_job
local due_by = lib.leases.due_by
local winfo = lib.workers.winfo
local reclaim = lib.reclaim.reclaim
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
local cid = arg_token(ARGV[4], 'conn id')
local quiet = arg_int(ARGV[5], 'min_quiet_ms', 0, 31536000000)
local budget = arg_int(ARGV[6], 'budget', 1, MAX_RECLAIM)
arg_len(ARGV, 6)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err, 0}) end
local m = worker .. '|' .. winc
local deadline = tonum(rcall('ZSCORE', K_WORKERS, m) or '')
local rec = rcall('HGET', K_WINFO, worker)
local inc, ttl_s = winfo(worker, rec or false)
-- the id of its heartbeat connection: the record's 8th field (Redis's CLIENT ID, sent by
-- the trainer; '' when unknown, see lib/workers.lua set_conn)
local conn = rec and (smatch(rec, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)') or '')
if not deadline or inc ~= winc or conn ~= cid or deadline < CALL.JNOW then
  return done({C.NOTHING, 0})
end
local ttl = tonum(ttl_s) or mnum(F.TTL)
if CALL.JNOW - (deadline - ttl) < quiet then return done({C.NOTHING, 0}) end
rcall('ZADD', K_WORKERS, 'XX', fmt(CALL.JNOW - 1), m)
due_by(CALL.JNOW - 1)  -- its leases are due now: lazy reclaims must not skip them
event('connection_closed', 'worker', worker, 'incarnation', winc, 'conn', cid)
local did = reclaim(budget, true)
return done({C.OK, did})
