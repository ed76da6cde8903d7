#!lua
-- register: a worker incarnation joins the job.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), worker, winc, ttl_ms (0 = the job's), host, pid, secret
--       [, conn id [, reads]]
--   reads: what the worker's loop honours of a lease (lib/workers.lua reads_of): 'w' (the
--   default) whole tasks only; 'r' the range [start, end) it is handed; 's' that range
--   and an end that moves while it reads (its own tasks may be split)
-- returns: {code, job_inc, worker_ttl_ms, heartbeat_ms, {pass, gen, state, reason},
--   sample order ('chunks' or '' the chunks' order, 'shuffled'), the job's seed, mix}
--   (mix: a mixed job's sources, meta 'mix', so its trainers name each task's source; '')
-- An id alive under another incarnation (a restarted pod) is declared lost at once.
-- secret: this incarnation's lease secret (at least 16 characters); only its digest is
-- kept, in the worker record, and every later write of the worker must send it.
local rcall = redis.call
local fmt, mget, mnum, pad_meta = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.pad_meta
local arg_enum, arg_id, arg_int, arg_len, arg_opt_conn, args_bad =
  lib.args.arg_enum, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.arg_opt_conn,
  lib.args.args_bad
local event = lib.events.event
local done, job_info, open_job = lib.call.done, lib.call.job_info, lib.call.open_job
local arg_secret = lib.secrets.arg_secret
local due_by = lib.leases.due_by
local winfo, reads_of = lib.workers.winfo, lib.workers.reads_of
local reclaim = lib.reclaim.reclaim
arg_id(ARGV[1], 'job_inc', true)
local worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
local ttl = arg_int(ARGV[4], 'ttl_ms', 0, 31536000000)
local host = arg_id(ARGV[5], 'host', true)
local pid = arg_int(ARGV[6], 'pid', 0, 4294967295)
local dig = arg_secret(ARGV[7])
local reads = 'w'
if #ARGV >= 9 then
  reads = arg_enum(ARGV[9], 'reads', 'w r s')
  arg_len(ARGV, 9)
end
local conn = arg_opt_conn({unpack(ARGV, 1, 8)}, 8)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1])
if err then return done({err}) end
if ttl <= 0 then ttl = mnum(F.TTL) end
pad_meta()
local old = winfo(worker)
if old and old ~= '' and old ~= winc then
  rcall('ZADD', K_WORKERS, 'XX', fmt(CALL.JNOW - 1), worker .. '|' .. old)
  due_by(CALL.JNOW - 1)  -- its leases are due now: lazy reclaims must not skip them
end
reclaim(MAX_RECLAIM, true)
rcall('HSET', K_WINFO, worker,
  winc .. '|' .. fmt(ttl) .. '|' .. fmt(CALL.NOW) .. '|' .. host .. '|' .. fmt(pid) .. '|0|'
    .. dig .. '|' .. conn)
rcall('ZADD', K_WORKERS, fmt(CALL.JNOW + ttl), worker .. '|' .. winc)
due_by(CALL.JNOW + ttl)
reads_of(worker, winc, reads)
event('worker_joined', 'worker', worker, 'incarnation', winc)
return done({C.OK, mget(F.INC), fmt(ttl), mget(F.HBI), job_info(), mget(F.SORDER) or '',
  mget(F.SEED_FULL) or '0', mget(F.MIX) or ''})
