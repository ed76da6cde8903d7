-- split.lua: tail splitting. At the tail of a pass (nothing left to lease or steal) an
-- idle trainer may take the unread end of a started task running long: from the holder's
-- recorded progress p and the task's size n (recorded by the holder with its progress,
-- field "n:<task>" of the leases hash; a task of unknown size is never split) a split
-- point m (p < m < n: halfway, m = p + ceil((n - p) / 2), or weighed by the holder's pace
-- against a typical task's, below) is chosen. The pieces are the pass attempt's record of
-- the task's work: the head [0, m) (the holder's lease, field <task>, its progress in the
-- progress hash) and the tail [m, n) (its own fenced lease in field "b:<task>", the backup
-- slot: a task is split or backed up, never both; its own progress and ack). The split
-- record, field "s:<task>" of the leases hash, is
--   "round|m|n|head_acked|tail_acked|tail_progress|confirmed"
-- under the attempt's round (attempt_s: kept through the job's completion, which a retry
-- reopens); nothing in the attempt drops it: a death keeps each piece as it is, a retry
-- brings back exactly the pieces not acked, a checkpoint cuts it and a rewind restores it
-- (a dead task's pieces dead), the audit reads it (integrity.split_check). The split is
-- pending until the head's holder shows it knows m (a progress report naming m as its
-- known end, or the head's lease ending without an ack), and its tail is leased to nobody
-- until then (a piece is leased to be read): a head's report past m while pending wins (m
-- moves up to it, up to n: nothing left for the tail, which is then acked by
-- construction); a head acked while pending read the whole task (the split is undone).
-- So no sample is read by both holders, whatever the holder read since its last report.
-- The done bit is set when both pieces are acked; a piece that ends without an ack goes
-- back: the head to the front (re-leased from the task's progress up to m), the tail to
-- the orphans (field "s:orph", re-leased from its progress up to n). A task is split at
-- most once per pass attempt. A task whose head is acked while its tail piece is leased
-- is still in flight: the tail stands for it in nleased (not counted in todo, and an idle
-- trainer's wait stays bounded), from the head's ack (or the orphan's lease) to the
-- tail's end. docs/design.md, "Tail splitting".
local rcall, tonum, smatch, sfind, ssub, mmin, tconcat, lipairs =
  redis.call, tonumber, string.match, string.find, string.sub, math.min, table.concat, ipairs
local fmt, mget, mincr, mnum = lib.meta.fmt, lib.meta.mget, lib.meta.mincr, lib.meta.mnum
local event, event_task, wake_one = lib.events.event, lib.events.event_task, lib.events.wake_one
local now_s, round_s = lib.call.now_s, lib.call.round_s
local dead_empty, end_lease, lease_is_current, member, next_token, other_lease, parse_lease =
  lib.leases.dead_empty, lib.leases.end_lease, lib.leases.lease_is_current, lib.leases.member,
  lib.leases.next_token, lib.leases.other_lease, lib.leases.parse_lease
local reads_of = lib.workers.reads_of

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

-- A worker's pace (samples per ms) as the last split of one of its tasks in this round
-- measured it (field "v:<worker>": "round|pace x 1e6"; workers.lua drops it with the
-- worker), or nil; with `pace`, records it.
local function pace_of(worker, pace)
  if pace then
    rcall('HSET', K_LEASES, 'v:' .. worker, round_s() .. '|' .. fmt(math.floor(pace * 1e6)))
    return pace
  end
  local r, v = smatch(rcall('HGET', K_LEASES, 'v:' .. worker) or '', '^([^|]*)|(%d+)$')
  if r ~= round_s() then return nil end
  return tonum(v) / 1e6
end

-- A trainer measured slow (under half a typical task's pace: n samples in the job's
-- median task time) leaves a waiting tail to the others for two heartbeat intervals (at
-- least a second) from when it was offered, while another worker is alive: it would read
-- it at the pace its own split was made for. After that it may take it (no pass waits
-- for a trainer that cannot come: a DDP peer blocked on this one). Returns when it may
-- (JNOW ms), or nil: now.
local function left_to_others(t, sp, worker)
  local v, med = pace_of(worker), mnum(F.DUR_MED) / 1000
  if not v or med <= 0 or 2 * v >= sp.n / med then return nil end
  local at = offer_of(t) + math.max(1000, 2 * mnum(F.HBI))
  if at <= CALL.JNOW or rcall('ZCOUNT', K_WORKERS, CALL.JNOW, '+inf') < 2 then return nil end
  return at
end

-- A trainer measured slow (under half a typical task's pace, as in left_to_others) makes
-- no new split while another worker is alive: it would read the piece at its own pace,
-- where the holder, or an idle trainer splitting later, reads it faster (a straggler that
-- split a queued task of 100 and took its tail of 33 held the pass 4 s past the others).
local function measured_slow(worker, n)
  local v, med = pace_of(worker), mnum(F.DUR_MED) / 1000
  return v ~= nil and med > 0 and 2 * v < n / med
    and rcall('ZCOUNT', K_WORKERS, CALL.JNOW, '+inf') >= 2
end

-- The split half of take_leases: an orphaned tail piece first (a confirmed one: a piece
-- is leased to be read), else a new split of the longest-running started task of another
-- trainer (at most 10 looked at), which is not granted: its tail waits among the orphans,
-- pending, until the head's holder confirms the point (progress.lua; or its lease ends
-- without an ack, or its ack undoes the split), and is then offered to whoever asks (a
-- waiter is woken). So no piece is granted that its taker cannot read at once, and none
-- is handed back and forth between idle trainers while its split is pending. Returns the
-- reply row with its start and end (elements 6 and 7; add_starts leaves them, element 8,
-- pending, is 0) or nil, and then when to come back (JNOW ms, or nil): a tail left to
-- others may be taken then, or a split just made may be confirmed by then.
-- (cn: the call number's digits)
local function take_split(worker, winc, cn)
  if mget(F.SPLIT) == '0' then return nil end
  -- a piece only to a loop that honours it, a split only by and of one that follows a
  -- moving end (workers.lua reads_of)
  local kind = reads_of(worker, winc)
  if kind == 'w' then return nil end
  local task, s, attempts, back = nil, nil, nil, nil
  if mnum(F.P_BACKUPS) > 0 then
    -- (bounded work: the first 10 entries are looked at, the rest kept as they are)
    local orph, rest = split_orphans()
    local keep = {}
    for _, t in lipairs(orph) do
      local sp = split_rec(t)
      local b = sp and parse_lease(rcall('HGET', K_LEASES, 'b:' .. t))
      -- (a dead task's piece is leased by nobody: a retry brings it back)
      local h = sp and not sp.td and not lease_is_current(b) and not is_dead(t)
        and (parse_lease(rcall('HGET', K_LEASES, t)) or {})
      -- (never both pieces to one worker: they share its owned entry; a pending piece to
      -- nobody: it stays with the head's holder until it is confirmed)
      local wait = h and sp.cf and not task
        and (left_to_claimant(t, worker) or left_to_others(t, sp, worker))
      if wait and (not back or wait < back) then back = wait end
      if h and sp.cf and not task and not wait and not (lease_is_current(h) and h.worker == worker) then
        task, s, attempts = t, sp, (b and b.attempts) or '1'
        event('piece_leased', 'task', t, 'worker', worker, 'from', fmt(sp.tp), 'to', fmt(sp.n))
      elseif h then
        keep[#keep + 1] = t  -- still to lease (a stale entry is dropped)
      end
    end
    if #keep < #orph then split_orphans(keep, rest) end
  end
  if not task then
    -- (a new split only by a caller that follows a moving end: the pending tail waits)
    for _, t in lipairs(kind == 's' and rcall('ZRANGE', K_STARTED, 0, 9) or {}) do
      local l = parse_lease(rcall('HGET', K_LEASES, t))
      if lease_is_current(l) and l.st == 'S' and l.worker ~= worker and not split_rec(t)
          and reads_of(l.worker, l.winc) == 's'
          and (mnum(F.P_BACKUPS) == 0 or split_list() < MAX_SPLITS)
          and not lease_is_current(parse_lease(rcall('HGET', K_LEASES, 'b:' .. t))) then
        local n = tonum(rcall('HGET', K_LEASES, 'n:' .. t) or '')
        local p = tonum(rcall('HGET', K_PROGRESS, t) or '0') or 0
        -- a holder whose liveness runs a heartbeat interval more at least (one that went
        -- silent could not learn its end: the tail would wait for its lease to expire)
        local dl = n and n - p >= 2 and not measured_slow(worker, n)
          and tonum(rcall('ZSCORE', K_WORKERS, l.worker .. '|' .. l.winc) or '')
        if dl and dl - CALL.JNOW >= mnum(F.HBI) then
          -- the split point: halfway, or by pace where it is known so that both pieces
          -- end about together: the holder's rate on its first attempt's lease (recorded:
          -- pace_of) against the caller's as a split of its own measured it, else a
          -- typical task's (n over the median task time); a slow holder keeps little, a
          -- slow caller takes little (of a task not begun too: its holder is taken to
          -- read at the typical pace)
          local m = p + math.ceil((n - p) / 2)
          local med, ran = mnum(F.DUR_MED) / 1000, CALL.NOW - (tonum(l.sinces) or CALL.NOW)
          if med > 0 and ran > 0 and l.attempts == '1' then
            local typical = n / med
            -- (a holder that has not begun its task: its pace as measured before, if any)
            local vh = p > 0 and pace_of(l.worker, p / ran) or pace_of(l.worker) or 0
            local vt = pace_of(worker) or typical
            if vh == 0 and vt < typical then vh = typical end
            m = math.max(p + 1, mmin(n - 1, p + math.ceil((n - p) * vh / (vh + vt))))
          end
          mincr(F.P_BACKUPS)  -- (before split_rec reads it back)
          split_rec(t, {m = m, n = n, hd = false, td = false, tp = m, cf = false})
          split_list(t)
          mincr(F.C_SPLITS)
          event('split', 'task', t, 'worker', worker, 'of', l.worker, 'at', fmt(m),
            'size', fmt(n), 'progress', fmt(p))
          -- (pending: among the orphans, leased once confirmed; the caller comes back
          -- within a heartbeat interval, by when the holder's report should confirm it)
          orphan(t, worker)
          local at = CALL.JNOW + mnum(F.HBI)
          if not back or at < back then back = at end
          break
        end
      end
    end
    return nil, back
  end
  mincr(F.P_BACKUPS)
  if s.hd then tail_stands(task, CALL.NOW) end  -- an orphan of an acked head: in flight
  local tok = next_token()
  rcall('HSET', K_LEASES, 'b:' .. task, 'L|' .. worker .. '|' .. winc .. '|' .. tok
    .. '|' .. round_s() .. '|S|' .. now_s() .. '|' .. cn .. '|' .. attempts
    .. '|' .. CALL.CALLER_DIG)
  rcall('ZADD', K_OWNED, '0', member(worker, winc, task))
  mincr(F.C_LEASED)
  mincr(F.P_LEASED)
  return {tonum(task), tok, tonum(attempts) or 1, false, 1, s.tp, s.n, 0}
end

-- A piece of a split task ended: acked (true when the task is now done: both pieces
-- acked, or not split; and true second when it was split) or not (survives, once the ending was charged and the task is not
-- dead: the piece goes back, the head to the front, the tail to the orphans).
local function split_ended(task, l, acked, worker, tok)
  local s = split_rec(task)
  if not s then return true end
  if acked then
    if not l.backup and not s.cf then
      -- the head was acked before it knew the split point: it read the whole task, so the
      -- pending tail (which read nothing) ends and the split is undone. Not a fault: its
      -- lease ends as 'U' (undone), not counted revoked, and its holder's release of it
      -- (often under way: it hands a pending piece back) is a quiet repeat, not stale
      local o = other_lease(task, l)
      if o then end_lease(task, o, 'U') end
      event('split_undone', 'task', task)
      s.m, s.tp, s.hd, s.td, s.cf = s.n, s.n, true, true, true
      split_rec(task, s)
      return true
    end
    if l.backup then s.td = true else s.hd = true end
    split_rec(task, s)
    if not l.backup and s.td and s.m >= s.n then
      -- the head read to the task's end (its point moved there): a tail piece still out
      -- holds nothing; it ends as undone, not revoked
      local o = other_lease(task, l)
      if o then
        end_lease(task, o, 'U')
        event('split_undone', 'task', task, 'worker', o.worker)
      end
    end
    if s.hd and s.td then
      if l.backup then tail_stands(task, nil) end  -- the tail stood for its task
      return true, true
    end
    -- a head acked with its tail out: the tail stands for the task in nleased and in the
    -- started index (from the tail's own start: the task timeout applies to it)
    local o = not l.backup and other_lease(task, l)
    if o then tail_stands(task, tonum(o.sinces)) end
    event_task('piece_acked', task, worker, tok)
    return false
  end
  if l.backup then
    if s.hd then tail_stands(task, nil) end  -- the tail stood for its task
    orphan(task)
  else
    -- the head's next holder starts from its recorded progress and is told the split
    -- point in its lease: the split stands (confirmed), its tail, pending among the
    -- orphans until now, is offered
    local was = s.cf
    s.cf = true
    split_rec(task, s)
    if not was and not s.td then offered(task) end
    CALL.FRONT_EMPTY = false
    rcall('ZADD', K_FRONT, mincr(F.FSEQ), task)
  end
  wake_one()
  event('piece_back', 'task', task, 'worker', l.worker, 'piece', l.backup and 'tail' or 'head')
  return true
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

return {split_rec = split_rec, take_split = take_split, split_ended = split_ended,
  tail_stands = tail_stands, split_dead = split_dead, retried = retried,
  cut_splits = cut_splits, restore_split = restore_split, waiting_tails = waiting_tails,
  offered = offered, whole_ok = whole_ok}
