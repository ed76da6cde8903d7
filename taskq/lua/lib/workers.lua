-- workers.lua: worker records (winfo), liveness (touch_worker), removal.

-- A worker's record (HASH winfo, field worker) is
-- "incarnation|ttl_ms|joined_ms|host|pid|drain|conn": its incarnation, ttl (a string) and
-- drain flag, or nil when there is none.
local function winfo(worker)
  local rec = redis.call('HGET', K_WINFO, worker)
  if not rec then return nil end
  return string.match(rec, '^([^|]*)|([^|]*)|[^|]*|[^|]*|[^|]*|([^|]*)')
end

-- The id of the worker's heartbeat connection (the record's 7th field: Redis's
-- CLIENT ID, sent by the trainer; '' when unknown), for the reaper's closed-connection
-- check (reaper.py).
local function winfo_conn(worker)
  local rec = redis.call('HGET', K_WINFO, worker)
  if not rec then return nil end
  return string.match(rec, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)') or ''
end

-- Records the connection id a worker incarnation sent (a heartbeat after a reconnect
-- carries a new one); a no-op when unchanged or not its record.
local function set_conn(worker, winc, cid)
  if cid == nil or cid == '' then return end
  local rec = redis.call('HGET', K_WINFO, worker)
  if not rec then return end
  local f = split(rec)
  if f[1] ~= winc or f[7] == cid then return end
  for k = #f + 1, 6 do f[k] = '' end
  f[7] = cid
  redis.call('HSET', K_WINFO, worker, table.concat(f, '|', 1, 7))
end

local function remove_worker(m, kind)
  local worker, winc = string.match(m, '^(.*)|([^|]*)$')
  redis.call('ZREM', K_WORKERS, m)
  redis.call('ZREM', K_WAITING, m)
  if winfo(worker) == winc then redis.call('HDEL', K_WINFO, worker) end
  event(kind, 'worker', worker, 'incarnation', winc)
end

-- The worker's state: 'ok', or 'lost' (unknown incarnation: it must re-register).
-- Renews its liveness as any call from it is proof of life.
local function touch_worker(worker, winc)
  local m = worker .. '|' .. winc
  local deadline = redis.call('ZSCORE', K_WORKERS, m)
  if not deadline then return 'lost' end
  local inc, ttl_s, drain = winfo(worker)
  if inc ~= winc then return 'lost' end
  local ttl = tonumber(ttl_s) or mnum(F.TTL)
  redis.call('ZADD', K_WORKERS, fmt(JNOW + ttl), m)
  if drain == '1' then return 'drain' end
  return 'ok'
end
