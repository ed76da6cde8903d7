#!lua
-- append: add chunks to a job as new tasks, numbered after the last one: they join the
-- current pass (after its own order: passes.lua perm_fn) and every later one. A chunk
-- whose id an append was given before is skipped, so a producer's retry adds nothing
-- twice. Grouped chunks_per_task to a task, the last group of a call shorter (as create's).
-- A source (a file: its chunks always the same, in the same order) is recorded with how
-- many of its chunks went in, from its start, in the same call as they go in; a chunk
-- below that is skipped. The record outlives the tasks' trim (their ids go with them),
-- so a producer that restarts mid-source adds nothing twice; the job keeps the last
-- SOURCES_KEEP sources appended to (docs/streams.md, "Exactly once across restarts").
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), with_ids (1|0), n (1..APPEND_MAX chunks), source ('' = none,
--       else 1-1024 bytes), at (the source's index of the first chunk here), then per
--       chunk its id (with_ids: 1-1024 bytes) and its JSON
-- returns: {OK, tasks_added, chunks_skipped, first_task, backlog};
--   {FULL, 0, chunks_skipped, backlog, max_backlog, last_event_id} when the new tasks
--   would take the backlog (live tasks not done this pass) past max_backlog: nothing
--   written, the caller waits for acks (events after that id) or gives up;
--   {INVALID, why} for a sealed stream, and for a job whose pass ended (completed, or
--   waiting at a manual boundary or with every task dead): an append never reopens a
--   job, its owner does (docs/streams.md); JOB_CANCELLED.
-- The producer's credential (ops/acl.py) may run this and nothing else, so it writes no
-- meta field (open_job reads only; the counts go to KEY appended, keys.APPENDED_FIELDS)
-- and only adds to chunks, appids and appidx (HSETNX: their fields are never overwritten);
-- every key and command it uses is one the producer's rule allows.
local rcall, mmax, mmin, mfloor, tconcat, unpk, lipairs, tonum =
  redis.call, math.max, math.min, math.floor, table.concat, unpack, ipairs, tonumber
local fmt, mget, mnum, tasks_n = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.tasks_n
local arg_enum, arg_fail, arg_id, arg_int, arg_len, arg_text, args_bad =
  lib.args.arg_enum, lib.args.arg_fail, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len,
  lib.args.arg_text, lib.args.args_bad
local event = lib.events.event
local done, now_s, open_job = lib.call.done_reads_meta, lib.call.now_s, lib.call.open_job
local live_tasks = lib.passes.live_tasks
arg_id(ARGV[1], 'job_inc', true)
local with_ids = arg_enum(ARGV[2], 'with_ids', '0 1') == '1'
local n = arg_int(ARGV[3], 'n', 1, APPEND_MAX)
local source = arg_text(ARGV[4], 'source', 1024)
local src_at = arg_int(ARGV[5], 'at', 0, 4294967295)
local per = 1
if with_ids then per = 2 end
arg_len(ARGV, 5 + n * per)
local bad = args_bad()
if bad then return bad end
local bytes = 0
for k = 0, n - 1 do
  local at = 6 + k * per
  if with_ids then
    local id = arg_text(ARGV[at], 'id', 1024)
    if id == '' then arg_fail('id', 'empty', id) end
  end
  local chunk = ARGV[at + per - 1]
  bytes = bytes + #chunk
  -- JSON only: a task is the chunks' texts joined into one JSON list
  if chunk == '' or not pcall(cjson.decode, chunk) then arg_fail('chunk', 'not JSON', chunk) end
end
if bytes > APPEND_BYTES then arg_fail('chunks', 'more than ' .. APPEND_BYTES .. ' bytes', bytes) end
bad = args_bad()
if bad then return bad end
local err = open_job(ARGV[1], false, true)
if err then return done({err, 0, 0}) end
if CALL.STATE == 'cancelled' then return done({C.JOB_CANCELLED, 0, 0}) end
if mget(F.SHUFFLE) == 'm' then
  return done({C.INVALID, 'a mixed job takes no appends: its tasks are its sources\' (docs/mixing.md)'})
end
if mget(F.STREAM) == 'sealed' then
  return done({C.INVALID, 'the stream is sealed: nothing is appended to it any more'})
end
local appids = K_APPIDS
-- the source's chunks below this went in before
local src_done = source ~= '' and tonum(rcall('HGET', K_SOURCES, source) or '0') or 0
local fresh, fresh_ids, seen, skipped = {}, {}, {}, 0
for k = 0, n - 1 do
  local at = 6 + k * per
  local id = with_ids and ARGV[at]
  if src_at + k < src_done or (id and (seen[id] or rcall('HEXISTS', appids, id) == 1)) then
    skipped = skipped + 1
  else
    fresh[#fresh + 1] = ARGV[at + per - 1]
    if id then seen[id] = true; fresh_ids[#fresh_ids + 1] = id end
  end
end
local cpt = mmax(1, mnum(F.CPT))
local ntasks = math.ceil(#fresh / cpt)
local backlog = mmax(0, live_tasks() - mnum(F.NDONE))
local n0 = tasks_n()
-- The source's record moves to the end of this call's chunks when they follow on from it
-- (a call past a gap records nothing: the chunks of the gap are not known to be in).
-- (a job made before KEY appended counted its sources in meta: the sequence goes on)
local function note_source()
  if source == '' or src_at > src_done or src_at + n <= src_done then return end
  rcall('HSET', K_SOURCES, source, fmt(src_at + n))
  local seq = rcall('HINCRBY', K_APPENDED, 'src_seq', 1) + mnum(F.SRC_SEQ)
  rcall('ZADD', K_SRCSEQ, seq, source)
  if rcall('ZCARD', K_SRCSEQ) > SOURCES_KEEP then
    local old = rcall('ZPOPMIN', K_SRCSEQ)
    if old[1] then rcall('HDEL', K_SOURCES, old[1]) end
  end
end
if ntasks == 0 then
  note_source()
  return done({C.OK, 0, skipped, n0, backlog})
end
local reason = mget(F.REASON) or ''
-- New tasks join a running pass only (a resend that adds nothing is answered above); a
-- rewind under way keeps its state: its seal runs the job, the new tasks past the cut's
-- cursor.
if CALL.STATE == 'completed' or (CALL.STATE == 'waiting' and reason ~= 'rewinding') then
  local how = 'create a stream job for data that keeps coming'
  if reason == 'manual_advance' then how = '`taskq pass next` starts the next pass'
  elseif reason == 'all_dead' then how = '`taskq tasks retry` brings its dead tasks back' end
  return done({C.INVALID, 'the job is ' .. CALL.STATE .. (reason ~= '' and ' (' .. reason .. ')'
    or '') .. ': an append does not reopen it; reopen needs the job\'s owner (' .. how .. ')'})
end
local max_backlog = mnum(F.MAX_BACKLOG)
if max_backlog > 0 and backlog + ntasks > max_backlog then
  local last = rcall('XREVRANGE', K_EVENTS, '+', '-', 'COUNT', 1)
  return done({C.FULL, 0, skipped, backlog, max_backlog, last[1] and last[1][1] or '0-0'})
end
-- the new tasks' ids are free (a record behind its tasks would overwrite none: refused)
if rcall('HEXISTS', K_CHUNKS, fmt(n0)) == 1 then
  return done({C.INVALID, 'task ' .. fmt(n0) .. ' exists: the job\'s appended record is '
    .. 'behind its tasks (`taskq job audit`)'})
end
-- HSETNX, one field each: the producer's credential may add a field, never overwrite one
for t = 0, ntasks - 1 do
  rcall('HSETNX', K_CHUNKS, fmt(n0 + t),
    '[' .. tconcat(fresh, ',', t * cpt + 1, mmin(#fresh, (t + 1) * cpt)) .. ']')
end
if #fresh_ids > 0 then
  for i, id in lipairs(fresh_ids) do
    rcall('HSETNX', appids, id, fmt(n0 + mfloor((i - 1) / cpt)))
  end
  -- each task's ids, for the trim that drops them with the task (trim.lua)
  for t = 0, ntasks - 1 do
    rcall('HSETNX', K_APPIDX, fmt(n0 + t),
      cjson.encode({unpk(fresh_ids, t * cpt + 1, mmin(#fresh_ids, (t + 1) * cpt))}))
  end
end
note_source()
rcall('ZADD', K_APPENDS, n0, fmt(n0) .. ':' .. now_s())
rcall('HINCRBY', K_APPENDED, 'tasks', ntasks)
rcall('HINCRBY', K_APPENDED, 'chunks', #fresh)
if skipped > 0 then rcall('HINCRBY', K_APPENDED, 'dup', skipped) end
event('appended', 'first', fmt(n0), 'tasks', fmt(ntasks), 'skipped', fmt(skipped))
if CALL.STATE == 'running' then
  -- one wake token per new task, never more than waiters (events.lua wake_one)
  local waiters = rcall('ZCARD', K_WAITING)
  if waiters > 0 then
    local tokens = {}
    for i = 1, mmin(ntasks, waiters, 1000) do tokens[i] = '1' end
    rcall('LPUSH', K_WAKE, unpk(tokens))
    rcall('LTRIM', K_WAKE, 0, waiters - 1)
  end
end
return done({C.OK, ntasks, skipped, n0, backlog + ntasks})
