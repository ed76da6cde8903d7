#!lua flags=no-writes
-- stats: a read-only snapshot of one job, O(1) in the number of tasks.
-- KEYS: the job's keys (keys.JOB_KEYS)
-- ARGV: lease-age bucket bounds in seconds (ascending)
-- returns: {code, meta (flat field/value list), dead, workers_alive, now_ms, jnow_ms,
--           hist (flat), {started lease count older than each bound}, oldest_start_jnow}
if #ARGV > 64 then arg_fail('ARGV', 'more than 64 bounds', #ARGV) end
local bounds = {}
for k = 1, #ARGV do bounds[k] = arg_int(ARGV[k], 'bound', 0, 31536000) end
local bad = args_bad()
if bad then return bad end
if redis.call('EXISTS', K_META) == 0 then return {C.JOB_NOT_FOUND} end
local now
if redis.call('HGET', K_META, F.MCLOCK) == '1' then
  now = tonumber(redis.call('GET', K_CLOCK) or '0') or 0
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local jnow = now - (tonumber(redis.call('HGET', K_META, F.OFFSET) or '0') or 0)
local older = {}
for k = 1, #ARGV do
  older[k] = redis.call('ZCOUNT', K_STARTED, '-inf', fmt(jnow - bounds[k] * 1000))
end
local oldest = redis.call('ZRANGE', K_STARTED, 0, 0, 'WITHSCORES')
return {C.OK, redis.call('HGETALL', K_META), redis.call('SCARD', K_DEAD),
  redis.call('ZCOUNT', K_WORKERS, fmt(jnow), '+inf'), fmt(now), fmt(jnow),
  redis.call('HGETALL', K_HIST), older, oldest[2] or false}
