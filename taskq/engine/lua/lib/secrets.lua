-- secrets.lua: the caller's lease secret (its digest, hashed once per call) and what a
-- write about a lease that is not the caller's current one is: a quiet repeat, stale,
-- or forged (someone who read the leases hash). docs/design.md, "Lease secrets".
local ssub, ltype = string.sub, type
local mincr = lib.meta.mincr
local arg_fail = lib.args.arg_fail
local event = lib.events.event

-- The caller's lease secret as the digest records keep: the first 16 hex digits (64
-- bits) of its SHA-1, or nil for a missing or short secret (matching no record). Hashed
-- once per call (use_secret); the secret itself is never written anywhere.
local function use_secret(secret)
  if ltype(secret) ~= 'string' or #secret < 16 then
    CALL.CALLER_DIG = nil
  else
    CALL.CALLER_DIG = ssub(redis.sha1hex(secret), 1, 16)
  end
  return CALL.CALLER_DIG
end
-- The secret argument, checked with the others (lib/args.lua) but never shown in the
-- answer; the caller's digest from then on. Returns the digest (or a stand-in when bad).
local function arg_secret(v)
  if not use_secret(v) then
    arg_fail('secret', 'missing or shorter than 16 characters (a taskq client older '
      .. 'than this library? upgrade it)')
    return ''
  end
  return CALL.CALLER_DIG
end

-- A write naming a lease's holder and token with the wrong secret: someone who read the
-- leases hash. Answered stale by the caller, counted apart so an operator notices.
-- (task nil: a lease request in a worker's name, whose record has the digest.)
local function forged(task, worker, tok, op)
  mincr(F.C_FORGED)
  if task then
    event('forged', 'task', task, 'worker', worker, 'token', tok, 'op', op)
  else
    event('forged', 'worker', worker, 'op', op)
  end
end

-- A write naming the lease's own holder (worker, incarnation) and token with another
-- secret: someone who read the record (the holder itself never does: its incarnation and
-- secret change together, so after a re-register its late writes name another
-- incarnation and are merely stale).
local function is_forged(l, worker, winc, tok)
  return l and l.token == tok and l.worker == worker and l.winc == winc
    and not (CALL.CALLER_DIG and l.dig == CALL.CALLER_DIG)
end

-- A write about a lease that is not current: a quiet success when its holder (the secret
-- matches) repeats the ending this very lease got (tokens are unique), or releases a
-- pending piece whose split was undone (lib/split.lua: it ended as 'U'); forged (above);
-- else stale. Forged and stale change nothing, are counted.
local function repeat_or_stale(task, l, kind, worker, winc, tok, op)
  if is_forged(l, worker, winc, tok) then
    forged(task, worker, tok, op)
    return C.STALE
  end
  if l and not l.live and (l.kind == kind or (l.kind == 'U' and kind == 'R'))
      and l.worker == worker and l.winc == winc and l.token == tok then
    return C.DUP
  end
  mincr(F.C_STALE)
  mincr(F.P_STALE)
  event('stale', 'task', task, 'worker', worker, 'token', tok, 'op', op)
  return C.STALE
end

return {arg_secret = arg_secret, forged = forged, is_forged = is_forged,
  repeat_or_stale = repeat_or_stale}
