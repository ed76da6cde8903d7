#!lua flags=no-writes
-- stats: a read-only snapshot of one job, O(1) in the number of tasks.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: lease-age bucket bounds in seconds (ascending)
-- returns: {code, meta (flat field/value list; n, nchunks, c_appended and c_append_dup
--           again at its end, the appended record's counts added: keys.APPENDED_FIELDS),
--           dead, workers_alive, now_ms, jnow_ms, hist (flat), {started lease count older
--           than each bound}, oldest_start_jnow, tail pieces waiting beside a leased head
--           (todo beside nleased)}
local rcall, tonum, mmax, lipairs = redis.call, tonumber, math.max, ipairs
local fmt = lib.meta.fmt
local read_clocks = lib.call.read_clocks
local arg_fail, arg_int, args_bad = lib.args.arg_fail, lib.args.arg_int, lib.args.args_bad
local waiting_tails = lib.pieces.waiting_tails
if #ARGV > 64 then arg_fail('ARGV', 'more than 64 bounds', #ARGV) end
local bounds = {}
for k = 1, #ARGV do bounds[k] = arg_int(ARGV[k], 'bound', 0, 31536000) end
local bad = args_bad()
if bad then return bad end
if rcall('EXISTS', K_META) == 0 then return {C.JOB_NOT_FOUND} end
local now, jnow = read_clocks()
local older = {}
for k = 1, #ARGV do
  older[k] = rcall('ZCOUNT', K_STARTED, '-inf', fmt(jnow - bounds[k] * 1000))
end
local oldest = rcall('ZRANGE', K_STARTED, 0, 0, 'WITHSCORES')
-- tail pieces of split tasks waiting to be leased again beside their task's leased head:
-- todo, though the task is counted leased (lib/split.lua)
CALL.ROUND = lib.meta.mnum(F.ROUND)
local _, beside = waiting_tails()
local meta = rcall('HGETALL', K_META)
local own = rcall('HMGET', K_META, N.N, N.NCHUNKS, N.C_APPENDED, N.C_APPEND_DUP)
local app = rcall('HMGET', K_APPENDED, 'tasks', 'chunks', 'tasks', 'dup')
for k, name in lipairs({N.N, N.NCHUNKS, N.C_APPENDED, N.C_APPEND_DUP}) do
  if own[k] or app[k] then
    meta[#meta + 1] = name
    meta[#meta + 1] = fmt((tonum(own[k] or '0') or 0) + mmax(0, tonum(app[k] or '0') or 0))
  end
end
return {C.OK, meta, rcall('SCARD', K_DEAD),
  rcall('ZCOUNT', K_WORKERS, fmt(jnow), '+inf'), fmt(now), fmt(jnow),
  rcall('HGETALL', K_HIST), older, oldest[2] or false, beside}
