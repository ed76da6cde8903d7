#!lua
-- register: a worker incarnation joins the job.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: job_inc ('' = any), worker, winc, ttl_ms (0 = the job's), host, pid, secret
-- returns: {code, job_inc, worker_ttl_ms, heartbeat_ms, {pass, gen, state, reason}}
-- An id alive under another incarnation (a restarted pod) is declared lost at once.
-- secret: this incarnation's lease secret (at least 16 characters); only its digest is
-- kept, in the worker record, and every later write of the worker must send it.
local dig = secret_digest(ARGV[7])
if not dig then
  -- never echo what came: it may be a secret of the right kind sent in the wrong place
  return {C.INVALID, 'secret: missing or shorter than 16 characters (a taskq client '
    .. 'older than this library; upgrade it)'}
end
local err = open_job(ARGV[1])
if err then return done({err}) end
local worker, winc = ARGV[2], ARGV[3]
local ttl = tonumber(ARGV[4]) or 0
if ttl <= 0 then ttl = mnum(F.TTL) end
local old = winfo(worker)
if old and old ~= '' and old ~= winc then
  redis.call('ZADD', K_WORKERS, 'XX', fmt(JNOW - 1), worker .. '|' .. old)
end
reclaim(1000)
redis.call('HSET', K_WINFO, worker,
  winc .. '|' .. fmt(ttl) .. '|' .. fmt(NOW) .. '|' .. ARGV[5] .. '|' .. ARGV[6] .. '|0|' .. dig)
redis.call('ZADD', K_WORKERS, fmt(JNOW + ttl), worker .. '|' .. winc)
event('worker_joined', 'worker', worker, 'incarnation', winc)
return done({C.OK, mget(F.INC), fmt(ttl), mget(F.HBI), job_info()})
