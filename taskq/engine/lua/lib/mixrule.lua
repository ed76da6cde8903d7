-- mixrule.lua: a mixed job's deadline rule (docs/mixing.md, "Slots and the schedule"), the
-- choice of a slot's source for lib/mix.lua's charge (a scan of a few sources, a heap of
-- many: O(log k)), and the rule when the
-- weights count samples; what a source's run-out means (cycle, stop) and a stream
-- source's debt ("A source runs out"), pure functions; the schedule's state's packed form
-- (taskq/mix.py `plan_pass` is the reference: a scan of every source, the same
-- comparisons).
local lipairs, mceil, tremove, rcall, srep, sformat, unpack = ipairs, math.ceil, table.remove,
  redis.call, string.rep, string.format, unpack
local spack, sunpack = struct.pack, struct.unpack

-- A segment's weights (the logged ones `wn` over the sources not run out, t[i] < n[i], or
-- over every source when `every`: on_exhausted=cycle, where none runs out; when only
-- sources of weight 0 are left, equal shares of them), the sources with a share in order,
-- and the rule's d.
local function segment(t, n, wn, every)
  local k = #n
  local w, act, sum, left = {}, {}, 0, 0
  for i = 1, k do
    if every or t[i] < n[i] then
      left = left + 1
      if wn[i] > 0 then sum = sum + wn[i] end
    end
  end
  for i = 1, k do
    w[i] = 0
    if every or t[i] < n[i] then
      local wi = wn[i]
      if sum > 0 then
        if wi > 0 then w[i] = wi / sum; act[#act + 1] = i end
      else
        w[i] = 1 / left; act[#act + 1] = i
      end
    end
  end
  local d = 0
  if #act >= 2 then d = 1 - 1 / (2 * #act - 2) end
  return act, w, d
end

-- The deadline rule's choice among a segment's sources in O(log k) a slot: a source is
-- *due* at segment position m when c + 1 - d <= w * m (the comparison the linear rule
-- makes, so the same floats decide); the rule takes the due source of the smallest
-- deadline (c + d) / w, the lowest index on a tie, else (none due) the smallest deadline
-- of all. The due ones are a binary heap on (deadline, index); the others wait in
-- buckets by the first m at which they are due (an integer: w * m grows with m).
local function before(dl, a, b)
  local x, y = dl[a], dl[b]
  return x < y or (x == y and a < b)
end

local function heap_push(hp, dl, i)
  local j = #hp + 1
  hp[j] = i
  while j > 1 do
    local up = (j - j % 2) / 2
    if not before(dl, hp[j], hp[up]) then break end
    hp[j], hp[up] = hp[up], hp[j]
    j = up
  end
end

local function heap_pop(hp, dl)
  local top, n = hp[1], #hp
  hp[1] = hp[n]
  hp[n] = nil  -- (after: with n = 1 the two are one slot)
  n = n - 1
  local j = 1
  while true do
    local l = 2 * j
    if l > n then break end
    if l < n and before(dl, hp[l + 1], hp[l]) then l = l + 1 end
    if not before(dl, hp[l], hp[j]) then break end
    hp[j], hp[l] = hp[l], hp[j]
    j = l
  end
  return top
end

-- The first segment position m >= 1 at which a source with c tasks in the segment is due.
local function due_at(c, w, d)
  local lhs = c + 1 - d
  local m = mceil(lhs / w)
  if m >= 4503599627370496 then return m end  -- (a share so small it is never due)
  if m < 1 then m = 1 end
  while m > 1 and lhs <= w * (m - 1) do m = m - 1 end
  while lhs > w * m do m = m + 1 end
  return m
end

-- Source `i`, first due at position `at`, into the structure: the heap when it is due by
-- position `now`, else the bucket of `at`.
local function place(ch, i, at, now)
  if at <= now then
    heap_push(ch.hp, ch.dl, i)
  else
    ch.at[i] = at
    local b = ch.wait[at]
    if b then b[#b + 1] = i else ch.wait[at] = {i} end
  end
end

-- Up to this many sources a segment's choice is a scan of them, O(k) a slot and no table
-- made (the comparisons above, in index order): below about 24-32 sources it costs less
-- than the heap's pushes and pops (bench/mix.py: 3 sources, batches(16), 176 -> 169 k
-- instructions a task; docs/mixing.md "Costs").
local SCAN_MAX = 24  -- constant

-- The choice's structure for the segment's sources `act` from segment position m on (a
-- scan's: the segment's counts `c`, shares `w` and d, read as the charge moves them).
local function choice(act, c, w, d, m)
  if #act <= SCAN_MAX then return {scan = true, c = c, w = w, d = d} end
  local ch = {hp = {}, dl = {}, at = {}, wait = {}}
  for _, i in lipairs(act) do
    ch.dl[i] = (c[i] + d) / w[i]
    place(ch, i, due_at(c[i], w[i], d), m)
  end
  return ch
end

-- The source the rule takes at segment position m (taken out of the structure).
local function choose(ch, act, m)
  if ch.scan then
    local c, w, d = ch.c, ch.w, ch.d
    local best, anyone, best_dl, any_dl = nil, nil, 0, 0
    for j = 1, #act do
      local i = act[j]
      local wi, ci = w[i], c[i]
      local dl = (ci + d) / wi
      if ci + 1 - d <= wi * m and (not best or dl < best_dl) then best, best_dl = i, dl end
      if not anyone or dl < any_dl then anyone, any_dl = i, dl end
    end
    return best or anyone
  end
  local b = ch.wait[m]
  if b then
    for _, i in lipairs(b) do ch.at[i] = nil; heap_push(ch.hp, ch.dl, i) end
    ch.wait[m] = nil
  end
  if #ch.hp > 0 then return heap_pop(ch.hp, ch.dl) end
  local best = nil  -- none due: the smallest deadline of all (all wait)
  for _, i in lipairs(act) do
    if not best or before(ch.dl, i, best) then best = i end
  end
  local wb = ch.wait[ch.at[best]]
  for j = 1, #wb do
    if wb[j] == best then tremove(wb, j); break end
  end
  ch.at[best] = nil
  return best
end

-- Source `i`, charged at segment position m (c tasks in the segment now), back into the
-- structure.
local function settle(ch, i, c, w, d, m)
  if ch.scan then return end
  ch.dl[i] = (c + d) / w
  place(ch, i, due_at(c, w, d), m + 1)
end

-- on_exhausted=cycle: a source's j-th slot over the job's life (j from 0) takes its task
-- j mod n of its source pass j div n.
local function cycle_task(j, n)
  local task = j % n
  return task, (j - task) / n
end

-- cycle: each source's slots over the job's life after state `st`'s pass, but for the
-- positions `ahead` names (its stored copy ids, `width` hex digits each: those charged
-- ahead of the leases and never handed out, the pass left early; the life counts what
-- was handed out, so a later pass takes the tasks those would have).
local function life_after(st, ahead, width)
  local life = {}
  for i = 1, #st.n do life[i] = st.l[i] + st.t[i] end
  for at = 1, #ahead, width do
    local i = tonumber(string.sub(ahead, at, at + 1), 16) + 1
    life[i] = life[i] - 1
  end
  return life
end

-- What a source's taking the last task it has means for the pass (taskq/mix.py plan_pass):
-- 'segment' (a new segment from the next slot: drop, and stop for a source of weight 0),
-- 'stop' (the pass ends after this slot: stop, the source's logged weight `wi` > 0), nil
-- (cycle: its next source pass goes on, the segment too).
local function on_last(rule, wi)
  if rule == 'cycle' then return nil end
  if rule == 'stop' and wi > 0 then return 'stop' end
  return 'segment'
end

-- With stream sources: the rule's pick for the segment's next token (`m` tokens so far)
-- among the sources not run out (`ran`), the logged weights `wn` renormalised over them
-- (equal shares when all left weigh 0); a scan, O(k) a token, with the same operations in
-- the same order as taskq/mix.py `_rule_choice`, so the same floats decide.
local function token_choice(wn, ran, c, m)
  local k, total, left = #wn, 0, 0
  for i = 1, k do
    if not ran[i] then
      left = left + 1
      if wn[i] > 0 then total = total + wn[i] end
    end
  end
  local w, positive = {}, 0
  for i = 1, k do
    w[i] = 0
    if not ran[i] then
      if total > 0 then
        if wn[i] > 0 then w[i] = wn[i] / total; positive = positive + 1 end
      else
        w[i] = 1 / left; positive = positive + 1
      end
    end
  end
  local d = 0
  if positive >= 2 then d = 1 - 1 / (2 * positive - 2) end
  local at = m + 1
  local best, anyone, best_dl, any_dl = nil, nil, 0, 0
  for i = 1, k do
    if w[i] > 0 then
      local dl = (c[i] + d) / w[i]
      if c[i] + 1 - d <= w[i] * at and (not best or dl < best_dl) then best, best_dl = i, dl end
      if not anyone or dl < any_dl then anyone, any_dl = i, dl end
    end
  end
  return best or anyone
end

-- Stream sources: the source a slot repays before the rule is asked, the lowest index that
-- owes (debt[i] > 0) and has a task (t[i] < avail[i]); nil: none.
local function owed_first(t, avail, debt)
  for i = 1, #debt do
    if debt[i] > 0 and t[i] < avail[i] then return i end
  end
  return nil
end

-- The rule's pick, a stream source with nothing in its store: true when it may owe the slot
-- (a deferral: its debt + 1, the pick counted as its slot, the rule asked again), false when
-- it owes `max_debt` already (the slot waits for its store; max_debt 0: on_starved=wait).
local function defers(debt_i, max_debt)
  return debt_i < max_debt
end

-- When the weights count samples: a reader of the copies' sizes kept in hash `key` (a
-- mixed job's 'mixsz': field "<source>:<block>", '>I4' each for the source's tasks 256 *
-- block ..), by copy id (source * stride + task); a block of 256 read at once (the blocks
-- a page touches: two a source at most). (The charge asks once a source's next task:
-- lib/mix.lua keeps each source's next size until the source moves on.)
local function sizes_reader(key, stride)
  local blocks = {}  -- (by the block's first copy id: a number, no string made per read)
  return function(id)
    local at = id % 256
    local first = id - at
    local blk = blocks[first]
    if not blk then
      local j = first % stride
      blk = rcall('HGET', key, sformat('%d:%d', (first - j) / stride, j / 256)) or ''
      blocks[first] = blk
    end
    return (sunpack('>I4', blk, at * 4 + 1))
  end
end

-- The slot's source when the weights count samples (taskq/mix.py `_choose_by_samples`, the
-- same comparisons so the same floats decide): among the sources not ahead (c_i <= w_i *
-- M, c_i its samples in the segment, M all of them), the one whose next task (task id
-- o_i + t_i) ends first, (c_i + s_i) / w_i, the lowest index on a tie; none not ahead: the
-- earliest end of all. A scan: O(k) a slot. `s`: each source's next task's size as read
-- so far (nil: not yet: read here and kept; the caller forgets a source's when it moves).
local function choose_by_samples(w, c, t, o, size_of, m_samples, s)
  local best, anyone, best_f, any_f = nil, nil, 0, 0
  for i = 1, #w do
    local wi = w[i]
    if wi > 0 then
      local si = s[i]
      if not si then si = size_of(o[i] + t[i]); s[i] = si end
      local f = (c[i] + si) / wi
      if c[i] <= wi * m_samples and (not best or f < best_f) then best, best_f = i, f end
      if not anyone or f < any_f then anyone, any_f = i, f end
    end
  end
  return best or anyone
end

-- "a,b,..." as a list of numbers (logged weights, the kept passes).
local function numbers(list)
  local out = {}
  for v in string.gmatch(list, '[^,]+') do out[#out + 1] = tonumber(v) end
  return out
end

-- The schedule's state (lib/mix.lua) packed: '>ddddd' its scalars (the pass, positions
-- charged, the segment's first position, the next logged change's slot or -1, rs: 1 the
-- next charge starts a segment, 2 the pass's charge ended), then per source '>I4'
-- its tasks, the tasks it gave in the pass, in the segment ('>d' when `sm`: the weights
-- count samples), '>d' its weight, and '>I4' its slots over the job's life before the
-- pass (on_exhausted=cycle: its next task is cycle_task(l + t, n); 0 under the others).
-- With stream sources (`fs`), the feed's part follows: '>d' the segment's tokens (its
-- positions and its deferrals), then per source '>I4' its debt, its store as the feed log
-- says (tasks), its flags (1: sealed, 2: run out in the pass).
local function state_format(k, sm, fs)
  local tail = fs and 'd' .. srep('I4', 3 * k) or ''
  if sm then return '>ddddd' .. srep('I4', 2 * k) .. srep('d', 2 * k) .. srep('I4', k) .. tail end
  return '>ddddd' .. srep('I4', 3 * k) .. srep('d', k) .. srep('I4', k) .. tail
end

-- A state from its packed form (`kp`: the passes kept): p, h, seg, nx, rs; n, t, c, w, l
-- (each source's tasks, tasks given in the pass, in the segment, weight, life before the
-- pass), o (first task ids), sm; `raw` the packed form while the state is unchanged.
local function unpack_state(blob, kp, sm, fs)
  local k = (#blob - 40 - (fs and 8 or 0)) / ((sm and 28 or 24) + (fs and 12 or 0))
  local v = {sunpack(state_format(k, sm, fs), blob)}
  local st = {p = v[1], h = v[2], seg = v[3], nx = v[4], rs = v[5], kp = kp, raw = blob,
    n = {}, t = {}, c = {}, w = {}, l = {}, o = {}, sm = sm}
  local n, t, c, w, l, o, at = st.n, st.t, st.c, st.w, st.l, st.o, 0
  for i = 1, k do
    n[i], t[i], c[i], w[i] = v[5 + i], v[5 + k + i], v[5 + 2 * k + i], v[5 + 3 * k + i]
    l[i] = v[5 + 4 * k + i]
    o[i], at = at, at + n[i]
  end
  if fs then
    local f = 5 + 5 * k + 1
    st.fs, st.m, st.debt, st.av, st.fl = true, v[f], {}, {}, {}
    for i = 1, k do
      st.debt[i], st.av[i], st.fl[i] = v[f + i], v[f + k + i], v[f + 2 * k + i]
    end
  end
  return st
end

local function pack_state(st)
  if st.raw then return st.raw end
  local n, t, c, w, l, k = st.n, st.t, st.c, st.w, st.l, #st.n
  local v = {st.p, st.h, st.seg, st.nx, st.rs}
  for i = 1, k do
    v[5 + i], v[5 + k + i], v[5 + 2 * k + i], v[5 + 3 * k + i] = n[i], t[i], c[i], w[i]
    v[5 + 4 * k + i] = l[i]
  end
  if st.fs then
    local f = 5 + 5 * k + 1
    v[f] = st.m
    for i = 1, k do
      v[f + i], v[f + k + i], v[f + 2 * k + i] = st.debt[i], st.av[i], st.fl[i]
    end
  end
  st.raw = spack(state_format(k, st.sm, st.fs), unpack(v))
  return st.raw
end

return {segment = segment, choice = choice, choose = choose, settle = settle,
  unpack_state = unpack_state, pack_state = pack_state,
  choose_by_samples = choose_by_samples, sizes_reader = sizes_reader,
  cycle_task = cycle_task, life_after = life_after, on_last = on_last, owed_first = owed_first,
  defers = defers, token_choice = token_choice, numbers = numbers}
