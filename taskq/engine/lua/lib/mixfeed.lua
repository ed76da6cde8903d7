-- mixfeed.lua: a mixed job's stream sources (docs/mixing.md, "A stream source starves"):
-- the store each one's feed left ('mixstore', written by append.lua) logged where the charge
-- reads it ('mixfeed'), each source's store at a pass's start, and the charge of a page
-- with stream sources (lib/mix.lua charge_page hands it the state; taskq/mix.py plan_pass
-- is the reference). What the charge leaves for the readers (taskq/admin/mix.py): the
-- slots it repaid ('mixrepaid', scored by slot: only after a deferral) and the slot it
-- waits at (the 'mix' hash's 'wait': "<slot>|<source>", the source whose pick could not
-- owe more).
local rcall, tonum, smatch, sformat, tconcat, lipairs, unpack =
  redis.call, tonumber, string.match, string.format, table.concat, ipairs, unpack
local fmt, mnum, mput = lib.meta.fmt, lib.meta.mnum, lib.meta.mput
local pack_state, owed_first, defers, token_choice = lib.mixrule.pack_state,
  lib.mixrule.owed_first, lib.mixrule.defers, lib.mixrule.token_choice
local mark_dead, numbers, set_seq = lib.mixdead.mark_dead, lib.mixrule.numbers, lib.mixseq.set

local PAGE = 256  -- constant: positions charged at once (lib/mix.lua PAGE)
local STRIDE = 4294967296  -- constant: copy id = source (0-based) * STRIDE + its task

-- The feed log's entries and the repaid slots from `slot` on go, and the wait: the slots
-- from there are charged again (a weight change's cut, a pass made again), which logs and
-- records them afresh.
local function forget_from(slot)
  rcall('ZREMRANGEBYSCORE', kc('mixfeed'), fmt(slot), '+inf')
  rcall('ZREMRANGEBYSCORE', kc('mixrepaid'), fmt(slot), '+inf')
  rcall('HDEL', kc('mix'), 'wait')
end

-- The repaid slots below `slot` go (a pass starts: below the kept passes' first slot no
-- sequence is kept to read them with). The feed log stays whole: a pass's store at its
-- start is its last entries below it (feed_view).
local function forget_below(slot)
  rcall('ZREMRANGEBYSCORE', kc('mixrepaid'), '-inf', '(' .. fmt(slot))
end

-- Stream sources: each one's store as the feed log says at slot `start` (tasks, sealed
-- 1/0): `view` (the state of the pass before: no entry lies between its charge and
-- `start`) or the log's last entry of each below `start` (a pass entered otherwise); the
-- log's entries from `start` on go (a pass made again: its charge logs the store afresh).
local function feed_view(sp, st, start, view)
  local av, fl = {}, {}
  for i, n in lipairs(sp.n) do av[i], fl[i] = n, sp.streams[i] and 0 or 1 end
  if view then
    for i = 1, #av do av[i], fl[i] = view.av[i], view.fl[i] % 2 end
  else
    local left = 0
    for i = 1, #av do if fl[i] == 0 then left = left + 1 end end
    local seen, at = {}, 0
    while left > 0 do
      local got = rcall('ZREVRANGEBYSCORE', kc('mixfeed'), '(' .. fmt(start), '-inf', 'LIMIT', at,
        64)
      for _, e in lipairs(got) do
        local src, tasks, sealed = smatch(e, '^[^|]*|[^|]*|(%d+)|(%d+)|(%d)$')
        local i = tonum(src) + 1
        if not seen[i] then
          seen[i], left, av[i], fl[i] = true, left - 1, tonum(tasks), tonum(sealed)
        end
      end
      if #got < 64 then break end
      at = at + 64
    end
  end
  forget_from(start)
  st.fs, st.m, st.debt, st.av, st.fl = true, 0, {}, av, fl
  for i = 1, #av do st.debt[i] = 0 end
end

-- Stream sources: each one's store as its feed left it ('mixstore', append.lua) logged at
-- `slot` where it differs from the state's view (the feed log, 'mixfeed': one entry a
-- source a charging call at most, and only after an append or a seal).
local function log_feed(sp, st, slot)
  local ss = sp.streams
  for i = 1, #ss do
    if ss[i] then
      local got = rcall('ZMSCORE', kc('mixstore'), fmt(i - 1), fmt(i - 1) .. ':s')
      local tasks, sealed = tonum(got[1] or sp.n[i]), got[2] and 1 or 0
      if tasks ~= st.av[i] or sealed ~= st.fl[i] % 2 then
        local seq = rcall('HINCRBY', kc('mix'), 'fseq', 1)
        rcall('ZADD', kc('mixfeed'), fmt(slot), sformat('%s|%012d|%d|%d|%d', fmt(slot), seq, i - 1,
          tasks, sealed))
        st.av[i], st.fl[i] = tasks, st.fl[i] - st.fl[i] % 2 + sealed
      end
    end
  end
end

-- The charge with stream sources (docs/mixing.md, "A stream source starves"; taskq/mix.py
-- plan_pass is the reference): at each slot the feed log's entries up to it, the sources
-- run out (sealed and all taken: its debt dropped, a new segment; every one: the pass
-- ends, and under stop one of positive weight), a weight change; then the lowest-index
-- source that owes and has a task is repaid (owed_first), else the rule's tokens
-- (token_choice) go on until one picks a source with a task, each starving pick owing the
-- slot while it owes fewer than max_debt (defers). A pick that may not owe: the slot
-- waits, committing nothing (the next charge takes it from the state before it): the
-- 'mix' hash's 'wait' says where and on which source until a charge charges it. A repaid
-- slot is recorded ('mixrepaid'). `upto`: the state walked on to position `upto` by the
-- rule and the log (mix_set), nothing written but the meta's high-waters.
local function charge_stream(sp, st, upto, cx)
  local base = st.p * mnum(F.N)
  local k, t, c, debt, av, fl = #st.n, st.t, st.c, st.debt, st.av, st.fl
  local h0 = st.h
  local last = upto or h0 + PAGE
  if not upto then
    st.s0 = pack_state(st)
    log_feed(sp, st, base + h0)
  end
  st.raw = nil
  local feed = rcall('ZRANGEBYSCORE', kc('mixfeed'), fmt(base + h0), '(' .. fmt(base + last))
  local rule, max_debt = sp.on_exhausted, sp.max_debt or 0
  local sealed, ran, out, fi, h, ended, waits = {}, {}, {}, 1, h0, false, nil
  for i = 1, k do sealed[i], ran[i] = fl[i] % 2 == 1, fl[i] >= 2 end
  while h < last do
    local slot = base + h
    while fi <= #feed do
      local at, src, tasks, sl = smatch(feed[fi], '^(%d+)|%d+|(%d+)|(%d+)|(%d)$')
      if tonum(at) > slot then break end
      av[tonum(src) + 1], sealed[tonum(src) + 1] = tonum(tasks), sl == '1'
      fi = fi + 1
    end
    -- (a slot that waits commits nothing: the state goes back to here, run-outs and a
    -- weight change at it made again by the next charge, as the reference makes them; only
    -- a slot with a source starving may wait)
    local was = nil
    for i = 1, k do
      if not was and not sealed[i] and t[i] >= av[i] then
        was = {ran = {unpack(ran)}, debt = {unpack(debt)}, c = {unpack(c)}, m = st.m, w = st.w,
          nx = st.nx, rs = st.rs, seg = st.seg}
      end
    end
    local stops, all = false, true
    for i = 1, k do
      if not ran[i] and sealed[i] and t[i] >= av[i] then
        ran[i], debt[i], st.rs = true, 0, 1  -- (its debt: nothing left to repay it with)
        if rule == 'stop' and st.w[i] > 0 then stops = true end
      end
      if not ran[i] then all = false end
    end
    if stops or all then ended = true; break end
    if st.nx >= 0 and slot >= st.nx then
      st.w = numbers(cx.weights_at(slot))
      st.nx = cx.next_change(slot)
      st.rs = 1
    end
    if st.rs == 1 then
      st.seg, st.rs, st.m = h, 0, 0
      for i = 1, k do c[i] = 0 end
    end
    local best = owed_first(t, av, debt)
    if best then
      debt[best] = debt[best] - 1  -- (repaid: its token was counted when it was deferred)
      if not upto then rcall('ZADD', kc('mixrepaid'), fmt(slot), fmt(slot)) end
    else
      while true do
        best = token_choice(st.w, ran, c, st.m)
        if t[best] < av[best] then break end
        if not defers(debt[best], max_debt) then waits, best = best, nil; break end
        debt[best], c[best], st.m = debt[best] + 1, c[best] + 1, st.m + 1
      end
      if not best then  -- the slot waits
        for i = 1, k do ran[i], debt[i], c[i] = was.ran[i], was.debt[i], was.c[i] end
        st.m, st.w, st.nx, st.rs, st.seg = was.m, was.w, was.nx, was.rs, was.seg
        break
      end
      c[best], st.m = c[best] + 1, st.m + 1
    end
    out[#out + 1] = sformat('%010x', (best - 1) * STRIDE + t[best])
    t[best] = t[best] + 1
    h = h + 1
  end
  for i = 1, k do fl[i] = (sealed[i] and 1 or 0) + (ran[i] and 2 or 0) end
  st.h = h
  mput(F.MIXH, base + h)
  if ended then st.rs = 2; mput(F.MIXE, base + h) end
  if upto then return end
  if #out > 0 then
    set_seq(st.p, h0, tconcat(out))
    mark_dead(h0, out)
  end
  if waits then
    rcall('HSET', kc('mix'), 'wait', sformat('%s|%d', fmt(base + h), waits - 1))
  elseif h > h0 or ended then
    rcall('HDEL', kc('mix'), 'wait')
  end
end

return {feed_view = feed_view, charge_stream = charge_stream, forget_from = forget_from,
  forget_below = forget_below}
