#!lua
-- ack: ack finished leases, start reserved ones, and lease the next, in one call.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc, worker, winc, call_no, n_acks, (task, token) x n_acks,
--       n_starts, (task, token) x n_starts, want, mode (S | R | F), expect_pass (-1 any),
--       secret
-- returns: {code, {{task, token, attempt, chunks_json, started}...}, wait_ms,
--           {pass, gen, state, reason}, {ack result per ack}, {start result per start}}
-- An ack whose (worker, token) is not the task's current lease changes nothing and is
-- counted stale; repeating the ack that just ended the lease is a quiet success. Both
-- need the holder's secret: the holder's name and token with another secret are
-- answered stale and counted forged (so is the lease half, answered like a lost
-- worker's, as in lease.lua).
-- Reads come before the checks (no write does): ids equal to the job's incarnation and to
-- the worker's record, both checked when they were written, need no second check (the
-- checks of three ids were ~10 k instructions per call, bench/HISTORY.md).
local rcall, sfind, ssub, ltype = redis.call, string.find, string.sub, type
local load_meta, mget, mincr = lib.meta.load_meta, lib.meta.mget, lib.meta.mincr
local arg_enum, arg_id, arg_int, arg_len, arg_pairs, args_bad =
  lib.args.arg_enum, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len, lib.args.arg_pairs,
  lib.args.args_bad
local event_task = lib.events.event_task
local done, jnow_s, job_info, now_s, open_job =
  lib.call.done, lib.call.jnow_s, lib.call.job_info, lib.call.now_s, lib.call.open_job
local arg_secret, forged = lib.secrets.arg_secret, lib.secrets.forged
local holds_secret, lease_rec, parse_lease, start_due =
  lib.leases.holds_secret, lib.leases.lease_rec, lib.leases.parse_lease, lib.leases.start_due
local acked_one, end_held = lib.endings.acked_one, lib.endings.end_held
local check_pass_end = lib.passes.check_pass_end
local touch_worker = lib.workers.touch_worker
local reclaim = lib.reclaim.reclaim
local lease_part = lib.dispatch.lease_part
load_meta()
local worker, winc = ARGV[2], ARGV[3]
local wrec = nil
if ltype(worker) == 'string' and worker ~= '' then wrec = rcall('HGET', K_WINFO, worker) end
if ARGV[1] ~= mget(F.INC) then arg_id(ARGV[1], 'job_inc', true) end
-- (the record's first field, up to its first '|', is exactly winc)
if not (wrec and ltype(winc) == 'string' and winc ~= ''
    and sfind(wrec, '|', 1, true) == #winc + 1 and ssub(wrec, 1, #winc) == winc) then
  worker, winc = arg_id(ARGV[2], 'worker'), arg_id(ARGV[3], 'winc')
end
local call_no = arg_int(ARGV[4], 'call_no', 0, 9007199254740991)
local i = 5
local n_acks = arg_pairs(ARGV, i, 'acks', MAX_BATCH)
local ack_args = i
i = i + 1 + 2 * n_acks
local n_starts = arg_pairs(ARGV, i, 'starts', MAX_BATCH)
local start_args = i
i = i + 1 + 2 * n_starts
local want = arg_int(ARGV[i], 'want', 0, MAX_BATCH)
local mode = arg_enum(ARGV[i + 1], 'mode', 'S R F')
local expect_pass = arg_int(ARGV[i + 2], 'expect_pass', -1, 9007199254740991)
arg_secret(ARGV[i + 3])
arg_len(ARGV, i + 3)
local bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1], true)
if err then return done({err}) end
local _, left = reclaim(LAZY_RECLAIM)
local ws = touch_worker(worker, winc, true, wrec or false, false, left)

local acks = end_held(ARGV, ack_args, n_acks, worker, winc, 'A', 'ack', acked_one)
if n_acks > 0 then check_pass_end() end

local starts = {}
for k = 1, n_starts do
  local task, tok = ARGV[start_args + 2 * k - 1], ARGV[start_args + 2 * k]
  local l = parse_lease(rcall('HGET', K_LEASES, task), worker, winc, tok)
  if holds_secret(l, worker, winc, tok) then
    if l.st == 'R' then
      rcall('HSET', K_LEASES, task,
        lease_rec(worker, winc, tok, l.rs, 'S', now_s(), l.calls, l.attempts, l.dig))
      rcall('ZREM', K_RESERVED, task)
      mincr(F.NRESERVED, -1)
      rcall('ZADD', K_STARTED, jnow_s(), task)
      start_due()
      event_task('started', task, worker, tok)
    end
    starts[k] = C.OK
  else
    starts[k] = C.STOLEN
  end
end

if ws == 'forged' and want > 0 then forged(nil, worker, nil, 'lease') end
if ws == 'lost' or ws == 'forged' then
  return done({C.REREGISTER, {}, 0, job_info(), acks, starts})
end
if ws == 'drain' then return done({C.DRAINING, {}, 0, job_info(), acks, starts}) end
local r = lease_part(worker, winc, want, call_no, mode, expect_pass)
return done({r[1], r[2], r[3], job_info(), acks, starts})
