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
-- A mixed job takes appends only as the feed of a stream source it mixes (docs/mixing.md):
-- `feed` names the source; the new tasks go into its chunks under the source's next copy
-- ids (source * 2^32 + j), the ids and the file-source record kept per source, and the
-- source's store ('mixstore': its tasks, sealed) moves in the same call; `seal` 1 seals the
-- store (n may be 0 then). An append to a job that feeds a mixed job is refused.
-- KEYS: the job's keys (keys.SCRIPT_KEYS)
-- ARGV: job_inc ('' = any), with_ids (1|0), n (0..APPEND_MAX chunks: 0 only to seal a
--       feed), source ('' = none, else 1-1024 bytes), at (the source's index of the first
--       chunk here), feed ('' = none, else a mixed job's source), seal (1|0: with feed),
--       then per chunk its id (with_ids: 1-1024 bytes) and its JSON
-- returns: {OK, tasks_added, chunks_skipped, first_task, backlog} (a feed: first_task the
--   source's task); a feed's seal alone {OK, its tasks, already sealed 1|0};
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
local rcall, mmax, mmin, mfloor, tconcat, unpk, lipairs, tonum, smatch, sformat =
  redis.call, math.max, math.min, math.floor, table.concat, unpack, ipairs, tonumber,
  string.match, string.format
local MIX_STRIDE = 4294967296  -- constant: a mixed job's copy id is source * 2^32 + task
local fmt, mget, mnum, tasks_n = lib.meta.fmt, lib.meta.mget, lib.meta.mnum, lib.meta.tasks_n
local arg_enum, arg_fail, arg_id, arg_int, arg_len, arg_text, args_bad =
  lib.args.arg_enum, lib.args.arg_fail, lib.args.arg_id, lib.args.arg_int, lib.args.arg_len,
  lib.args.arg_text, lib.args.args_bad
local event = lib.events.event
local done, now_s, open_job = lib.call.done_reads_meta, lib.call.now_s, lib.call.open_job
local live_tasks = lib.passes.live_tasks
arg_id(ARGV[1], 'job_inc', true)
local with_ids = arg_enum(ARGV[2], 'with_ids', '0 1') == '1'
local n = arg_int(ARGV[3], 'n', 0, APPEND_MAX)
local source = arg_text(ARGV[4], 'source', 1024)
local src_at = arg_int(ARGV[5], 'at', 0, 4294967295)
local feed = arg_text(ARGV[6], 'feed', 64)
local seal = arg_enum(ARGV[7], 'seal', '0 1') == '1'
if seal and feed == '' then arg_fail('seal', 'only a feed is sealed here (seal.lua)', ARGV[7]) end
if n == 0 and not seal then arg_fail('n', 'no chunk', ARGV[3]) end
local per, first_arg = 1, 8
if with_ids then per = 2 end
arg_len(ARGV, 7 + n * per)
local bad = args_bad()
if bad then return bad end
local bytes = 0
for k = 0, n - 1 do
  local at = first_arg + k * per
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
local mixed = mget(F.SHUFFLE) == 'm'
if mixed ~= (feed ~= '') then
  if mixed then
    return done({C.INVALID, 'a mixed job takes appends only to an open stream source it mixes: '
      .. 'name it (--feed SOURCE, docs/mixing.md)'})
  end
  return done({C.INVALID, 'not a mixed job: --feed names a stream source of a mixed job'})
end
if mget(F.FEEDS) then
  local tag = '{(.*)}'  -- (the job's name, in its keys' hash tag)
  local name = smatch(K_META, tag) or 'this job'
  return done({C.INVALID, name .. ' feeds mixed job \'' .. mget(F.FEEDS) .. '\': append with --feed '
    .. name .. ' to \'' .. mget(F.FEEDS) .. '\''})
end
-- a feed: its source's index, its store (tasks, sealed), its next copy id
local fi, store, fed_seal, copy0 = nil, 0, false, 0
if mixed then
  local spec = cjson.decode(mget(F.MIX))
  for i, s in lipairs(spec.sources) do if s == feed then fi = i - 1 end end
  if not fi then
    return done({C.INVALID, 'mix: ' .. feed .. ' is not a source of this mixed job (its sources: '
      .. tconcat(spec.sources, ', ') .. ')'})
  end
  if not (spec.streams and spec.streams[fi + 1]) then
    return done({C.INVALID, 'mix: source ' .. feed .. ' was not an open stream at create: it takes '
      .. 'no feed (its tasks were copied whole)'})
  end
  local got = rcall('ZMSCORE', kc('mixstore'), fmt(fi), fmt(fi) .. ':s')
  store, fed_seal = tonum(got[1] or spec.n[fi + 1]), got[2] ~= false and got[2] ~= nil
  copy0 = fi * MIX_STRIDE + store
  if fed_seal then
    if n == 0 then return done({C.OK, store, 1}) end
    return done({C.INVALID, 'mix: source ' .. feed .. ' is sealed: nothing is fed to it any more'})
  end
  if source ~= '' then source = fmt(fi) .. ':' .. source end  -- (the records are per source)
end
if mget(F.STREAM) == 'sealed' then
  return done({C.INVALID, 'the stream is sealed: nothing is appended to it any more'})
end
local appids = K_APPIDS
local idp = fi and (fmt(fi) .. ':') or ''  -- (a feed's ids are its source's)
-- the source's chunks below this went in before
local src_done = source ~= '' and tonum(rcall('HGET', K_SOURCES, source) or '0') or 0
local fresh, fresh_ids, seen, skipped = {}, {}, {}, 0
for k = 0, n - 1 do
  local at = first_arg + k * per
  local id = with_ids and ARGV[at]
  if src_at + k < src_done or (id and (seen[id] or rcall('HEXISTS', appids, idp .. id) == 1)) then
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
-- the new tasks' fields: a task id, or a feed's copy ids (10 hex digits, lib/mix.lua)
local function field(t)
  if fi then return sformat('%010x', copy0 + t) end
  return fmt(n0 + t)
end
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
if ntasks == 0 and not seal then
  note_source()
  return done({C.OK, 0, skipped, fi and store or n0, backlog})
end
local reason = mget(F.REASON) or ''
-- New tasks join a running pass only (a resend that adds nothing is answered above); a
-- rewind under way keeps its state: its seal runs the job, the new tasks past the cut's
-- cursor.
if ntasks > 0 and (CALL.STATE == 'completed'
    or (CALL.STATE == 'waiting' and reason ~= 'rewinding')) then
  local how = 'create a stream job for data that keeps coming'
  if reason == 'manual_advance' then how = '`taskq pass next` starts the next pass'
  elseif reason == 'all_dead' then how = '`taskq tasks retry` brings its dead tasks back' end
  return done({C.INVALID, 'the job is ' .. CALL.STATE .. (reason ~= '' and ' (' .. reason .. ')'
    or '') .. ': an append does not reopen it; reopen needs the job\'s owner (' .. how .. ')'})
end
local max_backlog = mnum(F.MAX_BACKLOG)
if ntasks > 0 and max_backlog > 0 and backlog + ntasks > max_backlog then
  local last = rcall('XREVRANGE', K_EVENTS, '+', '-', 'COUNT', 1)
  return done({C.FULL, 0, skipped, backlog, max_backlog, last[1] and last[1][1] or '0-0'})
end
-- the new tasks' ids are free (a record behind its tasks would overwrite none: refused)
if ntasks > 0 and rcall('HEXISTS', K_CHUNKS, field(0)) == 1 then
  return done({C.INVALID, 'task ' .. field(0) .. ' exists: the job\'s appended record is '
    .. 'behind its tasks (`taskq job audit`)'})
end
-- HSETNX, one field each: the producer's credential may add a field, never overwrite one
for t = 0, ntasks - 1 do
  rcall('HSETNX', K_CHUNKS, field(t),
    '[' .. tconcat(fresh, ',', t * cpt + 1, mmin(#fresh, (t + 1) * cpt)) .. ']')
end
if #fresh_ids > 0 then
  for i, id in lipairs(fresh_ids) do
    rcall('HSETNX', appids, idp .. id, field(mfloor((i - 1) / cpt)))
  end
  -- each task's ids (their fields in appids), for the trim that drops them with the task
  -- (trim.lua; a feed's copy, keyed by its field: lib/mixtrim.lua)
  for t = 0, ntasks - 1 do
    local names = {}
    for i = t * cpt + 1, mmin(#fresh_ids, (t + 1) * cpt) do
      names[#names + 1] = idp .. fresh_ids[i]
    end
    rcall('HSETNX', K_APPIDX, field(t), cjson.encode(names))
  end
end
note_source()
if fi then
  -- the store moves with its tasks (the charge logs it where it reads it, lib/mix.lua)
  rcall('ZADD', kc('mixstore'), store + ntasks, fmt(fi))
  if seal then rcall('ZADD', kc('mixstore'), 1, fmt(fi) .. ':s') end
  event('fed', 'source', feed, 'first', fmt(store), 'tasks', fmt(ntasks), 'skipped',
    fmt(skipped), 'sealed', seal and '1' or '0')
else
  rcall('ZADD', K_APPENDS, n0, fmt(n0) .. ':' .. now_s())
  rcall('HINCRBY', K_APPENDED, 'tasks', ntasks)
  rcall('HINCRBY', K_APPENDED, 'chunks', #fresh)
  if skipped > 0 then rcall('HINCRBY', K_APPENDED, 'dup', skipped) end
  event('appended', 'first', fmt(n0), 'tasks', fmt(ntasks), 'skipped', fmt(skipped))
end
if CALL.STATE == 'running' then
  -- one wake token per new task (a feed's seal: one, its charge may end the pass), never
  -- more than waiters (events.lua wake_one)
  local waiters = rcall('ZCARD', K_WAITING)
  if waiters > 0 then
    local tokens = {}
    for i = 1, mmin(mmax(ntasks, seal and 1 or 0), waiters, 1000) do tokens[i] = '1' end
    rcall('LPUSH', K_WAKE, unpk(tokens))
    rcall('LTRIM', K_WAKE, 0, waiters - 1)
  end
end
if fi and n == 0 then return done({C.OK, store, 0}) end
return done({C.OK, ntasks, skipped, fi and store or n0, backlog + ntasks})
