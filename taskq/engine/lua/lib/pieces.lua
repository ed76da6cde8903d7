-- pieces.lua: the pieces of a split task, the pass attempt's record of its work (split.lua
-- makes a split; this part keeps what it made). A split task's pieces are the head
-- [0, m) (the holder's lease, field <task>, its progress in the progress hash) and the
-- tail [m, n) (its own fenced lease in field "b:<task>", the backup slot: a task is split
-- or backed up, never both; its own progress and ack). The record, field "s:<task>" of the
-- leases hash, is
--   "round|m|n|head_acked|tail_acked|tail_progress|confirmed"
-- under the attempt's round (attempt_s: kept through the job's completion, which a retry
-- reopens); nothing in the attempt drops it: a death keeps each piece as it is
-- (split_dead), a retry brings back exactly the pieces not acked (retried), a checkpoint
-- cuts it (cut_splits) and a rewind restores it (restore_split; a dead task's pieces
-- dead), a whole-task reader may undo a split whose tail read nothing (whole_ok), the
-- audit reads it (integrity.split_check). A tail waiting to be leased again is among the
-- orphans (field "s:orph"), offered from a time and, for a heartbeat, to the worker whose
-- call made its split (field "o:<task>"). docs/design.md, "Tail splitting".
local rcall, tonum, smatch, sfind, ssub, mmin, tconcat, lipairs =
  redis.call, tonumber, string.match, string.find, string.sub, math.min, table.concat, ipairs
local fmt, mget, mincr, mnum = lib.meta.fmt, lib.meta.mget, lib.meta.mincr, lib.meta.mnum
local event, wake_one = lib.events.event, lib.events.wake_one
local round_s = lib.call.round_s
local dead_empty, lease_is_current, parse_lease =
  lib.leases.dead_empty, lib.leases.lease_is_current, lib.leases.parse_lease
-- A tail piece whose head is acked stands for its task (since: its lease's start, NOW ms)
-- in nleased and in the started index, where the reaper's task timeout finds it
-- (reclaim.lua); since nil: it no longer does (its lease ended).
local function tail_stands(task, since)
  if since then
    mincr(F.NLEASED)
    rcall('ZADD', K_STARTED, mmin(CALL.JNOW, since - mnum(F.OFFSET)), task)
  else
    mincr(F.NLEASED, -1)
    rcall('ZREM', K_STARTED, task)
  end
end

-- The round the pass attempt's pieces are recorded under: the current one, or the one
-- the job completed in (meta sround: its completion moved the round to fence the leases,
-- while a retry reopens that attempt, whose pieces stand).
local function attempt_s()
  local s = mget(F.SROUND)
  if s and s ~= '' then return s end
  return round_s()
end

-- Whether the task is dead (a dead task's pieces are in no lease: a retry brings them
-- back).
local function is_dead(task)
  return not dead_empty() and rcall('SISMEMBER', K_DEAD, task) == 1
end

-- The task's split record of this pass attempt, or nil (one HGET, only in a pass attempt that
-- granted a backup or a piece); with `s`, writes it.
local function split_rec(task, s)
  if s then
    -- a confirmed split point at the task's end leaves the tail nothing: it is acked by
    -- construction (an empty piece is never leased; the head's ack completes the task)
    if s.cf and s.m >= s.n then s.td = true end
    rcall('HSET', K_LEASES, 's:' .. task, attempt_s() .. '|' .. fmt(s.m) .. '|' .. fmt(s.n)
      .. '|' .. (s.hd and '1' or '0') .. '|' .. (s.td and '1' or '0') .. '|' .. fmt(s.tp)
      .. '|' .. (s.cf and '1' or '0'))
    return s
  end
  if mnum(F.P_BACKUPS) == 0 then return nil end
  local rec = rcall('HGET', K_LEASES, 's:' .. task)
  if not rec then return nil end
  local r, m, n, hd, td, tp, cf = smatch(rec,
    '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  if not r or r ~= attempt_s() then return nil end
  return {m = tonum(m), n = tonum(n), hd = hd == '1', td = td == '1', tp = tonum(tp),
          cf = cf == '1'}
end

-- The tasks split in this round (field "s:all": "round|task task ...", at most MAX_SPLITS,
-- what a checkpoint's cut reads: cut_splits); with `task`, adds it. Returns the count
-- and the list's body.
local function split_list(task)
  local rec = rcall('HGET', K_LEASES, 's:all')
  local r, body = smatch(rec or '', '^([^|]*)|(.*)$')
  if r ~= attempt_s() then body = '' end
  local count = 0
  for _ in string.gmatch(body, '%d+') do count = count + 1 end
  if task then
    body = body == '' and task or body .. ' ' .. task
    count = count + 1
    rcall('HSET', K_LEASES, 's:all', attempt_s() .. '|' .. body)
  end
  return count, body
end

-- The orphaned tail pieces of this round (field "s:orph": "round|task task ..."): the
-- first ten as a list, and the rest as they are written (bounded work per call, however
-- many are orphaned); with `list` (and `rest`), writes them.
local function split_orphans(list, rest)
  if list then
    local body = tconcat(list, ' ')
    if rest and rest ~= '' then body = body == '' and rest or body .. ' ' .. rest end
    rcall('HSET', K_LEASES, 's:orph', attempt_s() .. '|' .. body)
    return list
  end
  local out = {}
  local rec = rcall('HGET', K_LEASES, 's:orph')
  if not rec then return out, '' end
  local r, body = smatch(rec, '^([^|]*)|(.*)$')
  if r ~= attempt_s() then return out, '' end
  local pos = 1
  for _ = 1, 10 do
    local a, b = sfind(body, '%d+', pos)
    if not a then break end
    out[#out + 1] = ssub(body, a, b)
    pos = b + 1
  end
  return out, smatch(ssub(body, pos), '^ *(.-) *$')
end

-- The tail pieces waiting among the orphans to be leased again (stale entries left out,
-- each task once; at most MAX_SPLITS looked at), for the readers (stats.lua, peek.lua):
-- {task ids}, and of them how many are beside a current head lease (their task is
-- counted leased: todo beside nleased). Read-only.
local function waiting_tails()
  local ids, beside = {}, 0
  if mnum(F.P_BACKUPS) == 0 then return ids, beside end
  local rec = rcall('HGET', K_LEASES, 's:orph')
  local r, body = smatch(rec or '', '^([^|]*)|(.*)$')
  if r ~= attempt_s() then return ids, beside end
  local seen, cand = {}, {}
  for t in string.gmatch(body, '%d+') do
    if not seen[t] then
      seen[t] = true
      cand[#cand + 1] = t
      if #cand >= MAX_SPLITS then break end
    end
  end
  for _, t in lipairs(cand) do
    local sp = split_rec(t)
    -- (a pending one is no todo: the head's holder may still read the whole task)
    if sp and not sp.td and sp.cf and not is_dead(t)
        and not lease_is_current(parse_lease(rcall('HGET', K_LEASES, 'b:' .. t))) then
      ids[#ids + 1] = t
      if lease_is_current(parse_lease(rcall('HGET', K_LEASES, t))) then beside = beside + 1 end
    end
  end
  return ids, beside
end

-- A tail piece's offer (field "o:<task>": "JNOW ms|claimant"): when it was offered
-- (handed back, or its split confirmed: what left_to_others counts from), and the worker
-- whose lease call made its split ('' none: it was handed back or retried), to which the
-- tail is left for a heartbeat interval from the offer (left_to_claimant).
local function offer_of(task)
  local at, who = smatch(rcall('HGET', K_LEASES, 'o:' .. task) or '', '^(%d*)|?(.*)$')
  return tonum(at or '') or 0, who or ''
end

-- A tail piece is free to lease from now: a waiter is woken. With `claimant` (a worker,
-- or '' for none) its claim is set, else kept (a confirmation: progress.lua, split_ended).
local function offered(task, claimant)
  if claimant == nil then
    local _, who = offer_of(task)
    claimant = who
  end
  rcall('HSET', K_LEASES, 'o:' .. task, fmt(CALL.JNOW) .. '|' .. claimant)
  wake_one()
end

-- A tail piece goes among the orphans, which take_split leases once its split is
-- confirmed: handed back or retried (no claimant: whoever asks next), or a split just
-- made by `claimant`'s lease call (pending: offered when confirmed).
local function orphan(task, claimant)
  if claimant then
    rcall('HSET', K_LEASES, 'o:' .. task, fmt(CALL.JNOW) .. '|' .. claimant)
  else
    offered(task, '')
  end
  local orph, rest = split_orphans()
  if rest == '' then orph[#orph + 1] = task else rest = rest .. ' ' .. task end
  split_orphans(orph, rest)
end

-- A confirmed tail whose split another worker's lease call made is left to that worker
-- for a heartbeat interval from its offer (it asked first, and comes back within that
-- bound: take_split), so the head's holder finishing its head does not take its own tail
-- from under an idle trainer. Returns when the caller may take it (JNOW ms), or nil: now.
local function left_to_claimant(t, worker)
  local at, who = offer_of(t)
  if who == '' or who == worker then return nil end
  at = at + mnum(F.HBI)
  if at <= CALL.JNOW then return nil end
  return at
end

-- Whether a caller that reads whole tasks only (workers.lua reads_of 'w') may lease
-- `task` from the front: yes when it is not a head piece (no split, or its point at the
-- task's end), or when its tail read nothing and nobody holds it (an orphan at its split
-- point, not acked): then the split is undone here, the tail's orphan entry goes stale
-- and the head's lease covers the task to its end (the record says so: point and tail
-- progress at n, the empty tail acked by construction, confirmed). Else no: the head
-- piece waits for a loop that reads ranges. A dead task's pieces are never undone (it is
-- leased by nobody; a retry brings back exactly its pieces not acked).
local function whole_ok(task)
  local s = split_rec(task)
  if not s or s.m >= s.n then return true end
  if s.hd or s.td or s.tp > s.m or is_dead(task)
      or lease_is_current(parse_lease(rcall('HGET', K_LEASES, 'b:' .. task))) then
    return false
  end
  s.m, s.tp, s.td, s.cf = s.n, s.n, true, true
  split_rec(task, s)
  event('split_undone', 'task', task)
  return true
end

-- With no range reader registered (meta rangers, workers.lua reads_of), a caller that
-- reads whole tasks only may lease `task`, a head piece whose tail was taken (acked, or
-- read in part) and is not leased, whole: the pass would otherwise wait for ever for a
-- range reader. The split is undone as in whole_ok; what the tail read is read again,
-- counted re-read (p_reread). A dead task's pieces never (a retry brings them back).
local function whole_anyway(task)
  if mnum(F.RANGERS) > 0 then return false end
  local s = split_rec(task)
  if not s or s.hd or is_dead(task)
      or lease_is_current(parse_lease(rcall('HGET', K_LEASES, 'b:' .. task))) then
    return false
  end
  local again = (s.td and s.n or s.tp) - s.m
  s.m, s.tp, s.td, s.cf = s.n, s.n, true, true
  split_rec(task, s)
  if again > 0 then mincr(F.P_REREAD, again) end
  event('split_undone', 'task', task, 'reread', fmt(again))
  return true
end

-- A split task died: its pieces stay as they are (acked or not, each with its progress:
-- the head's in the progress hash, the tail's in the record), so a retry brings back
-- exactly the pieces not acked (retried). A split still pending is confirmed: the head's
-- lease ended without an ack (its progress never passes the point while pending) and the
-- tail's read nothing.
local function split_dead(task)
  local s = split_rec(task)
  if s and not s.cf then
    s.cf = true
    split_rec(task, s)
  end
end

-- Where a retried task's pieces go: a tail not acked to the orphans (from its own
-- progress); returns whether the head goes to the front (not acked, or not split: true).
local function retried(task)
  local s = split_rec(task)
  if not s then return true end
  if not s.td then orphan(task) end
  return not s.hd
end

-- A checkpoint's cut of this round's splits: {field, value} pairs for its progress copy,
-- "s<task>" = "m/n/head acked/tail acked/tail progress", of each confirmed split of a task
-- not done (a pending one's tail read nothing: the head's progress says it all).
local function cut_splits()
  local out = {}
  if mnum(F.P_BACKUPS) == 0 then return out end
  local _, body = split_list()
  for t in string.gmatch(body, '%d+') do
    local s = split_rec(t)
    if s and s.cf and not (s.hd and s.td) then
      out[#out + 1] = 's' .. t
      out[#out + 1] = fmt(s.m) .. '/' .. fmt(s.n) .. '/' .. (s.hd and '1' or '0') .. '/'
        .. (s.td and '1' or '0') .. '/' .. fmt(s.tp)
    end
  end
  return out
end

-- A rewind restores one split of its cut (cut_splits' value; the round is the rewind's):
-- its unacked tail to the orphans from its recorded progress. Returns whether the head
-- was acked (the task stays out of the front: its tail alone is todo).
local function restore_split(task, v)
  local m, n, hd, td, tp = smatch(v, '^(%d+)/(%d+)/([01])/([01])/(%d+)$')
  if not m then return false end
  mincr(F.P_BACKUPS)
  split_rec(task, {m = tonum(m), n = tonum(n), hd = hd == '1', td = td == '1', tp = tonum(tp),
    cf = true})
  split_list(task)
  -- (a task dead at the cut keeps its pieces as they were: a retry brings them back)
  if td == '0' and not is_dead(task) then orphan(task) end
  return hd == '1'
end

return {tail_stands = tail_stands, attempt_s = attempt_s, is_dead = is_dead, split_rec =
  split_rec, split_list = split_list, split_orphans = split_orphans, waiting_tails =
  waiting_tails, offer_of = offer_of, offered = offered, orphan = orphan,
  left_to_claimant = left_to_claimant, whole_ok = whole_ok, whole_anyway = whole_anyway,
  split_dead = split_dead,
  retried = retried, cut_splits = cut_splits, restore_split = restore_split}
