#!lua
-- create: flip a staged job live in one O(1) step (readers see all of it or none).
-- KEYS: the job's keys (keys.JOB_KEYS), then the staging chunks hash
-- ARGV: replace (1|0), n_tasks, then field, value pairs of the job's meta hash
-- returns: {code}
-- The chunks were written beforehand, pipelined, into the staging hash (with an EXPIRE).
local staging = KEYS[#KEYS]
local exists = redis.call('EXISTS', K_META) == 1
if exists and ARGV[1] ~= '1' then
  redis.call('UNLINK', staging)
  return done({C.JOB_EXISTS})
end
if redis.call('HLEN', staging) ~= tonumber(ARGV[2]) then
  redis.call('UNLINK', staging)
  return done({C.INVALID})
end
local last_token = redis.call('HGET', K_META, 'last_token') or '0'
local job_keys = {}
for k = 1, #KEYS - 1 do job_keys[k] = KEYS[k] end
redis.call('UNLINK', unpack(job_keys))
redis.call('RENAME', staging, K_CHUNKS)
redis.call('PERSIST', K_CHUNKS)
local fields = {}
for k = 3, #ARGV do fields[#fields + 1] = ARGV[k] end
redis.call('HSET', K_META, unpack(fields))
redis.call('HSET', K_META, 'last_token', last_token)
if redis.call('HGET', K_META, 'mclock') == '1' then redis.call('SET', K_CLOCK, 0) end
open_job('')
mset('pstart', fmt(NOW), 'created', fmt(NOW), 'seen', fmt(NOW))
event('job_created', 'tasks', ARGV[2], 'incarnation', mget('inc'))
event('pass_started', 'round', ROUND)
return done({C.OK})
