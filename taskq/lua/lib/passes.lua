-- passes.lua: pass ends and starts, the per-pass summaries, the waiting states.

local function save_summary(kind)
  local p = mget(F.PASS)
  local field = p
  if kind == 'reset' then field = p .. '/r' .. fmt(mnum(F.P_RESETS)) end
  local summary = {
    pass = tonum(p), round = ROUND, state = kind,
    started_ms = mnum(F.PSTART), ended_ms = NOW,
    done = mnum(F.NDONE), dead = rcall('SCARD', K_DEAD),
    skipped = mnum(F.P_SKIPPED), stale = mnum(F.P_STALE), resets = mnum(F.P_RESETS),
    max_lateness_ms = mnum(F.P_MAXLATE), leased = mnum(F.P_LEASED),
    expired = mnum(F.P_EXPIRED),
    resumed = mnum(F.P_RESUMED), resumed_samples = mnum(F.P_RESUMED_S),
    reread_samples = mnum(F.P_REREAD),
  }
  rcall('HSET', K_PASSES, field, cjson.encode(summary))
  rcall('HDEL', K_PASSES, tostring(tonum(p) - 1000))
  -- resets of one pass are kept 1,000 deep too (a reset loop must not grow the hash)
  if kind == 'reset' then
    rcall('HDEL', K_PASSES, p .. '/r' .. fmt(mnum(F.P_RESETS) - 1000))
  end
end

-- Starts pass p (a new round): O(1), the big keys go with UNLINK.
local function start_pass(p, kind)
  ROUND = mincr(F.ROUND)
  rcall('UNLINK', K_DONE, K_FRONT, K_OWNED, K_DEADLINES, K_RESERVED, K_STARTED,
    K_PROGRESS)
  mset(F.P_RESUMED, 0, F.P_RESUMED_S, 0, F.P_REREAD, 0)
  mset(F.PASS, p, F.CURSOR, 0, F.NDONE, 0, F.NLEASED, 0,
    F.NRESERVED, 0, F.P_STALE, 0, F.P_SKIPPED, 0, F.P_MAXLATE, 0, F.P_LEASED, 0,
    F.P_EXPIRED, 0, F.P_BACKUPS, 0, F.PSTART, fmt(NOW), F.STATE, 'running', F.REASON, '')
  -- a checkpoint's freeze of the old round is over (its next step answers PASS_MISMATCH):
  -- the hooks that note what leaves the leased set and the front stop here
  mset(F.CK_FREEZE, '')
  if kind ~= 'pass_reset' then mset(F.P_RESETS, 0) end
  STATE = 'running'
  event(kind, 'round', ROUND)
  broadcast()
end

local function set_waiting(reason)
  if STATE == 'waiting' and mget(F.REASON) == reason then return end
  mset(F.STATE, 'waiting', F.REASON, reason)
  STATE = 'waiting'
  event('job_waiting', 'reason', reason)
  broadcast()
end

-- Ends the current pass (kind: completed | skipped) and moves on as configured.
local function finish_pass(kind)
  save_summary(kind)
  mset(F.LAST_PASS_MS, fmt(NOW - mnum(F.PSTART)))
  event('pass_' .. kind, 'done', mget(F.NDONE))
  local p = mnum(F.PASS)
  local passes = mnum(F.PASSES)
  if passes >= 0 and p + 1 >= passes then
    ROUND = mincr(F.ROUND)  -- nothing written under the last round is current any more
    mset(F.STATE, 'completed', F.REASON, '', F.NLEASED, 0, F.NRESERVED, 0, F.CK_FREEZE, '')
    rcall('UNLINK', K_FRONT, K_OWNED, K_DEADLINES, K_RESERVED, K_STARTED, K_PROGRESS)
    STATE = 'completed'
    event('job_completed')
    broadcast()
  elseif mget(F.ADVANCE) == '0' then
    set_waiting('manual_advance')
  else
    start_pass(p + 1, 'pass_started')
  end
end

-- A pass is complete when todo and leased are both empty.
local function check_pass_end()
  if STATE ~= 'running' then return end
  if mnum(F.NLEASED) > 0 then return end
  local live = mnum(F.N)
  if not dead_empty() then live = live - rcall('SCARD', K_DEAD) end
  if mnum(F.NDONE) < live then return end
  if live == 0 then
    set_waiting('all_dead')
    return
  end
  finish_pass('completed')
end
