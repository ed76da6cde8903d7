-- split.lua: tail splitting. At the tail of a pass (nothing left to lease or steal) an
-- idle trainer may take the unread end of a started task running long: from the holder's
-- recorded progress p and the task's size n (recorded by the holder with its progress,
-- field "n:<task>" of the leases hash; a task of unknown size is never split) a split
-- point m (p < m < n: halfway, m = p + ceil((n - p) / 2), or weighed by the holder's pace
-- against a typical task's, below; m = 0, the task handed over whole, for a slow holder
-- that has not begun it) is chosen. The pieces are the pass attempt's record of
-- the task's work: the head [0, m) and the tail [m, n), each its own fenced lease, kept
-- in the split record by lib/pieces.lua (which a death, a retry, a checkpoint, a rewind
-- and the audit read and write). The split is
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
local rcall, tonum, smatch, mmin, lipairs = redis.call, tonumber, string.match, math.min, ipairs
local fmt, mget, mincr, mnum = lib.meta.fmt, lib.meta.mget, lib.meta.mincr, lib.meta.mnum
local event, event_task, wake_one = lib.events.event, lib.events.event_task, lib.events.wake_one
local now_s, round_s = lib.call.now_s, lib.call.round_s
local dead_empty, end_lease, lease_is_current, lease_rec, member, next_token, other_lease,
  parse_lease =
  lib.leases.dead_empty, lib.leases.end_lease, lib.leases.lease_is_current, lib.leases.lease_rec,
  lib.leases.member, lib.leases.next_token, lib.leases.other_lease, lib.leases.parse_lease
local reads_of = lib.workers.reads_of

local tail_stands, is_dead, split_rec, split_list, split_orphans, offer_of, offered, orphan, left_to_claimant =
  lib.pieces.tail_stands, lib.pieces.is_dead, lib.pieces.split_rec, lib.pieces.split_list,
  lib.pieces.split_orphans, lib.pieces.offer_of, lib.pieces.offered, lib.pieces.orphan,
  lib.pieces.left_to_claimant
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
            -- a holder that has not begun the task (read-ahead behind what it reads now,
            -- which it finishes first), read at under half the caller's pace or its pace
            -- not known (vh 0), hands it over whole: the point at 0, the head empty (a
            -- holder that began it after all moves the point to what it read: progress.lua)
            if p == 0 and vh > 0 and 2 * vh < vt then m = 0 end
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
  rcall('HSET', K_LEASES, 'b:' .. task,
    lease_rec(worker, winc, tok, round_s(), 'S', now_s(), cn, attempts, CALL.CALLER_DIG))
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

return {take_split = take_split, split_ended = split_ended}
