#!lua flags=no-writes
-- conns: the workers whose heartbeat connection is known, a bounded batch, read-only.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: offset (rank in the workers set), limit
-- returns: {code, heartbeat_ms, next_offset (0: the end), {{worker, winc, conn id,
--           quiet_ms, ttl_ms, witness id}...}}
-- quiet_ms is how long since the worker last beat (or registered), on the job's liveness
-- clock (frozen through silences); ttl_ms its own ttl; the witness is the connection it registered on
-- when its heartbeats go out on another ('' if none; lib/workers.lua set_conn). The
-- reaper looks these ids up with CLIENT LIST ID (connwatch.py).
local rcall, tonum, smatch = redis.call, tonumber, string.match
local fmt, mnum, split = lib.meta.fmt, lib.meta.mnum, lib.meta.split
local read_clocks = lib.call.read_clocks
local arg_int, arg_len, args_bad = lib.args.arg_int, lib.args.arg_len, lib.args.args_bad
local offset = arg_int(ARGV[1], 'offset', 0, 4294967295)
local limit = arg_int(ARGV[2], 'limit', 1, PAGE_MAX)
arg_len(ARGV, 2)
local bad = args_bad()
if bad then return bad end
if rcall('EXISTS', K_META) == 0 then return {C.JOB_NOT_FOUND} end
local _, jnow = read_clocks()
local ranked = rcall('ZRANGE', K_WORKERS, offset, offset + limit - 1, 'WITHSCORES')
local out = {}
for i = 1, #ranked, 2 do
  local worker, winc = smatch(ranked[i], '^(.*)|([^|]*)$')
  local rec = rcall('HGET', K_WINFO, worker)
  if rec then
    local f = split(rec)
    if f[1] == winc and f[8] and f[8] ~= '' then
      local ttl = tonum(f[2]) or mnum(F.TTL)
      out[#out + 1] = {worker, winc, f[8], fmt(jnow - (tonum(ranked[i + 1]) - ttl)), fmt(ttl),
        f[9] or ''}
    end
  end
end
local nxt = 0
if #ranked == 2 * limit then nxt = offset + limit end
return {C.OK, mnum(F.HBI), nxt, out}
